"""What the hub knows of the Swarm: its nodes, their GPUs, and the engines it execs through.

- :func:`read_cluster` turns the manager's node list into the pool's cards: each node advertises
  its cards as generic resources (``NVIDIA-GPU=<UUID>`` in its dockerd config) and its GPU type as
  the node label ``gpulab.gpu-type`` (a catalog slug; one type per node, as GPU boxes are built);
  ``gpulab.simulated=true`` marks simulated cards. Only ready, active nodes' cards are in the
  pool: a node that is down, drained or paused takes no new server.
- :class:`SwarmCluster` (one per hub process) re-reads the node list every few seconds
  (jittered) and hands it to the pool, so a node that joins, leaves, goes down or is drained
  moves its cards in or out of the free pool within seconds; servers' ``poll`` reads node states
  from it. It also holds the Docker API of each node's own engine: the manager's API cannot
  ``docker exec`` into a container on another node, so the preemption agent and observed
  activity reach a task's container through its node's engine (``node_engines``: node id, node
  name or hostname -> Docker URL).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import docker
from docker.utils import kwargs_from_env
from traitlets import Dict, Float, Unicode, validate
from traitlets.config import SingletonConfigurable

from gpulab.catalog import Catalog
from gpulab.spawners.node.inventory import GpuDevice
from gpulab.spawners.node.pool import GpuPool

TYPE_LABEL = "gpulab.gpu-type"
SIMULATED_LABEL = "gpulab.simulated"
NAME_LABEL = "gpulab.node"


def node_name(node: dict[str, Any]) -> str:
    """A node's name for people: its ``gpulab.node`` label, else its hostname, else its id.
    (Engines sharing a hostname, as on a test machine, are told apart by the label.)"""
    labels = node.get("Spec", {}).get("Labels") or {}
    return labels.get(NAME_LABEL) or node.get("Description", {}).get("Hostname") or node["ID"][:12]


def node_address(node: dict[str, Any]) -> str:
    """Where the hub reaches servers published on this node."""
    addr = node.get("Status", {}).get("Addr") or ""
    if addr in ("", "0.0.0.0"):
        # A manager may report 0.0.0.0; its manager address is the one it advertises.
        addr = (node.get("ManagerStatus") or {}).get("Addr", "").rpartition(":")[0]
    return addr


def read_cluster(
    nodes: list[dict[str, Any]], catalog: Catalog, kind: str, warn: Callable[[str], None]
) -> tuple[list[GpuDevice], dict[str, dict[str, Any]]]:
    """(cards of the nodes that take servers now, every node's view for the pool API)."""
    devices: list[GpuDevice] = []
    info: dict[str, dict[str, Any]] = {}
    for node in nodes:
        spec, status = node.get("Spec", {}), node.get("Status", {})
        labels = spec.get("Labels") or {}
        resources = (node.get("Description", {}).get("Resources") or {}).get(
            "GenericResources"
        ) or []
        uuids = [
            r["NamedResourceSpec"]["Value"]
            for r in resources
            if (r.get("NamedResourceSpec") or {}).get("Kind") == kind
        ]
        gpu_type = labels.get(TYPE_LABEL)
        simulated = labels.get(SIMULATED_LABEL, "").lower() in ("true", "1", "yes")
        name = node_name(node)
        state, availability = status.get("State", "unknown"), spec.get("Availability", "")
        info[node["ID"]] = {
            "name": name,
            "hostname": node.get("Description", {}).get("Hostname", ""),
            "address": node_address(node),
            "state": state,
            "availability": availability,
            "gpu_type": gpu_type,
            "simulated": simulated,
            "gpus": len(uuids),
            "nano_cpus": (node.get("Description", {}).get("Resources") or {}).get("NanoCPUs", 0),
        }
        if uuids and gpu_type not in catalog.gpu_types:
            warn(
                f"Swarm node {name} advertises {len(uuids)} {kind} card(s) but its label "
                f"{TYPE_LABEL}={gpu_type!r} is not a catalog GPU type "
                f"(allowed: {', '.join(catalog.gpu_types)}); its cards are not offered"
            )
            continue
        if state != "ready" or availability != "active":
            continue
        for i, dev_uuid in enumerate(uuids):
            t = catalog.gpu_types[gpu_type]
            devices.append(
                GpuDevice(
                    index=i,
                    uuid=dev_uuid,
                    name=f"{t.display_name} on {name}" + (" (simulated)" if simulated else ""),
                    memory_total_mib=t.vram_gb * 1024,
                    gpu_type=gpu_type,
                    simulated=simulated,
                    node=node["ID"],
                )
            )
    return devices, info


class SwarmCluster(SingletonConfigurable):
    """The hub's view of the Swarm: the manager's API, the node list (re-read every few
    seconds into the pool), and each node's own engine for ``docker exec``."""

    manager_url = Unicode(
        "",
        config=True,
        help="""Docker API URL of a Swarm manager (e.g. unix:///var/run/docker.sock on the
        manager, or tcp://manager:2376 with TLS). Empty: DOCKER_HOST, else the local socket.""",
    )

    node_engines = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""Docker API URL of each node's own engine, by node id, node name (its
        gpulab.node label) or hostname, e.g. {"gpu-box-2": "tcp://10.0.0.12:2376"}; a name or
        hostname that several nodes share reaches none of them (logged). The
        manager's API cannot exec into containers on other nodes; without an entry for a node,
        its servers get no preemption warning and no observed activity (logged).""",
    )

    tls_config = Dict(
        config=True,
        help="""TLS settings (docker.tls.TLSConfig keyword arguments) for the node engines in
        node_engines (the manager's come from DockerSpawner.tls_config).""",
    )

    gpu_resource = Unicode(
        "NVIDIA-GPU",
        config=True,
        help="""The generic resource kind the nodes advertise their cards as
        (dockerd --node-generic-resource KIND=UUID, or node-generic-resources in daemon.json);
        a GPU server reserves this many of them.""",
    )

    node_poll_interval = Float(
        2.0,
        config=True,
        help="""Seconds between reads of the Swarm's node list (a random jitter of up to 20%
        is added): how soon a node that joins, leaves, goes down or is drained moves its cards
        in or out of the pool. Swarm itself marks a dead node down after a few dispatcher
        heartbeats (`docker swarm update --dispatcher-heartbeat 1s` makes that ~3 s).""",
    )

    @validate("gpu_resource")
    def _check_kind(self, proposal: dict) -> str:
        kind = proposal["value"]
        if not kind or not all(c.isalnum() or c in "-_" for c in kind):
            raise ValueError(
                f"gpu_resource: {kind!r} is not allowed; allowed: letters, digits, '-' and '_' "
                "(e.g. NVIDIA-GPU)"
            )
        return kind

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.read_at = 0.0
        self.pool: GpuPool | None = None
        self._warned: set[str] = set()
        self._task: asyncio.Task | None = None
        self._clients: dict[str, docker.APIClient] = {}
        self._lock = threading.Lock()

    # ---- the manager and the node list -------------------------------------------------------

    def manager(self) -> docker.APIClient:
        """A client of the manager's API (one per thread use; cheap to keep)."""
        return self._client_for(self.manager_url or "")

    def _warn(self, message: str) -> None:
        if message not in self._warned:  # once per distinct problem, not every few seconds
            self._warned.add(message)
            self.log.warning("%s", message)

    def refresh(self) -> None:
        """Read the nodes now and update the pool (blocking: one manager API call)."""
        assert self.pool is not None
        raw = self.manager().nodes()
        devices, info = read_cluster(raw, self.pool.catalog, self.gpu_resource, self._warn)
        for node_id, node in info.items():
            old = self.nodes.get(node_id)
            now, before = (node["state"], node["availability"]), None
            if old is not None:
                before = (old["state"], old["availability"])
            if before is not None and before != now:
                self.log.warning(
                    "Swarm node %s (%s) is now %s, %s (was %s, %s)",
                    node["name"],
                    node["address"],
                    *now,
                    *before,
                )
        for node_id in set(self.nodes) - set(info):
            self.log.warning("Swarm node %s left the swarm", self.nodes[node_id]["name"])
        self.nodes = info
        self.read_at = time.monotonic()
        self.pool.set_cluster(devices, info)

    def start(self, pool: GpuPool) -> None:
        """Read the nodes once now (blocking: before any server is restored or spawned), then
        every ``node_poll_interval`` in the hub's event loop."""
        self.pool = pool
        try:
            self.refresh()
        except docker.errors.DockerException as e:
            raise SystemExit(
                f"gpulab: the Swarm spawner cannot read the swarm's nodes from the manager at "
                f"{self.manager_url or 'DOCKER_HOST/the local socket'}: {e}"
            ) from None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            # Jitter: many hubs (or restarts) don't poll the manager in lockstep.
            await asyncio.sleep(self.node_poll_interval * (1 + random.uniform(0, 0.2)))
            try:
                await asyncio.to_thread(self.refresh)
            except Exception as e:  # the manager may be restarting: keep the last view
                self._warn(f"Reading the Swarm's nodes failed: {e}")

    def node(self, node_id: str) -> dict[str, Any] | None:
        return self.nodes.get(node_id)

    # ---- node engines ------------------------------------------------------------------------

    def engine_url(self, node_id: str) -> str | None:
        """The node's engine URL from ``node_engines``: keyed by its id, or by a name or hostname
        that no other node has. Nodes cloned from one image often share a hostname, and a key
        matching several nodes must not send one node's exec to another's engine."""
        if node_id in self.node_engines:
            return self.node_engines[node_id]
        node = self.nodes.get(node_id) or {}
        for field in ("name", "hostname"):
            key = node.get(field, "")
            if key in self.node_engines:
                if sum(key in (n.get("name"), n.get("hostname")) for n in self.nodes.values()) == 1:
                    return self.node_engines[key]
                self._warn(
                    f"SwarmCluster.node_engines key {key!r} names several Swarm nodes; "
                    "key their engines by node id or gpulab.node label"
                )
        return None

    def engine(self, node_id: str) -> docker.APIClient:
        """A client of node ``node_id``'s own engine; LookupError when none is configured."""
        url = self.engine_url(node_id)
        if url is None:
            name = (self.nodes.get(node_id) or {}).get("name", node_id)
            raise LookupError(
                f"SwarmCluster.node_engines has no Docker URL for Swarm node {name} "
                f"({node_id}): the hub cannot exec into its containers"
            )
        return self._client_for(url, tls=True)

    def _client_for(self, url: str, tls: bool = False) -> docker.APIClient:
        with self._lock:
            if url not in self._clients:
                kwargs: dict[str, Any] = {"version": "auto"}
                if url:
                    kwargs["base_url"] = url
                else:
                    kwargs.update(kwargs_from_env())
                if tls and self.tls_config:
                    kwargs["tls"] = docker.tls.TLSConfig(**self.tls_config)
                self._clients[url] = docker.APIClient(**kwargs)
            return self._clients[url]
