"""Jobs as recorded: server names, the API's view, and the durable store (issue 26: a job is
kept across hub restarts, its status and attempts shown; ids never reused; files root's own)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading

import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.jobs import model
from gpulab.spawners.jobs.model import Attempt, Job, job_server_name, parse_server_name
from gpulab.spawners.jobs.spec import parse_job_spec
from gpulab.spawners.jobs.store import JobStore

CATALOG = load_catalog()


def spec(**raw):
    raw.setdefault("command", "python train.py")
    return parse_job_spec(raw, CATALOG, max_nodes=8, max_gpus=lambda gpu: 4)


# ---- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("job-17", (17, None)),
        ("job-17-0", (17, 0)),
        ("job-17-1", (17, 1)),
        ("job-1", (1, None)),
        ("job-", None),
        ("job-0", None),
        ("job-017", None),
        ("job-17-01", None),
        ("job-17-", None),
        ("job-x", None),
        ("job-17-1-2", None),
        ("Job-17", None),
        ("job-17\n", None),
        ("lab", None),
        ("", None),
    ],
)
def test_server_names_read_back_exactly(name: str, parsed) -> None:
    assert parse_server_name(name) == parsed
    if parsed is not None:
        assert job_server_name(*parsed) == name


def test_a_job_names_one_server_per_node() -> None:
    one = Job(id=5, owner="alice", spec=spec(gpu="rtx-4090"), submitted_at=1.0, updated_at=1.0)
    gang = Job(
        id=6, owner="alice", spec=spec(gpu="rtx-4090", nodes=3), submitted_at=1.0, updated_at=1.0
    )
    assert one.server_names() == ["job-5"]
    assert gang.server_names() == ["job-6-0", "job-6-1", "job-6-2"]
    assert model.JOB_SERVER_PREFIX == "job-"


def test_the_api_view_shows_state_attempts_times_and_resume() -> None:
    """Issue 26: attempts, lost work and the time to resume are recorded and shown."""
    job = Job(
        id=3,
        owner="alice",
        spec=spec(gpu="rtx-4090", gpus=2, pricing="spot", max_price="0.5"),
        submitted_at=1_800_000_000.0,
        updated_at=1_800_000_100.0,
        state=model.RUNNING,
    )
    job.attempts.append(
        Attempt(
            n=1,
            started_at=1_800_000_010.0,
            running_at=1_800_000_012.0,
            ended_at=1_800_000_900.0,
            end=model.PREEMPTED,
            servers=["job-3"],
            lost_seconds=120.0,
        )
    )
    job.attempts.append(
        Attempt(
            n=2,
            started_at=1_800_001_000.0,
            card_free_at=1_800_000_990.0,
            running_at=1_800_001_030.0,
            servers=["job-3"],
            resumed_from="/home/alice/.gpulab/jobs/3/checkpoints/step-20.pt",
        )
    )
    api = job.to_api()
    json.dumps(api)  # JSON as it is
    assert (api["id"], api["owner"], api["state"], api["gpus"], api["cards"]) == (
        3,
        "alice",
        "running",
        2,
        2,
    )
    assert api["max_price"] == "0.5" and api["pricing"] == "spot"
    assert api["submitted_at"] == "2027-01-15T08:00:00Z"
    assert api["started_at"] == "2027-01-15T08:00:10Z" and api["ended_at"] is None
    assert api["attempt_count"] == 2 and api["lost_seconds"] == 120.0
    assert api["attempts"][0]["end"] == "preempted"
    assert api["attempts"][1]["resume_seconds"] == 40.0
    assert api["attempts"][1]["card_free_at"] == "2027-01-15T08:16:30Z"
    assert api["servers"] == ["job-3"]


def test_a_job_survives_its_json() -> None:
    job = Job(id=9, owner="bob", spec=spec(), submitted_at=1.5, updated_at=2.5)
    job.attempts.append(Attempt(n=1, started_at=2.0, servers=["job-9"], nodes=["n1"]))
    job.checkpoints.append(3.0)
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job


# ---- the store -----------------------------------------------------------------------------


def test_submit_save_get_list_and_restart(tmp_path) -> None:
    """Issue 26: a job needs no running server: it is on disk, and a restarted hub has it."""
    store = JobStore(tmp_path)
    a = store.submit("alice", spec())
    b = store.submit("bob", spec(gpu="rtx-4090"))
    assert (a.id, b.id, a.state) == (1, 2, model.QUEUED)
    a.state, a.reason = model.RUNNING, ""
    a.attempts.append(Attempt(n=1, started_at=a.submitted_at, servers=a.server_names()))
    store.save(a)
    assert store.get(1).state == model.RUNNING
    assert [j.id for j in store.list(owner="bob")] == [2]
    assert [j.id for j in store.list(states=[model.QUEUED])] == [2]
    again = JobStore(tmp_path)
    assert again.get(1) == store.get(1) and again.get(2) == store.get(2)
    assert again.get(3) is None
    assert again.submit("carol", spec()).id == 3


def test_what_get_returns_changes_only_when_saved(tmp_path) -> None:
    store = JobStore(tmp_path)
    job = store.submit("alice", spec())
    got = store.get(job.id)
    got.state = model.CANCELLED
    got.attempts.append(Attempt(n=1, started_at=1.0))
    assert store.get(job.id).state == model.QUEUED and store.get(job.id).attempts == []


def test_save_refuses_an_unknown_job_or_a_changed_owner(tmp_path) -> None:
    store = JobStore(tmp_path)
    job = store.submit("alice", spec())
    with pytest.raises(KeyError):
        store.save(Job(id=99, owner="alice", spec=spec(), submitted_at=1.0, updated_at=1.0))
    job.owner = "mallory"
    with pytest.raises(ValueError, match="belongs to"):
        store.save(job)
    assert store.get(job.id).owner == "alice"


def test_files_are_root_only(tmp_path) -> None:
    store = JobStore(tmp_path)
    store.submit("alice", spec())
    assert stat.S_IMODE((tmp_path / "jobs").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "jobs" / "jobs.jsonl").stat().st_mode) == 0o600
    logs = store.log_dir(1)
    assert logs == tmp_path / "jobs" / "1" and stat.S_IMODE(logs.stat().st_mode) == 0o700
    assert (tmp_path / "jobs" / "jobs.jsonl").stat().st_uid == os.geteuid()
    for bad in (0, -1, True, "1/../x"):
        with pytest.raises(ValueError):
            store.log_dir(bad)  # type: ignore[arg-type]


def test_one_store_per_data_dir(tmp_path) -> None:
    assert JobStore.instance(tmp_path) is JobStore.instance(str(tmp_path / "."))
    assert JobStore.instance(tmp_path) is not JobStore.instance(tmp_path / "other")


def test_threads_submitting_at_once_get_distinct_ids_and_none_is_lost(tmp_path) -> None:
    store = JobStore(tmp_path)
    got: list[int] = []
    start = threading.Barrier(8)

    def submit(owner: str) -> None:
        start.wait()
        for _ in range(25):
            job = store.submit(owner, spec())
            job.reason = f"seen by {owner}"
            store.save(job)
            got.append(job.id)

    threads = [threading.Thread(target=submit, args=(f"u{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 201))
    again = JobStore(tmp_path)
    assert [j.id for j in again.list()] == list(range(1, 201))
    assert all(j.reason == f"seen by {j.owner}" for j in again.list())


def test_a_torn_last_line_is_skipped_and_the_next_version_lands(tmp_path) -> None:
    """A SIGKILL mid-append leaves half a line: the jobs before it load, the next write lands
    on a line of its own, and a second restart still reads everything."""
    store = JobStore(tmp_path)
    store.submit("alice", spec())
    job = store.submit("alice", spec())
    path = tmp_path / "jobs" / "jobs.jsonl"
    whole = json.dumps({**job.to_json(), "state": "running"}).encode()
    with open(path, "ab") as f:
        f.write(whole[: len(whole) // 2])
    again = JobStore(tmp_path)
    assert [j.id for j in again.list()] == [1, 2]
    assert again.get(2).state == model.QUEUED  # the torn version never returned to a caller
    third = again.submit("bob", spec())
    assert third.id == 3
    last = JobStore(tmp_path)
    assert [j.id for j in last.list()] == [1, 2, 3] and last.get(3).owner == "bob"
    assert all(json.loads(line) for line in path.read_bytes().splitlines())


WRITER = """
import sys
from gpulab.catalog import load_catalog
from gpulab.spawners.jobs.spec import parse_job_spec
from gpulab.spawners.jobs.store import JobStore
store = JobStore(sys.argv[1])
s = parse_job_spec({"command": "x" * 4000}, load_catalog(), max_nodes=1, max_gpus=lambda g: 1)
while True:
    job = store.submit("alice", s)
    print(job.id, flush=True)
