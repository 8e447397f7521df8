"""The allocator and ledger on their own: whole cards, no sharing, crash-safe, orphans swept."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from harness import wait_for

from gpulab.catalog import load_catalog
from gpulab.spawners.node.allocator import GpuAllocator, NoCapacity
from gpulab.spawners.node.inventory import parse_simulate_spec, simulated_devices

CATALOG = load_catalog()


def devices(spec: str = "A100-80G:2,RTX-4090:3"):
    return simulated_devices(parse_simulate_spec(spec, CATALOG), CATALOG, 0)


def test_whole_cards_by_uuid_and_release(tmp_path) -> None:
    a = GpuAllocator(devices(), tmp_path / "ledger.json")
    x = a.allocate("alice/", "a100-80g", 1)
    y = a.allocate("bob/", "a100-80g", 1)
    assert len(x.uuids) == len(y.uuids) == 1 and x.uuids != y.uuids
    assert a.counts()["a100-80g"] == {"total": 2, "free": 0, "held": 0}
    with pytest.raises(NoCapacity) as e:
        a.allocate("carol/", "a100-80g", 1)
    assert "0 of 2 free" in str(e.value) and "rtx-4090 x3" in str(e.value)
    assert e.value.free["rtx-4090"] == 3
    assert a.get("carol/") is None
    a.release("alice/")
    assert a.counts()["a100-80g"]["free"] == 1
    # Releasing with a stale allocation id does nothing (a late stop of an old server).
    assert a.release("bob/", alloc_id="not-bobs") is None
    assert a.counts()["a100-80g"]["free"] == 1


def test_multi_card_request_is_all_or_nothing(tmp_path) -> None:
    a = GpuAllocator(devices(), tmp_path / "ledger.json")
    a.allocate("alice/", "rtx-4090", 2)
    with pytest.raises(NoCapacity):
        a.allocate("bob/", "rtx-4090", 2)
    assert a.counts()["rtx-4090"]["free"] == 1


def test_many_concurrent_requests_never_share_a_card(tmp_path) -> None:
    a = GpuAllocator(devices(), tmp_path / "ledger.json")

    async def request(i: int):
        await asyncio.sleep(0)
        try:
            return a.allocate(f"user{i}/", "rtx-4090", 1)
        except NoCapacity:
            return None

    async def main():
        return await asyncio.gather(*(request(i) for i in range(50)))

    got = [x for x in asyncio.run(main()) if x is not None]
    assert len(got) == 3
    assert len({u for x in got for u in x.uuids}) == 3


def test_ledger_survives_restart(tmp_path) -> None:
    path = tmp_path / "ledger.json"
    a = GpuAllocator(devices(), path)
    x = a.allocate("alice/", "a100-80g", 2)
    a.set_pid("alice/", 4242)
    b = GpuAllocator(devices(), path)  # a new hub process reading the same ledger
    assert b.get("alice/").uuids == x.uuids and b.get("alice/").pid == 4242
    with pytest.raises(NoCapacity):
        b.allocate("bob/", "a100-80g", 1)
    assert b.orphans() == [b.get("alice/")]
    assert b.adopt("alice/", x.alloc_id) is not None
    assert b.orphans() == []
    # The file is always complete JSON (written to a temp file, then renamed).
    assert json.loads(path.read_text())["allocations"][0]["owner"] == "alice/"


def environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_orphan_sweep_kills_the_process_and_frees_the_card(tmp_path) -> None:
    path = tmp_path / "ledger.json"
    a = GpuAllocator(devices(), path)
    x = a.allocate("ghost/", "a100-80g", 1)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, "GPULAB_ALLOCATION_ID": x.alloc_id, "GPULAB_HUB_ID": "hub1"},
    )
    stray = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, "GPULAB_ALLOCATION_ID": "never-recorded", "GPULAB_HUB_ID": "hub1"},
    )
    other_hub = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, "GPULAB_ALLOCATION_ID": "x", "GPULAB_HUB_ID": "hub2"},
    )
    try:
        # Until a child has exec'd, /proc shows our environment, not the one it was given.
        for p in (proc, stray, other_hub):
            wait_for(lambda p=p: b"GPULAB_HUB_ID=" in environ(p.pid), 30, 0.01, "the exec")
        b = GpuAllocator(devices(), path)
        swept = b.sweep_orphans("hub1")
        assert [s.owner for s in swept] == ["ghost/"]
        assert proc.wait(10) == -9 and stray.wait(10) == -9
        assert other_hub.poll() is None  # another hub's server is not ours to kill
        assert b.counts()["a100-80g"]["free"] == 2
        assert GpuAllocator(devices(), path).allocations == []
    finally:
        for p in (proc, stray, other_hub):
            if p.poll() is None:
                p.kill()


def test_orphan_sweep_kills_a_recorded_pid_only_if_it_is_the_same_process(tmp_path) -> None:
    path = tmp_path / "ledger.json"
    a = GpuAllocator(devices(), path)
    a.allocate("forked/", "rtx-4090", 1)
    a.allocate("reused/", "rtx-4090", 1)
    # A forked server: no allocation id in its /proc environ, known by pid and start time.
    forked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        a.set_pid("forked/", forked.pid)
        a.set_pid("reused/", bystander.pid)
        a.get("reused/").pid_start += 1  # as if the pid had been reused by another process
        a._save()
        b = GpuAllocator(devices(), path)
        assert {s.owner for s in b.sweep_orphans("hub1")} == {"forked/", "reused/"}
        assert forked.wait(10) == -9
        assert bystander.poll() is None
        assert b.counts()["rtx-4090"]["free"] == 3
    finally:
        for p in (forked, bystander):
            if p.poll() is None:
                p.kill()


def test_reservation_holds_cards_until_used_or_expired(tmp_path) -> None:
    a = GpuAllocator(devices(), tmp_path / "ledger.json")
    a.allocate("alice/", None, 0)
    r = a.reserve("alice/", "a100-80g", 2)
    with pytest.raises(NoCapacity):
        a.allocate("bob/", "a100-80g", 1)
    got = a.allocate("alice/", "a100-80g", 2)
    assert got.uuids == r.uuids and got.expires is None
    a.release("alice/")
    a.reserve("alice/", "a100-80g", 1, ttl=-1)  # already lapsed
    assert a.allocate("bob/", "a100-80g", 2).uuids


def test_unmatched_nvml_cards_are_never_offered(tmp_path) -> None:
    from gpulab.spawners.node.inventory import GpuDevice

    odd = GpuDevice(0, "GPU-real-1", "NVIDIA H200", 141 * 1024, None, False)
    a = GpuAllocator([odd, *devices("RTX-4090:1")], tmp_path / "ledger.json")
    assert a.counts() == {"rtx-4090": {"total": 1, "free": 1, "held": 0}}
