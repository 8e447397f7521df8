"""The node's GPU pool: catalog + inventory + allocator, one per hub process.

Spawners, the spawn form and the JSON API all read the same pool, so what the form shows is what
the allocator will hand out.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from traitlets import Float, Instance, Unicode, default
from traitlets.config import SingletonConfigurable

from gpulab.catalog import Catalog, load_catalog, settings
from gpulab.spawners.node.allocator import GpuAllocator
from gpulab.spawners.node.inventory import GpuDevice, GpuInventory
from gpulab.spawners.storage.datasets import DatasetStore
from gpulab.spawners.storage.homes import HomeStore


class GpuPool(SingletonConfigurable):
    """The GPUs of this node and who holds them."""

    data_dir = Unicode(
        config=True,
        help="""Directory for gpulab's state: the allocation ledger, user homes, the hub id.

        Defaults to $GPULAB_DATA_DIR, else ./.gpulab.""",
    )

    catalog_path = Unicode(
        "",
        config=True,
        help="""Path of the platform catalog (TOML). Empty: the catalog shipped with gpulab.""",
    )

    reconcile_interval = Float(
        30.0,
        config=True,
        help="""Seconds between checks for orphaned allocations (a random jitter of up to 10%
        is added so that many hubs don't sweep in lockstep).""",
    )

    catalog = Instance(Catalog)
    inventory = Instance(GpuInventory)
    allocator = Instance(GpuAllocator)
    homes = Instance(HomeStore)
    datasets = Instance(DatasetStore)  # users' own datasets (@OWNER/NAME)

    @default("data_dir")
    def _default_data_dir(self) -> str:
        return os.path.abspath(settings.get("GPULAB_DATA_DIR"))

    @default("catalog")
    def _default_catalog(self) -> Catalog:
        return load_catalog(self.catalog_path or None)

    @default("inventory")
    def _default_inventory(self) -> GpuInventory:
        return GpuInventory(self.catalog, parent=self)

    @default("homes")
    def _default_homes(self) -> HomeStore:
        return HomeStore(self.data_dir, self.catalog.storage, parent=self)

    @default("datasets")
    def _default_datasets(self) -> DatasetStore:
        return DatasetStore(self.homes, parent=self)

    @default("allocator")
    def _default_allocator(self) -> GpuAllocator:
        return GpuAllocator(
            self.inventory.devices, Path(self.data_dir) / "allocations.json", log=self.log
        )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._reconcile_task: asyncio.Task | None = None
        self.allocator  # noqa: B018 (build catalog, inventory and ledger now: errors surface at start)

    @property
    def hub_id(self) -> str:
        """A random id of this node's hub, stamped into every server's environment."""
        path = Path(self.data_dir) / "hub-id"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_hex(8))
            return path.read_text().strip()

    # ---- cluster nodes -----------------------------------------------------------------------

    # The cluster's nodes (e.g. Swarm's) by id: name, address, state, availability, GPU type.
    # Empty on a single machine. Set by the spawner class that knows the cluster.
    cluster_nodes: dict[str, dict[str, Any]] = {}  # replaced by set_cluster, never mutated

    def set_cluster(self, devices: list[GpuDevice], nodes: dict[str, dict[str, Any]]) -> None:
        """The cluster changed (or was read at start): ``devices`` are the cards of the nodes that
        can take servers now (ready and active), ``nodes`` every node as the cluster sees it. A
        card that leaves the pool stays held by its server until that server is reported
        stopped; the pool counts only the cards present."""
        before = {d.uuid for d in self.inventory.devices if d.node is not None}
        self.inventory.set_cluster_devices(devices)
        self.allocator.set_devices(self.inventory.devices)
        self.cluster_nodes = nodes
        after = {d.uuid for d in devices}
        if before != after:
            self.log.info(
                "Cluster GPUs: %d card(s) on %d node(s) can take servers%s%s",
                len(after),
                len({d.node for d in devices}),
                f"; left the pool: {', '.join(sorted(before - after))}" if before - after else "",
                f"; joined: {', '.join(sorted(after - before))}" if after - before else "",
            )

    def max_cards_per_node(self, gpu_type: str) -> int:
        """The most cards of ``gpu_type`` (a catalog slug) that any one node has in the pool,
        held or free: the most one server can ask for (a server's cards sit on one node)."""
        per_node: dict[str | None, int] = {}
        for dev in self.inventory.rentable:
            if dev.gpu_type == gpu_type:
                per_node[dev.node] = per_node.get(dev.node, 0) + 1
        return max(per_node.values(), default=0)

    # ---- orphan sweep ------------------------------------------------------------------------

    def start_reconciling(
        self,
        after: Awaitable[Any] | None = None,
        node_sweep: Callable[[GpuPool], Awaitable[None]] | None = None,
    ) -> None:
        """Start the periodic orphan sweep (idempotent; needs a running event loop).

        ``after``: the first sweep waits for it (the hub's spawners restored, so that unclaimed
        records really are orphans). ``node_sweep``: the spawner class's own sweep, run after each
        orphan sweep (e.g. removing containers whose allocation is gone).
        """
        if self._reconcile_task is None:
            self._reconcile_task = asyncio.get_running_loop().create_task(
                self._reconcile_loop(after, node_sweep)
            )

    async def _reconcile_loop(
        self,
        after: Awaitable[Any] | None,
        node_sweep: Callable[[GpuPool], Awaitable[None]] | None,
    ) -> None:
        if after is not None:
            await after
        while True:
            try:
                self.allocator.sweep_orphans(self.hub_id)
            except Exception:
                self.log.exception("Orphan sweep failed")
            if node_sweep is not None:
                try:
                    await node_sweep(self)
                except Exception:
                    self.log.exception("The spawner's node sweep failed")
            await asyncio.sleep(self.reconcile_interval * (1 + random.uniform(0, 0.1)))

    # ---- JSON views --------------------------------------------------------------------------

    async def snapshot(self, *, show_holders: bool = False, viewer: str | None = None) -> dict:
        """The live pool: per type free/total, and each card with its state."""
        usage = await self.inventory.usage()
        held = self.allocator.held_uuids()
        counts = self.allocator.counts()
        types = []
        for slug, gpu_type in self.catalog.gpu_types.items():
            c = counts.get(slug, {"total": 0, "free": 0})
            simulated = sum(
                1 for d in self.inventory.rentable if d.gpu_type == slug and d.simulated
            )
            types.append(
                {
                    "slug": slug,
                    "display_name": gpu_type.display_name,
                    "vram_gb": gpu_type.vram_gb,
                    "on_demand_price": str(gpu_type.on_demand_price),
                    "spot_floor_price": str(gpu_type.spot_floor_price),
                    "total": c["total"],
                    "free": c["free"],
                    "simulated": simulated,
                }
            )
        gpus = []
        for dev in self.inventory.devices:
            holder = held.get(dev.uuid)
            u = usage.get(dev.uuid)
            entry: dict[str, Any] = {
                **dev.to_json(),
                "held": holder is not None,
                "utilization_percent": u.utilization_percent if u else None,
                "memory_used_mib": u.memory_used_mib if u else None,
            }
            if holder is not None:
                user = holder.owner.split("/", 1)[0]
                entry["yours"] = viewer is not None and user == viewer
                if show_holders:
                    entry["holder"] = holder.owner
            gpus.append(entry)
        return {
            "currency": self.catalog.currency,
            "gpu_types": types,
            "gpus": gpus,
            "nodes": self._node_view(held, show_addresses=show_holders),
            "no_gpu": {
                "available": True,
                "price_per_hour": str(self.catalog.no_gpu.price_per_hour),
            },
            "nvml": {
                "available": self.inventory.nvml_error is None,
                "error": self.inventory.nvml_error,
            },
        }

    def _node_view(self, held: dict, show_addresses: bool = False) -> list[dict[str, Any]]:
        """Per cluster node: its state and, per GPU type, free/total of its cards in the pool (a
        down or drained node has none in the pool). Nodes' addresses and hostnames are the
        operator's business: only admins see them."""
        out = []
        for node_id, info in sorted(
            self.cluster_nodes.items(), key=lambda kv: kv[1].get("name", "")
        ):
            if not show_addresses:
                info = {k: v for k, v in info.items() if k not in ("address", "hostname")}
            types: dict[str, dict[str, int]] = {}
            for dev in self.inventory.devices:
                if dev.node == node_id and dev.gpu_type is not None:
                    c = types.setdefault(dev.gpu_type, {"total": 0, "free": 0})
                    c["total"] += 1
                    c["free"] += dev.uuid not in held
            out.append(
                {
                    "id": node_id,
                    **info,
                    "gpu_types": [{"slug": k, **v} for k, v in sorted(types.items())],
                }
            )
        return out
