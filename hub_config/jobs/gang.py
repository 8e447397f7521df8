"""A training job over several nodes, started as a gang: every rank or none (issue 26).

The job scheduler (:mod:`.scheduler`) calls :func:`start_gang` for a job of ``nodes > 1`` and
:func:`end_gang` once every rank's server of the attempt has stopped. A gang runs on the Swarm
spawner (``gpulab-swarm``) with shared homes (``GpuSwarmSpawner.shared_home_path``): its ranks
write and resume one checkpoint folder in the user's one home, whichever nodes they land on.

- **All or nothing.** The cards of every rank are allocated together
  (:meth:`GpuAllocator.allocate_gang`: distinct nodes, each with the job's cards, one ledger
  write, nothing held when the gang cannot be placed whole). Each rank's server adopts its
  allocation (the ``alloc_id`` of its :class:`JobLaunch`). A rank the hub refuses to start stops
  the ranks already asked for and frees every rank's cards before :class:`GangNotStarted` tells
  the scheduler to requeue (or fail) the job: a partial set never holds cards.
- **The job's own network.** An overlay network ``gpulab-job-<id>`` (not attachable: only the
  services the hub creates for that job join it) carries the ranks' traffic; each rank's
  service is on it under its server name (``job-<id>-<rank>``), so ``MASTER_ADDR`` is rank 0's
  name on that network and ``MASTER_PORT`` 29500, which ``torchrun`` reads (the runner also sets
  ``WORLD_SIZE``, ``NODE_RANK`` and torchrun's ``PET_*``). No other user's server can reach it.
  The network is removed when the attempt ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpulab.catalog import card_type
from gpulab.spawners.jobs.launch import withdraw
from gpulab.spawners.jobs.model import Attempt, Job, job_server_name
from gpulab.spawners.node.allocator import NoCapacity, owner_key
from gpulab.spawners.node.holds import accounts_for

MASTER_PORT = "29500"
NETWORK_PREFIX = "gpulab-job-"
L_JOB = "org.gpulab.job"
L_HUB = "org.gpulab.hub-id"


class GangNotStarted(Exception):
    """The gang did not start and holds nothing; ``requeue``: try again later (no capacity, a
    refusal that may pass), else the job fails with ``reason``."""

    def __init__(self, reason: str, requeue: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.requeue = requeue


def gang_network_name(job_id: int) -> str:
    return f"{NETWORK_PREFIX}{job_id}"


def rank_keys(job: Job) -> list[str]:
    """The owner keys ("user/job-17-0", ...) of the job's ranks, in rank order."""
    return [owner_key(job.owner, job_server_name(job.id, r)) for r in range(job.spec.nodes)]


def _cluster(sched: Any) -> Any:
    """The hub's Swarm (None when the hub runs another spawner)."""
    from gpulab.spawners.swarm.cluster import SwarmCluster

    return SwarmCluster.instance() if SwarmCluster.initialized() else None


def _shared_homes(sched: Any) -> bool:
    section = sched.config.get("GpuSwarmSpawner", {})
    return bool(section.get("shared_home_path", ""))


def why_not_gang(sched: Any) -> str | None:
    """Why this hub cannot run jobs over several nodes (None: it can)."""
    if _cluster(sched) is None:
        return "nodes: jobs over several nodes need the Swarm spawner (gpulab up --spawner swarm)"
    if not _shared_homes(sched):
        return (
            "nodes: jobs over several nodes need shared homes on the Swarm "
            "(GpuSwarmSpawner.shared_home_path), so that every rank sees the job's checkpoints"
        )
    return None


def _create_network(cluster: Any, name: str, job: Job, hub_id: str) -> None:
    """The job's overlay network, fresh (a leftover of a killed hub is replaced; blocking)."""
    client = cluster.manager()
    for old in client.networks(names=[name]):
        if old.get("Name") == name:
            _remove_network_now(client, old["Id"])
    client.create_network(
        name,
        driver="overlay",
        attachable=False,
        check_duplicate=True,
        labels={L_HUB: hub_id, L_JOB: str(job.id), "org.gpulab.user": job.owner},
    )


def _remove_network_now(client: Any, ident: str) -> None:
    import docker

    try:
        client.remove_network(ident)
    except docker.errors.NotFound:
        pass


