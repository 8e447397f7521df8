"""A local server's cgroup on this machine's real cgroup tree: processes cannot leave it, a stop
kills every one of them however they detached, and its pids limit holds."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from conftest import require

from gpulab.spawners.local.cgroup import Cgroups, Limits, parse_memory


@pytest.fixture
def group():
    tree = Cgroups.detect(parent="gpulab-test")
    require(tree is not None, "root and a writable cgroup tree (cgroups for local servers)")
    g = tree.group(f"t-{uuid.uuid4().hex[:8]}")
    yield g
    g.kill_all()
    g.remove()


def start_in(group, code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        preexec_fn=lambda: group.join(0),
        stdout=subprocess.PIPE,
        text=True,
    )


DETACH = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for k in list(os.environ):
            del os.environ[k]
        time.sleep(600)
    os._exit(0)
print(os.getpid(), flush=True)
time.sleep(600)
"""


def test_a_detached_grandchild_stays_in_the_group_and_dies_with_it(group) -> None:
    group.create(Limits(pids=64))
    proc = start_in(group, DETACH)
    proc.stdout.readline()
    # the server, and its setsid'd grandchild (its middle parent exited)
    for _ in range(200):
        if len(group.pids()) >= 2:
            break
        os.sched_yield()
        proc.poll()
    members = group.pids()
    assert proc.pid in members and len(members) >= 2
    assert group.kill_all() >= 2
    assert group.pids() == []
    assert proc.wait(timeout=10) == -9
    for pid in members:
        assert (
            not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
        )


def test_the_pids_limit_stops_a_fork_bomb(group) -> None:
    group.create(Limits(pids=16))
    proc = start_in(
        group,
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(100):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(600)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('refused after', n, e.errno, flush=True)\n"
        "time.sleep(600)\n",
    )
    line = proc.stdout.readline()
    assert line.startswith("refused after"), line
    assert int(line.split()[2]) < 16
    group.kill_all()
    proc.wait(timeout=10)


def test_a_cpu_quota_holds_a_busy_loop_to_its_share() -> None:
    """Issue 25 (attack wave F3): a no-server transfer's cgroup (``Limits.cpu``, the cpu
    controller asked of :meth:`Cgroups.detect`) holds what it runs to its share of a core: a busy
    loop under a fifth of a core gets about that much CPU in its wall time."""
    tree = Cgroups.detect(parent="gpulab-test-cpu", controllers=("cpu",))
    require(tree is not None, "root and a writable cgroup tree (cgroups for local servers)")
    g = tree.group(f"t-{uuid.uuid4().hex[:8]}")
    try:
        g.create(Limits(pids=16, cpu=0.2))
        proc = start_in(
            g,
            "import time\n"
            "end = time.monotonic() + 1.5\n"
            "while time.monotonic() < end:\n"
            "    pass\n"
            "print(time.process_time(), flush=True)\n",
        )
        used = float(proc.stdout.readline())
        assert proc.wait(timeout=30) == 0
        assert 0.05 < used < 0.5, used  # unlimited: about 1.5 s
    finally:
        g.kill_all()
        g.remove()


def test_memory_notation() -> None:
    assert parse_memory("16G") == 16 << 30
    assert parse_memory("512M") == 512 << 20
    assert parse_memory(None) is None
    assert parse_memory(1024) == 1024
