"""``gpulab-swarm``: every server a Docker Swarm service, on the node that holds its cards.

It is :class:`~gpulab.spawners.docker.spawner.GpuDockerSpawner` (same options, allocation, labels,
progress, limits, datasets and models read-only, non-root user, no capabilities, images never
pulled at spawn time) whose object is a service instead of a container (dockerspawner's
``SwarmSpawner``):

- **Placement.** The allocator decides the node and the cards (all of a server's cards on one
  node, never a card twice; :mod:`gpulab.spawners.node.allocator`); the service gets the
  constraint ``node.id==<node>`` and ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES`` naming
  exactly those cards (on real nodes the NVIDIA runtime, the nodes' default runtime, exposes
  them), as gpulab-docker does. By default the service does *not* reserve Swarm generic
  resources (``reserve_generic_resources``): Swarm's constraint enforcer (swarmkit, Docker 20.10
  and later) rejects a running task holding named generic resources whenever its node is updated
  while active (a label change, re-activating a paused node): a GPU server would die for an
  operator's ``docker node update``. With the reservation switched on, Swarm picks which of the
  node's cards the task gets (there is no way to ask for given UUIDs), so the spawner reads the
  task's assigned cards back and records Swarm's choice (``GpuAllocator.reassign``, swapping
  with the record that held them, so no card is ever held twice), and the container's visible
  devices are set from Swarm's ``DOCKER_RESOURCE_NVIDIA-GPU`` before the server starts.
- **Network.** The server's port is published in host mode on its node (Docker picks a free
  port); the proxy reaches ``<node address>:<port>``. Servers reach the hub API at
  ``JupyterHub.hub_connect_ip``, an address of the hub's machine on the nodes' network.
- **Homes.** With ``shared_home_path`` (a shared filesystem mounted at the same path on every
  node: NFS, CephFS, ...), each user's home is a bind mount of their directory there, so it
  follows them to any node; its quota is the shared filesystem's own (CephFS: the hub sets
  ``ceph.quota.max_bytes`` on the folder at every start, :mod:`.quota`; NFS: the server's
  quotas, set up by the operator). Without it, the home is a named volume on one node and the
  user is pinned to that node (said in the log at every spawn): their spawns only take cards
  there. ``/tmp`` and ``/dev/shm`` are tmpfs mounts sized by the catalog (``storage.tmp_gb``,
  ``storage.shm_gb``), gone with the task; the task's json-file log is rotated at
  ``log_max_bytes``.
- **Node failure.** :class:`~gpulab.spawners.swarm.cluster.SwarmCluster` reads the nodes every
  few seconds: a node that is down or drained takes no new server and its cards leave the pool.
  ``poll`` reports a server whose node is down (or whose task stopped) stopped, with the reason
  logged; JupyterHub then stops it (its cards and billing session are released) and the user can
  start again on another node. A paused node (``docker node update --availability pause``, the
  gentle drain) takes no new server and its running servers keep going; Swarm's own ``drain``
  shuts its tasks down, and their servers are reported stopped with that reason.
- **Recovery.** The service carries the container's labels; after a hub restart ``poll`` claims
  a running service's allocation from them (cards: those Swarm assigned to the task).
- **Preemption agent and observed activity** go through the task's node's own engine
  (``SwarmCluster.node_engines``), since the manager cannot exec on other nodes.
- **Training jobs** (issue 26). A job server (``job-<id>``, ``job-<id>-<rank>``; its
  :class:`~gpulab.spawners.jobs.launch.JobLaunch` filed by the hub's scheduler) runs the job
  runner (``spawners/inside/jobrunner.py``) as the container's command instead of JupyterLab.
  A gang's rank (its cards allocated ahead for the whole gang, adopted here) is attached to the
  job's own overlay network (``launch.network``, made by ``hub_config/jobs/gang.py``, not
  attachable: only that job's services are on it) under its server name as an alias, with DNS
  round-robin endpoints, so ``MASTER_ADDR=job-<id>-0`` reaches rank 0's container directly on
  any port (``MASTER_PORT`` 29500). The runner's exit code is the task's container exit code as
  the manager reports it (a task gone with its node has none: the job's attempt then ended by
  node failure), and its output is the service's log, kept past the service's removal.

Not carried over from gpulab-docker on Docker 20.10 engines (service API 1.41): the
``no-new-privileges`` flag (services get it from API 1.44), and the ulimits; a server still runs
as a non-root user with every capability dropped.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import docker
from docker.types import (
    ContainerSpec,
    EndpointSpec,
    Mount,
    NetworkAttachmentConfig,
    Placement,
    Resources,
    RestartPolicy,
    TaskTemplate,
)
from dockerspawner import SwarmSpawner
from jupyterhub.traitlets import ByteSpecification
from traitlets import Bool, Float, Unicode, default, validate

from gpulab.spawners.docker.images import image_status
from gpulab.spawners.docker.labels import L_ALLOC, L_GPUS, L_HUB, L_USER, LABEL_PREFIX
from gpulab.spawners.docker.spawner import GpuDockerSpawner, _docker_reason
from gpulab.spawners.images import ImageStatus
from gpulab.spawners.inside import jobrunner
from gpulab.spawners.mixin import SpawnError
from gpulab.spawners.node.allocator import Allocation
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.request import SpawnRequest
from gpulab.spawners.swarm.cluster import SwarmCluster
from gpulab.spawners.swarm.quota import apply_quota

L_NODE = LABEL_PREFIX + "node"
L_JOB = LABEL_PREFIX + "job"
# Sent to the container's Python as its command for a job server (stdlib only, like the agent).
RUNNER_SOURCE = Path(jobrunner.__file__).read_text()
# What ended job servers left (exit code, output), by owner key ("alice/job-17-0"), in the hub's
# memory: JupyterHub drops a stopped named server's spawner object, and the scheduler may ask
# after that (through a new object made from its record). The newest ENDED_KEPT servers'.
ENDED_KEPT = 64
_ended: OrderedDict[str, tuple[int | None, bytes]] = OrderedDict()


def _remember(owner: str, code: int | None = None, output: bytes | None = None) -> None:
    old_code, old_output = _ended.pop(owner, (None, b""))
    _ended[owner] = (old_code if code is None else code, old_output if output is None else output)
    while len(_ended) > ENDED_KEPT:
        _ended.popitem(last=False)


# Task states on the way to running (Swarm's own order), and those a server never leaves alive.
STARTING = {"new", "pending", "assigned", "accepted", "preparing", "ready", "starting"}
ENDED = {"complete", "failed", "shutdown", "rejected", "orphaned", "remove"}

# Run first in the container: the cards Swarm assigned (its DOCKER_RESOURCE_<KIND> variable)
# become the visible devices, then the server's own command replaces this process.
PIN_SOURCE = """import os, sys
cards = os.environ.get({var!r})
if cards:
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["NVIDIA_VISIBLE_DEVICES"] = cards
os.execvp(sys.argv[1], sys.argv[1:])
"""


def assigned_cards(task: dict[str, Any], kind: str) -> list[str]:
    """The card UUIDs Swarm assigned to ``task`` (API 1.41 calls them ``GenericResources``,
    later ones ``AssignedGenericResources``)."""
    found = task.get("AssignedGenericResources") or task.get("GenericResources") or []
    return [
        r["NamedResourceSpec"]["Value"]
        for r in found
        if (r.get("NamedResourceSpec") or {}).get("Kind") == kind
    ]


class GpuSwarmSpawner(GpuDockerSpawner, SwarmSpawner):
    """Runs each server as a Swarm service on the node holding its cards (module docstring)."""

    # The hub's job scheduler may run jobs over several nodes here (hub_config/jobs/gang.py).
    supports_gangs = True

    shared_home_path = Unicode(
        "",
        config=True,
        help="""Each user's home on a shared filesystem that the operator mounts at the same
        path on every node (NFS, CephFS, ...), e.g. "/srv/gpulab/homes/{username}" ({username}:
        the escaped user name). The hub creates the directory (owned by container_user) when it
        can see the path too. Empty: the home is a named volume on one node, and the user's
        servers are pinned to the node that holds it.""",
    )

    reserve_generic_resources = Bool(
        False,
        config=True,
        help="""Make each GPU server's service reserve its cards as Swarm generic resources
        (the kind SwarmCluster.gpu_resource), so that Swarm itself also accounts for them, e.g.
        when other, non-gpulab services on the swarm reserve GPUs too. Off by default: Swarm's
        constraint enforcer rejects a running task holding named generic resources whenever its
        node is updated while active (a label change, re-activating a paused node), which would
        stop a GPU server. gpulab's allocator is the only judge of which cards are free either
        way; the server sees exactly its cards through NVIDIA_VISIBLE_DEVICES.""",
    )

    placement_timeout = Float(
        60.0,
        config=True,
        help="""Seconds a new service's task may wait for Swarm to place and start it (a node
        with the cards, the image present) before the spawn fails with Swarm's reason.""",
    )

    task_poll_interval = Float(
        0.1,
        config=True,
        help="Seconds between reads of a starting service's task state from the manager.",
    )

    @validate("shared_home_path")
    def _check_shared_home(self, proposal: dict) -> str:
        path = proposal["value"]
        if path and (not path.startswith("/") or "{username}" not in path):
            raise ValueError(
                f"shared_home_path: {path!r} is not allowed; allowed: an absolute path with "
                "{username}, e.g. /srv/gpulab/homes/{username}, or empty"
            )
        return path

    @property
    def cluster(self) -> SwarmCluster:
        return SwarmCluster.instance(config=self.config)

    @default("client_kwargs")
    def _default_client_kwargs(self) -> dict[str, Any]:
        url = self.cluster.manager_url
        return {"base_url": url} if url else {}

    @default("network_name")
    def _default_network_name(self) -> str:
        # No overlay network: the port is published in host mode on the server's node.
        return ""

    # ---- hub start ---------------------------------------------------------------------------

    @classmethod
    def prepare_node(cls, pool: GpuPool, config: Any) -> None:
        """Read the swarm's nodes into the pool before any server is restored or spawned."""
        SwarmCluster.instance(config=config).start(pool)

    @classmethod
    async def sweep_node(cls, pool: GpuPool) -> None:
        await reap_services(pool, SwarmCluster.instance())

    # ---- homes -------------------------------------------------------------------------------

    def home_dir(self) -> str:
        return self.shared_home_path.format(username=self.escaped_name)

    def _prepare_shared_home(self) -> None:
        """Create the user's shared home (blocking), owned by the server's user, if the hub's
        machine sees the shared filesystem; otherwise the operator's nodes must have it."""
        path = Path(self.home_dir())
        if not path.parent.is_dir():
            self.log.warning(
                "shared_home_path: %s is not visible on the hub's machine; the nodes must "
                "already have %s",
                path.parent,
                path,
            )
            return
        if not path.exists():
            path.mkdir(mode=0o700)
            uid, _, gid = self.container_user.partition(":")
            os.chown(path, int(uid), int(gid or uid))
        quota = self.pool.homes.quota(self.user_home_name())
        plan = apply_quota(path, quota)
        cls = type(self)
        if plan.enforced:
            self.log.debug("Home %s: %s", path, plan.why)
        elif not getattr(cls, "_told_unbounded", False):
            cls._told_unbounded = True
            self.log.warning("Shared homes are NOT bounded by the hub: %s", plan.why)

    async def _home_node(self) -> str | None:
        """Without a shared home: the node whose engine holds the user's home volume."""
        for node_id in list(self.cluster.nodes):
            try:
                engine = self.cluster.engine(node_id)
                await asyncio.to_thread(engine.inspect_volume, self.home_volume_name)
            except (LookupError, docker.errors.DockerException):
                continue
            return node_id
        return None

    def _mounts(self, node_id: str | None) -> list[Mount]:
        if self.shared_home_path:
            home = Mount(target=self.home_mount, source=self.home_dir(), type="bind")
        else:
            home = Mount(
                target=self.home_mount,
                source=self.home_volume_name,
                type="volume",
                labels={L_USER: self.user.name, L_HUB: self.pool.hub_id},
            )
        return [home, *self._dataset_mounts(), *self._model_mounts()]

    # ---- the service -------------------------------------------------------------------------

    def _service_spec(self, alloc: Allocation, node_id: str | None, cmd: list[str]) -> dict:
        cpus, mem = self.resource_limits(alloc)
        mem_bytes = ByteSpecification().validate(self, mem)
        labels = {**self.labels(alloc), L_NODE: node_id or ""}
        launch = self.gpulab_job
        if launch is not None:
            labels[L_JOB] = str(launch.job_id)
        kind = self.cluster.gpu_resource
        pin = PIN_SOURCE.format(var=f"DOCKER_RESOURCE_{kind}")
        tmp, shm = self.scratch_sizes(mem_bytes)
        container = ContainerSpec(
            image=self.image,
            command=[self.exec_python, "-c", pin, *cmd],
            env=self.get_env(),
            user=self.container_user,
            labels=labels,
            mounts=[
                *self._mounts(node_id),
                Mount(target="/dev/shm", source="", type="tmpfs", tmpfs_size=shm),
                Mount(target="/tmp", source="", type="tmpfs", tmpfs_size=tmp, tmpfs_mode=0o1777),
            ],
            cap_drop=["ALL"],
        )
        resources = Resources(
            cpu_limit=self._cpu_limit(cpus, node_id),
            mem_limit=mem_bytes,
            generic_resources=(
                {kind: len(alloc.uuids)} if alloc.uuids and self.reserve_generic_resources else None
            ),
        )
        # A fork bomb stays inside this server (catalog [limits]); API 1.41 knows Pids.
        resources["Limits"]["Pids"] = self.pool.catalog.limits.pids
        constraints = [f"node.id=={node_id}"] if node_id else []
        task = TaskTemplate(
            container_spec=container,
            resources=resources,
            placement=Placement(constraints=constraints),
            # A server that dies is reported stopped, never restarted behind the hub's back.
            restart_policy=RestartPolicy(condition="none"),
            # A gang's rank: on its job's own network, named there by its server name.
            networks=(
                [NetworkAttachmentConfig(launch.network, aliases=[self.name])]
                if launch is not None and launch.network
                else None
            ),
            log_driver={
                "Name": "json-file",
                "Options": {"max-size": str(max(self.log_max_bytes // 2, 1024)), "max-file": "2"},
            },
        )
        endpoint = EndpointSpec(
            # DNS round robin: a name on the job's network is the task's own address, reachable
            # on every port (a virtual IP forwards only the service's published ports).
            mode="dnsrr" if launch is not None and launch.network else None,
            ports=[{"TargetPort": self.port, "Protocol": "tcp", "PublishMode": "host"}],
        )
        return {
            "task_template": task,
            "endpoint_spec": endpoint,
            "name": self.service_name,
            "labels": labels,
        }

    async def _launch(self, request: SpawnRequest) -> str:
        alloc = self.allocation
        opts = request.options
        assert alloc is not None
        self.image = self._image_status.docker_image
        node_id = self.pool.allocator.node_of(alloc) if alloc.uuids else None
        if not self.shared_home_path and node_id is None:
            node_id = self._pinned_node
        if node_id is None and set(self._image_nodes) != {
            n for n, i in self.cluster.nodes.items() if i.get("state") == "ready"
        }:
            # A no-GPU server whose image only some nodes hold: one of those (constraints
            # cannot say "any of these nodes").
            node_id = min(self._image_nodes)
        where = self._node_label(node_id) if node_id else "any node"
        self.emit_progress(25, f"Image {opts.image} ({self.image}); placing on {where}")
        if self.shared_home_path:
            await asyncio.to_thread(self._prepare_shared_home)
        if await self.get_object() is not None:
            self.log.warning("Removing leftover service %s", self.service_name)
            await self.remove_object()
        cmd = await self.job_command() if self.gpulab_job is not None else await self.get_command()
        t0 = time.perf_counter()
        try:
            service = await self.docker("create_service", **self._service_spec(alloc, node_id, cmd))
        except docker.errors.APIError as e:
            raise SpawnError(
                500, f"Swarm could not create the service: {_docker_reason(e)}"
            ) from None
        self.object_id = service["ID"]
        self.emit_progress(
            40, f"Service {self.service_name} created; waiting for Swarm to place it"
        )
        task = await self._wait_task(lambda t: t["Status"]["State"] not in {"new", "pending"})
        cards = assigned_cards(task, self.cluster.gpu_resource)
        if self.reserve_generic_resources and alloc.uuids and sorted(cards) != sorted(alloc.uuids):
            try:
                self.allocation = self.pool.allocator.reassign(self.owner, cards)
            except ValueError as e:
                raise SpawnError(500, f"Swarm assigned other cards than allocated: {e}") from None
            self.log.info("%s: Swarm assigned %s (recorded)", self.owner, ", ".join(cards))
        node_id = task["NodeID"]
        self.emit_progress(
            50,
            f"Placed on {self._node_label(node_id)}"
            + (f" with {', '.join(self.allocation.uuids)}" if alloc.uuids else ""),
        )
        t1 = time.perf_counter()
        task = await self._wait_task(lambda t: t["Status"]["State"] == "running")
        ip = await self._node_address(node_id)
        ports = task["Status"].get("PortStatus", {}).get("Ports") or []
        port = next(p["PublishedPort"] for p in ports if p.get("TargetPort") == self.port)
        self.emit_progress(60, f"Task running; waiting for JupyterLab at {ip}:{port}")
        t2 = time.perf_counter()
        await self._wait_answering(ip, port)
        self.launch_timings = {
            "service_place": t1 - t0,
            "task_start": t2 - t1,
            "python_startup_to_listen": time.perf_counter() - t2,
        }
        return f"http://{ip}:{port}"

    async def job_command(self) -> list[str]:
        """A job server's command: the job runner, answering on the server's port."""
        return [self.exec_python, "-c", RUNNER_SOURCE, "--ip", "0.0.0.0", "--port", str(self.port)]

    _job_log: bytes = b""  # a job server's output, kept when its service is removed

    def _service_log(self) -> bytes | None:
        """The job's output (stdout and stderr; blocking), at most log_max_bytes (the newest
        kept): the newest task's container log from its node's own engine (the manager's
        service log needs every node's agent to stream, and gives up on any it misses), else
        the manager's service log; None when neither answers (a node that is down)."""
        tasks = self.client.tasks(filters={"service": self.object_id})
        tasks.sort(key=lambda t: t.get("CreatedAt", ""), reverse=True)
        if not tasks:
            return None
        status = tasks[0]["Status"]
        container = (status.get("ContainerStatus") or {}).get("ContainerID")
        node = self.cluster.node(tasks[0].get("NodeID", "")) or {}
        if node.get("state") != "ready":
            return None  # its engine is gone with it: keep what was read before
        data = None
        if container:
            try:
                engine = self.cluster.engine(tasks[0]["NodeID"])
                data = engine.logs(container, stdout=True, stderr=True, timestamps=False)
            except Exception:  # no engine URL, or it does not answer: ask the manager
                data = None
        if data is None:
            chunks = self.client.service_logs(
                self.object_id, stdout=True, stderr=True, follow=False, timestamps=False
            )
            data = b"".join(chunks)
        return data[-self.log_max_bytes :] if self.log_max_bytes else data

    async def gpulab_read_log(self) -> bytes:
        """What the job runner and its command printed (the hub's job log reads it), also
        once the service is gone (kept at its stop). Never raises: a node that died keeps the
        output read before."""
        if self.object_id and self.gpulab_job is not None:
            try:
                data = await asyncio.to_thread(self._service_log)
            except Exception as e:
                self.log.debug("%s: service log unreadable: %s", self.service_name, e)
                data = None
            if data is not None:
                self._job_log = data
                _remember(self.owner, output=data)
        return self._job_log or _ended.get(self.owner, (None, b""))[1]

    async def gpulab_exit_status(self) -> int | None:
        """The runner's exit code: the task's container exit code as the manager records it,
        read when asked (the scheduler asks every pass), kept past the service's removal."""
        if self._job_exit is None and self.gpulab_job is not None and self.object_id:
            await self._read_job_exit()
        if self._job_exit is not None:
            return self._job_exit
        return _ended.get(self.owner, (None, b""))[0]

    async def stop(self, now: bool = False) -> None:
        if self.gpulab_job is not None and self.object_id:
            # The service's log and exit code go with its removal: read them first.
            await self.gpulab_read_log()
            await self._read_job_exit()
        await super().stop(now)

    async def _read_job_exit(self) -> None:
        """Record the runner's exit code from the newest task, once its container exited."""
        try:
            tasks = await self._tasks()
        except docker.errors.DockerException:
            return
        if not tasks:
            return
        status = tasks[0]["Status"]
        code = (status.get("ContainerStatus") or {}).get("ExitCode")
        if status["State"] == "complete" and code is None:
            code = 0  # the API leaves a zero exit code out
        if (
            status["State"] in ("complete", "failed")
            and code is not None
            and self._job_exit is None
        ):
            self._job_exit = int(code)
            _remember(self.owner, code=self._job_exit)

    def _cpu_limit(self, cpus: float, node_id: str | None) -> int:
        """The catalog's CPU limit in nano-CPUs, at most the node's CPUs: Swarm rejects a task
        whose limit exceeds its node's (a container's CPU quota may; a service's may not)."""
        nodes = self.cluster.nodes
        sizes = [nodes[node_id]] if node_id in nodes else list(nodes.values())
        most = min((n.get("nano_cpus") or 0 for n in sizes), default=0)
        wanted = int(cpus * 1e9)
        if most and wanted > most:
            self.log.info(
                "%s: CPU limit %g capped at the node's %g CPUs", self.owner, cpus, most / 1e9
            )
            return most
        return wanted

    def _node_label(self, node_id: str) -> str:
        node = self.cluster.node(node_id) or {}
        return f"node {node.get('name', node_id)} ({node.get('address', '?')})"

    async def _node_address(self, node_id: str) -> str:
        node = self.cluster.node(node_id)
        if node is None or not node.get("address"):
            await asyncio.to_thread(self.cluster.refresh)
            node = self.cluster.node(node_id) or {}
        return node["address"]

    async def _tasks(self) -> list[dict[str, Any]]:
        tasks = await asyncio.to_thread(
            self.client.tasks, filters={"service": self.object_id or self.service_name}
        )
        # The newest first: a service has one slot; older tasks are history.
        return sorted(tasks, key=lambda t: t.get("CreatedAt", ""), reverse=True)

    async def _wait_task(self, done) -> dict[str, Any]:
        deadline = time.monotonic() + self.placement_timeout
        last = None
        while time.monotonic() < deadline:
            tasks = await self._tasks()
            if tasks:
                last = tasks[0]
                state = last["Status"]["State"]
                if state in ENDED:
                    raise SpawnError(500, await self._task_failure(last))
                if done(last):
                    return last
            await asyncio.sleep(self.task_poll_interval)
        why = (last or {}).get("Status", {}).get("Err") or (last or {}).get("Status", {}).get(
            "Message", "no task"
        )
        raise SpawnError(
            500, f"Swarm did not start the server in {self.placement_timeout:g}s: {why}"
        )

    async def _task_failure(self, task: dict[str, Any]) -> str:
        status = task["Status"]
        why = status.get("Err") or status.get("Message") or status["State"]
        tail = ""
        container = (status.get("ContainerStatus") or {}).get("ContainerID")
        if container:
            try:
                engine = self.cluster.engine(task["NodeID"])
                raw = await asyncio.to_thread(engine.logs, container, tail=self.log_tail_lines)
                tail = "\n" + raw.decode(errors="replace").rstrip("\n")
            except (LookupError, docker.errors.DockerException):
                pass
        code = (status.get("ContainerStatus") or {}).get("ExitCode")
        return f"Server task {status['State']} ({why}, code {code}) before it answered.{tail}"

    async def _raise_if_exited(self) -> None:
        tasks = await self._tasks()
        if not tasks or tasks[0]["Status"]["State"] != "running":
            raise SpawnError(500, await self._task_failure(tasks[0]) if tasks else "Service gone")

    # ---- start, poll, stop -------------------------------------------------------------------

    _pinned_node: str | None = None

    async def start(self) -> str:
        _ended.pop(self.owner, None)  # an earlier attempt's exit code and output
        self._job_log = b""
        # Where the server may run, decided before anything is allocated: the nodes holding its
        # image (a refusal changes nothing when none does), and without shared_home_path the
        # node holding the user's home volume. The allocator takes cards only there.
        opts = self._start_request().options
        docker_image = self.pool.catalog.images[opts.image].docker_image
        holding = await asyncio.to_thread(self._nodes_with_image, opts.image, docker_image)
        where = set(holding)
        if not where:
            raise SpawnError(
                409,
                f"Image {opts.image!r} is unavailable: {docker_image} is not on any Swarm node "
                "that takes servers (`gpulab images --preload` copies the catalog's images to "
                "every node)",
            )
        self._image_status = await self._status_from(holding, opts.image, docker_image)
        names = ", ".join(sorted(self._node_name(n) for n in where))
        why = f"on the node(s) holding image {opts.image} ({names})"
        self._pinned_node = None
        if not self.shared_home_path:
            # The home is a volume on one node: the user's servers follow it there.
            self._pinned_node = await self._home_node()
            if self._pinned_node is not None:
                home = self._node_name(self._pinned_node)
                if self._pinned_node not in where:
                    raise SpawnError(
                        409,
                        f"Image {opts.image!r} is unavailable on node {home}, which holds your "
                        f"home volume (without a shared home, servers stay on that node); it "
                        f"is on: {names}",
                    )
                where = {self._pinned_node}
                why = f"on node {home}, which holds this server's home"
                self.log.info(
                    "%s: home volume %s is on %s; without shared_home_path the server is "
                    "pinned to that node",
                    self.owner,
                    self.home_volume_name,
                    self._node_label(self._pinned_node),
                )
        self._image_nodes = where
        self.pool.allocator.pin(self.owner, where, why)
        try:
            return await self.gpulab_start()
        finally:
            # Only this start's allocation is bound to these nodes (the next start decides
            # afresh; a spot reservation for this user is not pinned by a stale choice).
            self.pool.allocator.pin(self.owner, None)

    _image_nodes: set[str] = set()  # replaced per start, never mutated

    def _node_name(self, node_id: str) -> str:
        return (self.cluster.node(node_id) or {}).get("name", node_id[:12])

    def _nodes_with_image(
        self, slug: str, docker_image: str | None
    ) -> dict[str, ImageStatus | None]:
        """The ready, active nodes holding ``docker_image``, with what each node's engine says
        of it (blocking; through the cluster's own clients, TLS included). A node whose engine
        URL the hub lacks (SwarmCluster.node_engines) cannot be asked and counts as holding it
        (None): Swarm then fails the task with its own reason if it does not."""
        if not docker_image:
            return {}
        found: dict[str, ImageStatus | None] = {}
        unknown = []
        for node_id, info in self.cluster.nodes.items():
            if info.get("state") != "ready" or info.get("availability") != "active":
                continue
            try:
                engine = self.cluster.engine(node_id)
            except LookupError:
                unknown.append(node_id)
                found[node_id] = None
                continue
            try:
                status = image_status(engine, slug, docker_image)
            except (docker.errors.DockerException, OSError) as e:
                # An engine that does not answer holds nothing this spawn can use.
                self.log.warning("Swarm node %s: engine does not answer: %s", info["name"], e)
                continue
            if status.present:
                found[node_id] = status
        if unknown:
            self.log.warning(
                "No engine URL for Swarm node(s) %s: assuming they hold %s",
                ", ".join(sorted(self._node_name(n) for n in unknown)),
                docker_image,
            )
        return found

    async def _status_from(
        self, holding: dict[str, ImageStatus | None], slug: str, docker_image: str
    ) -> ImageStatus:
        """The image's status as one holding node reported it; where only nodes without an
        engine URL hold it, as the manager sees it."""
        known = [st for _, st in sorted(holding.items()) if st is not None]
        if known:
            return known[0]
        return await asyncio.to_thread(image_status, self.cluster.manager(), slug, docker_image)

    async def image_availability(self) -> dict[str, ImageStatus]:
        """Which catalog images some ready, active node holds (the form greys out the rest)."""
        cls = type(self)
        now = time.monotonic()
        if cls._image_cache is not None and now - cls._image_cache[0] < self.image_status_ttl:
            return cls._image_cache[1]
        statuses = {}
        for slug, image in self.pool.catalog.images.items():
            holding = await asyncio.to_thread(self._nodes_with_image, slug, image.docker_image)
            if holding:
                statuses[slug] = await self._status_from(holding, slug, image.docker_image)
            else:
                statuses[slug] = ImageStatus(
                    slug,
                    image.docker_image,
                    False,
                    reason=f"{image.docker_image} is not on any Swarm node that takes "
                    "servers; `gpulab images --preload` copies it to every node",
                )
        cls._image_cache = (now, statuses)
        return statuses

    def _container_target(self) -> tuple[Any, str]:
        """The running task's container, on its node's own engine (blocking)."""
        tasks = self.client.tasks(filters={"service": self.object_id, "desired-state": "running"})
        running = [t for t in tasks if t["Status"]["State"] == "running"]
        if not running:
            raise LookupError(f"service {self.service_name} has no running task")
        task = running[0]
        return self.cluster.engine(task["NodeID"]), task["Status"]["ContainerStatus"]["ContainerID"]

    async def poll(self) -> int | str | None:
        if not self.object_id and await self.get_object() is None:
            return 0
        try:
            tasks = await self._tasks()
        except docker.errors.NotFound:
            return 0
        if not tasks:
            return 0
        task = tasks[0]
        state, desired = task["Status"]["State"], task.get("DesiredState")
        if (state != "running" or desired != "running") and state not in STARTING:
            # About to report it stopped: read the nodes now, so that the reason (and the pool)
            # says it when its node went down or was drained. The manager shuts a dead node's
            # tasks down before the hub's next periodic read of the nodes may come.
            try:
                await asyncio.to_thread(self.cluster.refresh)
            except docker.errors.DockerException as e:
                self.log.warning("Reading the Swarm's nodes failed: %s", e)
        node = self.cluster.node(task.get("NodeID", "")) or {}
        reason = None
        # The node of the newest task placed anywhere (a replacement task may be unplaced).
        placed = next((t for t in tasks if t.get("NodeID")), task)
        where = self.cluster.node(placed.get("NodeID", "")) or {}
        if node and node.get("state") != "ready":
            reason = f"its node {node.get('name')} ({node.get('address')}) is {node.get('state')}"
        elif state != "running" and where.get("availability") == "drain":
            reason = f"its node {where.get('name')} was drained: Swarm shut its task down"
        elif len(tasks) > 1 and state != "running":
            # A server's service never restarts its task (restart condition none): a second
            # task is Swarm re-placing the slot after shutting the first down (its node was
            # drained). That is a new, empty server the constraint pins to the drained node;
            # the user's server is gone.
            old = self.cluster.node(tasks[1].get("NodeID", "")) or {}
            name = old.get("name", tasks[1].get("NodeID", "?"))
            reason = f"Swarm shut its task down on node {name} ({old.get('availability', '?')})"
        elif state in STARTING and self.allocation is not None and desired == "running":
            return None
        elif state != "running" or desired != "running":
            why = task["Status"].get("Err") or task["Status"].get("Message") or ""
            reason = f"its task is {state} (desired {desired}){': ' + why if why else ''}"
        if reason is not None and self.gpulab_job is not None:
            # JupyterHub does not call stop() for a server its poll found stopped: it clears
            # the state and drops this object. Keep the exit code and output now.
            await self._read_job_exit()
            await self.gpulab_read_log()
        if reason is not None:
            self.log.warning("Server %s of %s stopped: %s", self.service_name, self.owner, reason)
            return f"stopped: {reason}"
        if self.allocation is None:
            labels = dict((await self.get_object() or {}).get("Spec", {}).get("Labels") or {})
            cards = assigned_cards(task, self.cluster.gpu_resource)
            if cards:
                labels[L_GPUS] = ",".join(cards)
            self._claim_from_labels(labels)
        return None


async def reap_services(pool: GpuPool, cluster: SwarmCluster) -> None:
    """Remove this hub's services whose allocation no server holds any more (after each orphan
    sweep): a service of a spawn the hub died in, or of a swept record, must not keep cards."""
    client = cluster.manager()
    services = await asyncio.to_thread(client.services, filters={"label": f"{L_HUB}={pool.hub_id}"})
    allocator = pool.allocator
    live = {a.alloc_id for a in allocator.allocations} - {o.alloc_id for o in allocator.orphans()}
    for svc in services:
        labels = svc.get("Spec", {}).get("Labels") or {}
        if labels.get(L_ALLOC) in live:
            continue
        pool.log.warning(
            "Removing service %s: its allocation %s is held by no server",
            svc["Spec"].get("Name", svc["ID"]),
            labels.get(L_ALLOC),
        )
        try:
            await asyncio.to_thread(client.remove_service, svc["ID"])
        except docker.errors.APIError as e:
            pool.log.warning("Could not remove service %s: %s", svc["ID"][:12], e)
