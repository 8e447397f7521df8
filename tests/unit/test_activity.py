"""Observed activity spans: they start when the processes started, end at the last sample that
saw one, never reach into time nobody was seen, and survive a late or restarted observer."""

from __future__ import annotations

from gpulab.spawners.activity import ActivityTracker, Observation, Proc


def obs(t: float, *starts: float) -> Observation:
    return Observation(t=t, procs=tuple(Proc(pid=100 + i, started=s) for i, s in enumerate(starts)))


def test_a_span_starts_when_the_process_started_not_when_it_was_first_seen() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0)
    span = tr.update(obs(1007.0, 1003.5))
    assert (span.first, span.last) == (1003.5, 1007.0)
    tr.update(obs(1012.0, 1003.5))
    closed = tr.update(obs(1017.0))
    assert closed.closed and (closed.first, closed.last) == (1003.5, 1012.0)
    assert tr.observed_seconds() == 8.5


def test_a_process_older_than_the_session_counts_from_the_session_start() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0)
    assert tr.update(obs(1002.0, 900.0)).first == 1000.0


def test_a_new_span_never_overlaps_the_closed_one() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0)
    tr.update(obs(1005.0, 1001.0))
    tr.update(obs(1010.0))
    # a process that started before the previous span's last sample cannot have been there
    span = tr.update(obs(1015.0, 1004.0))
    assert span.id == "s-2" and span.first == 1005.0
    assert [s.id for s in tr.spans] == ["s-1", "s-2"]


def test_idle_time_counts_from_the_last_active_sample() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0)
    assert tr.idle_for(1600.0) == 600.0
    tr.update(obs(1010.0, 1009.0))
    tr.update(obs(1020.0))
    assert tr.idle_for(1620.0) == 610.0


def test_gpu_processes_alone_make_a_server_active() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0)
    span = tr.update(Observation(t=1010.0, procs=(), gpu_pids=(4242,)))
    assert span is not None and span.first == 1010.0


def test_the_billing_event_is_idempotent_per_extension() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0)
    a = tr.update(obs(1005.0, 1001.0)).to_event("alice", "")
    b = tr.update(obs(1010.0, 1001.0)).to_event("alice", "")
    assert a["span"] == b["span"] == "s-1"
    assert a["id"] != b["id"] and b["t"] == 1010.0 and b["first"] == 1001.0
    assert b["kind"] == "activity"
