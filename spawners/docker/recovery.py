"""A restarted hub finds its containers again; containers nobody holds are removed.

:class:`RecoveryMixin` (mixed into the Docker spawner) claims a running container's allocation
from its labels and removes containers that died by themselves; :func:`reap_containers` runs
after each orphan sweep of the pool.
"""

from __future__ import annotations

import asyncio
import time

import docker

from gpulab.catalog import NO_GPU, card_type
from gpulab.spawners.docker.labels import (
    L_ALLOC,
    L_CREATED,
    L_GPU_TYPE,
    L_GPUS,
    L_HUB,
    L_IMAGE,
    L_PRICING,
)
from gpulab.spawners.node.allocator import Allocation
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.options import OptionsError


class RecoveryMixin:
    """Claiming and removing containers from what their labels say."""

    async def _remove_dead(self) -> None:
        """A container that died by itself: log why, then remove it (the hub won't call stop())."""
        obj = await self.get_object()
        if obj is None:
            return
        state = obj["State"]
        if state.get("Running") or state.get("StartedAt", "").startswith("0001-"):
            # Never started (Docker refused it): kept for inspection; the reaper removes it.
            return
        raw = await self.docker("logs", self.object_id, tail=self.log_tail_lines)
        self.log.warning(
            "Container %s of %s exited with code %s%s; last log lines:\n%s",
            self.container_name,
            self.owner,
            state.get("ExitCode"),
            " (out of memory)" if state.get("OOMKilled") else "",
            raw.decode(errors="replace").rstrip("\n"),
        )
        await self.remove_object()
        self.object_id = ""

    async def _claim_from_container(self) -> None:
        obj = await self.get_object()
        self._claim_from_labels((obj or {}).get("Config", {}).get("Labels") or {})

    def _claim_from_labels(self, labels: dict[str, str]) -> None:
        """Claim the allocation a running container's (or service's) labels describe."""
        alloc_id = labels.get(L_ALLOC)
        if not alloc_id or labels.get(L_HUB) != self.pool.hub_id:
            return
        uuids = [u for u in labels.get(L_GPUS, "").split(",") if u]
        stored = self._stored_alloc
        if stored and (stored["alloc_id"] != alloc_id or sorted(stored["uuids"]) != sorted(uuids)):
            self.log.error(
                "%s: container labels (allocation %s) contradict the hub database (%s); "
                "not claiming GPUs %s",
                self.owner,
                alloc_id,
                stored["alloc_id"],
                ", ".join(uuids),
            )
            return
        gpu = labels.get(L_GPU_TYPE) or NO_GPU  # the label holds the user's choice
        alloc = Allocation(
            alloc_id=alloc_id,
            owner=self.owner,
            gpu_type=card_type(gpu),
            uuids=uuids,
            created=float(labels.get(L_CREATED) or time.time()),
            pricing=labels.get(L_PRICING, "on-demand"),
        )
        allocator = self.pool.allocator
        if not (allocator.restore(alloc) and allocator.adopt(self.owner, alloc_id)):
            self.log.error(
                "%s: GPUs %s of container %s are held by another allocation; not claiming them",
                self.owner,
                ", ".join(uuids),
                self.container_name,
            )
            return
        self.allocation = allocator.get(self.owner)
        self.mode_label = self._label(self.allocation)
        if self.gpulab_request is None:
            try:
                self.gpulab_request = self.restored_request(
                    {
                        "image": labels.get(L_IMAGE),
                        "gpu": gpu,
                        "gpus": len(uuids) or 1,
                        "pricing": alloc.pricing,
                    }
                )
            except OptionsError as e:
                self.log.warning("%s: options from container labels: %s", self.owner, e)
        self.log.warning(
            "%s: claimed allocation %s (GPUs: %s) from running container %s",
            self.owner,
            alloc_id,
            ", ".join(uuids) or "none",
            self.container_name,
        )


async def reap_containers(pool: GpuPool) -> None:
    """Remove this hub's containers whose allocation no server holds any more.

    Runs after each orphan sweep of the pool (from hub start on: :meth:`GpuDockerSpawner.sweep_node`): a
    container of a spawn the hub died in the middle of, of a failed spawn, or of a record swept
    as orphaned must not keep running, or keep a GPU busy, with nobody tracking or billing it.
    """
    client = await asyncio.to_thread(docker.APIClient, version="auto")
    containers = await asyncio.to_thread(
        client.containers, all=True, filters={"label": f"{L_HUB}={pool.hub_id}"}
    )
    allocator = pool.allocator
    live = {a.alloc_id for a in allocator.allocations} - {o.alloc_id for o in allocator.orphans()}
    for c in containers:
        alloc_id = (c.get("Labels") or {}).get(L_ALLOC)
        if alloc_id in live:
            continue
        pool.log.warning(
            "Removing container %s (%s): its allocation %s is held by no server",
            c["Names"][0].lstrip("/") if c.get("Names") else c["Id"][:12],
            c.get("State"),
            alloc_id,
        )
        try:
            await asyncio.to_thread(client.remove_container, c["Id"], force=True)
        except docker.errors.APIError as e:
            pool.log.warning("Could not remove container %s: %s", c["Id"][:12], e)
