"""The activity observer's sampling holds whatever a user's processes do to themselves, and one
server that cannot be sampled costs no other server its observation (issue 24: the observer's
cost was cut by reading each process's /proc stat once; billing rests on it, so its reading
must take any process name, and a pass must survive one bad server)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import types
import uuid
from datetime import UTC, datetime

from gpulab.hub_config.billing.observer import ActivityObserver
from gpulab.spawners.activity import Observation, Proc
from gpulab.spawners.local.sandbox import Sandbox
from gpulab.spawners.local.spawner import pid_alive
from gpulab.spawners.node import procs

# A server process whose child renames itself to bytes that are no UTF-8 (prctl PR_SET_NAME,
# what any process may do to itself; an executable with such a file name does the same).
RENAMED = r"""
import ctypes, os, sys, time
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None).prctl(15, b"\xff\xfe(x) y", 0, 0, 0)
    while time.process_time() < 0.3:
        pass
    print("renamed", flush=True)
    time.sleep(600)
    os._exit(0)
sys.stdout.write(sys.stdin.readline())
os.kill(pid, 9)
os.waitpid(pid, 0)
"""


def test_a_process_named_in_no_utf8_is_seen_with_its_cpu() -> None:
    """Issue 24 (observer cost, F1): a user's process named in bytes that are no UTF-8 made
    every read of /proc raise UnicodeDecodeError, so its server was never observed (nothing
    billed, never idle) and, without cgroups, every server's process tree listing failed."""
    alloc_id = f"t-{uuid.uuid4().hex[:8]}"
    server = subprocess.Popen(
        [sys.executable, "-c", RENAMED],
        env={**os.environ, procs.ENV_ALLOC: alloc_id},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The renamed child told us (on the shared stdout) it has its name and spent CPU.
        assert server.stdout.readline().strip() == "renamed"
        sandbox = Sandbox(alloc_id)  # no cgroup, no account: the process tree (a non-root hub)
        (child,) = sandbox.others(server.pid)
        assert child.command == "\ufffd\ufffd(x) y"
        assert procs.command_name(child.pid) == child.command
        assert sandbox.pids(server.pid) == sorted([server.pid, child.pid])
        assert procs.started_at(child.pid) == child.started
        assert pid_alive(child.pid)  # the local spawner's poll reads the same file
        key, seconds = procs.cpu_counter(child.pid)
        assert key.startswith(f"{child.pid}:") and seconds >= 0.25
        # The observer's one read per process says what the separate reads say.
        others, cpu = sandbox.sample(server.pid)
        assert others == [child]
        assert dict(cpu)[key] >= seconds
        assert {k.partition(":")[0] for k, _ in cpu} == {str(server.pid), str(child.pid)}
    finally:
        server.stdin.close()
        server.wait(timeout=10)


class Server:
    """A running server as the observer sees it; ``observe_activity`` fails if ``broken``."""

    def __init__(self, owner: str, broken: bool = False) -> None:
        self.owner, self.broken, self.orm_spawner = owner, broken, None
        self.allocation = types.SimpleNamespace(
            alloc_id=f"a-{owner}", uuids=[], created=0.0, gpu_type=None
        )

    async def observe_activity(self) -> Observation:
        if self.broken:  # what a process name that is no UTF-8 did to the sample
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        t = time.time()
        return Observation(t=t, procs=(Proc(pid=4242, started=t - 5),), cpu=None)


def test_one_server_that_cannot_be_sampled_costs_no_other_its_billing() -> None:
    """Issue 24 (observer cost, F1): a failure while sampling one server ended the whole pass,
    so billing got no observed activity for anybody on the hub while it lasted."""
    delivered: list[dict] = []

    async def hub_api(method: str, path: str, body: object) -> tuple[int, str]:
        return 200, ""

    async def report(events: list[dict]) -> None:
        delivered.extend(events)

    observer = ActivityObserver(hub_api=hub_api, notices=None, report_hook=report)
    running = [Server("mallory/", broken=True), Server("alice/"), Server("bob/")]
    asyncio.run(observer.tick(running))
    assert sorted(e["user"] for e in delivered) == ["alice", "bob"]
    assert set(observer.trackers) == {"mallory/", "alice/", "bob/"}
    assert observer.trackers["alice/"].spans and not observer.trackers["mallory/"].spans


class JobServer:
    """A job server just started: JupyterHub's ``started`` at ``t0``, billing told at ``t0 +
    0.2`` (the spawner's pre_allocate_hook), its allocation made at ``t0 + 0.3``, and the job
    runner's command, its only work, dated by the process table at ``t0 + 0.1`` (boot time in
    whole seconds plus ticks reads a little early)."""

    def __init__(self, owner: str, t0: float) -> None:
        self.owner = owner
        started = datetime.fromtimestamp(t0, UTC).replace(tzinfo=None)  # as JupyterHub keeps it
        self.orm_spawner = types.SimpleNamespace(started=started)
        self.allocation = types.SimpleNamespace(
            alloc_id=f"a-{uuid.uuid4().hex[:6]}", uuids=[], created=t0 + 0.3, gpu_type=None
        )
        self.t0 = t0

    async def observe_activity(self) -> Observation:
        return Observation(t=time.time(), procs=(Proc(pid=4343, started=self.t0 + 0.1),), cpu=None)


def test_a_job_servers_span_never_reaches_back_before_its_billing_session() -> None:
    """Issue 26 (F6): a job runner starts its command at once, and the process table can date it
    before the hub told billing the server started; the observed span began there, so billing
    placed it in the session before (a re-run of the same job-ID: clipped to it, billed 0) or in
    none (billed nowhere). The span starts no earlier than the server's allocation, which the
    spawn makes after billing heard of the session."""
    delivered: list[dict] = []

    async def hub_api(method: str, path: str, body: object) -> tuple[int, str]:
        return 200, ""

    async def report(events: list[dict]) -> None:
        delivered.extend(events)

    t0 = time.time() - 5
    job = JobServer("alice/job-17", t0)
    observer = ActivityObserver(hub_api=hub_api, notices=None, report_hook=report)
    asyncio.run(observer.tick([job]))
    (event,) = delivered
    assert event["server"] == "job-17"
    assert event["first"] == job.allocation.created, (event["first"] - t0, event)