"""


def test_a_writer_killed_mid_stream_loses_no_acknowledged_job(tmp_path) -> None:
    """A real SIGKILL of a process appending jobs: every id it was told is on disk, and the
    store that opens the file next goes on from there."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        acknowledged = [int(proc.stdout.readline()) for _ in range(30)]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    store = JobStore(tmp_path)
    ids = [j.id for j in store.list()]
    assert set(acknowledged) <= set(ids) and ids == list(range(1, len(ids) + 1))
    assert store.submit("bob", spec()).id == len(ids) + 1
    assert JobStore(tmp_path).get(len(ids) + 1).owner == "bob"


def test_old_versions_are_compacted_at_load_without_losing_a_job(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(JobStore, "compact_after", 5)
    store = JobStore(tmp_path)
    for owner in ("alice", "bob"):
        job = store.submit(owner, spec())
        for n in range(10):
            job.reason = f"pass {n}"
            store.save(job)
    path = tmp_path / "jobs" / "jobs.jsonl"
    assert len(path.read_bytes().splitlines()) == 22
    again = JobStore(tmp_path)
    assert len(path.read_bytes().splitlines()) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [(j.id, j.reason) for j in again.list()] == [(1, "pass 9"), (2, "pass 9")]
    assert again.submit("carol", spec()).id == 3
    assert [j.id for j in JobStore(tmp_path).list()] == [1, 2, 3]