def _remove_network(cluster: Any, name: str, timeout: float = 30.0) -> bool:
    """Remove the network once Swarm has detached the stopped services' tasks (blocking)."""
    import docker

    client = cluster.manager()
    deadline = time.monotonic() + timeout
    while True:
        found = [n for n in client.networks(names=[name]) if n.get("Name") == name]
        if not found:
            return True
        try:
            client.remove_network(found[0]["Id"])
            return True
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError:
            # "network has active endpoints": tasks still being removed.
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


async def start_gang(sched: Any, job: Job, attempt: Attempt, decision: Any) -> None:
    """Allocate every rank's cards, create the job's network, file each rank's launch and ask
    the hub to start every rank's server (see the module docstring). Raises
    :class:`GangNotStarted` after undoing everything it did."""
    why = why_not_gang(sched)
    if why is not None:
        raise GangNotStarted(why, requeue=False)
    spec = job.spec
    pool = sched.pool
    keys = rank_keys(job)
    gpu_type = card_type(spec.gpu)
    if gpu_type is None or spec.gpus < 1:
        raise GangNotStarted("gpu: a job over several nodes needs cards on each node", False)
    try:
        allocs = pool.allocator.allocate_gang(
            keys,
            gpu_type,
            spec.gpus,
            pricing=spec.pricing,
            accounts=accounts_for(job.owner, spec.course),
            nodes=list(getattr(decision, "nodes", ()) or ()) or None,
        )
    except NoCapacity as e:
        raise GangNotStarted(e.human, requeue=True) from None
    except ValueError as e:
        raise GangNotStarted(f"gpus: {e}", requeue=False) from None
    network = gang_network_name(job.id)
    cluster = _cluster(sched)
    attempt.nodes = [
        (cluster.node(pool.allocator.node_of(a) or "") or {}).get("name", "") for a in allocs
    ]
    started: list[int] = []
    try:
        await asyncio.to_thread(_create_network, cluster, network, job, pool.hub_id)
        env = {"MASTER_ADDR": job_server_name(job.id, 0), "MASTER_PORT": MASTER_PORT}
        for rank, alloc in enumerate(allocs):
            # Filed under the rank's owner key by the scheduler (spawners/jobs/launch.py).
            sched.make_launch(
                job, attempt, rank, env=dict(env), alloc_id=alloc.alloc_id, network=network
            )
        for rank in range(len(allocs)):
            code, body = await sched.start_rank(job, rank)
            if not 200 <= code < 300:
                # 402 (balance), 409 (a refusal that may pass), 5xx: try again later; 400: the
                # job's own options are wrong and will stay so.
                raise GangNotStarted(
                    f"rank {rank} of {len(allocs)} was not started: {_answer(body)}",
                    requeue=code != 400,
                )
            started.append(rank)
    except BaseException as e:
        await _undo(sched, job, started, network)
        if isinstance(e, GangNotStarted):
            raise
        if isinstance(e, asyncio.CancelledError):
            raise
        raise GangNotStarted(f"the gang could not be started: {e}", requeue=True) from e


def _answer(body: str) -> str:
    import json

    try:
        return str(json.loads(body).get("message") or body)
    except (ValueError, AttributeError):
        return body[:500]


async def _undo(sched: Any, job: Job, started: list[int], network: str) -> None:
    """Stop the ranks already asked for, free every rank's cards, remove the network."""
    for rank in started:
        try:
            await sched.stop_rank(job, rank)
        except Exception as e:  # keep undoing: the cards below are freed regardless
            sched.log.warning("Job %s: stopping rank %s failed: %s", job.id, rank, e)
    _release(sched, job)
    cluster = _cluster(sched)
    if cluster is not None:
        await asyncio.to_thread(_remove_network, cluster, network)


def _release(sched: Any, job: Job) -> None:
    for key in rank_keys(job):
        withdraw(key)
        alloc = sched.pool.allocator.get(key)
        if alloc is not None:
            sched.pool.allocator.release(key, alloc.alloc_id)


async def end_gang(sched: Any, job: Job, attempt: Attempt) -> None:
    """After every rank's server of ``attempt`` stopped: the network goes, and any rank's cards
    still recorded (a rank whose server never started) are freed."""
    _release(sched, job)
    cluster = _cluster(sched)
    if cluster is None:
        return
    network = gang_network_name(job.id)
    if not await asyncio.to_thread(_remove_network, cluster, network):
        sched.log.warning("Job %s: network %s still has endpoints; left for later", job.id, network)
