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


def cpu_obs(t: float, cpu: dict[str, float], *starts: float) -> Observation:
    return Observation(
        t=t,
        procs=tuple(Proc(pid=100 + i, started=s) for i, s in enumerate(starts)),
        cpu=tuple(cpu.items()),
    )


def test_an_open_kernel_using_no_cpu_is_idle_though_its_process_is_billed() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0, cpu_threshold=0.05)
    tr.update(cpu_obs(1002.0, {"1:1": 3.0, "2:5": 1.0}, 1001.0))
    for t in range(1004, 1100, 2):
        span = tr.update(cpu_obs(float(t), {"1:1": 3.0 + (t - 1002) * 0.002, "2:5": 1.0}, 1001.0))
        assert not tr.working
    # Present (a kernel process) is still billed; idle (no work) since the first sample, the
    # only one without a CPU baseline (where a process counts as work).
    assert span is not None and (span.first, span.last) == (1001.0, 1098.0)
    assert tr.idle_for(1100.0) == 98.0


def test_a_busy_silent_loop_is_work_and_a_counter_never_goes_backwards() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0, cpu_threshold=0.05)
    tr.update(cpu_obs(1002.0, {"1:1": 3.0, "2:5": 1.0}, 1001.0))
    tr.update(cpu_obs(1004.0, {"1:1": 3.0, "2:5": 3.0}, 1001.0))
    assert tr.working and tr.idle_for(1010.0) == 6.0
    # The busy process exits: what it had consumed is not counted again, nor negatively.
    tr.update(cpu_obs(1006.0, {"1:1": 3.0}))
    assert not tr.working


def test_work_inside_the_server_process_alone_is_observed_and_billed() -> None:
    """No process besides the server itself: its own CPU (an extension burning it) is work,
    billed from the sample before the one that saw it."""
    tr = ActivityTracker(session="s", session_start=1000.0, cpu_threshold=0.05)
    assert tr.update(cpu_obs(1002.0, {"cgroup": 5.0})) is None
    span = tr.update(cpu_obs(1004.0, {"cgroup": 6.9}))
    assert tr.working and span is not None and (span.first, span.last) == (1002.0, 1004.0)
    tr.update(cpu_obs(1006.0, {"cgroup": 8.9}))
    closed = tr.update(cpu_obs(1008.0, {"cgroup": 8.91}))
    assert closed.closed and tr.observed_seconds() == 4.0


def test_a_process_that_started_since_the_last_sample_counts_whole() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0, cpu_threshold=0.05)
    tr.update(cpu_obs(1002.0, {"1:1": 3.0}))
    tr.update(cpu_obs(1004.0, {"1:1": 3.0, "7:300": 1.5}, 1003.0))
    assert tr.working


def test_without_a_cpu_measure_any_process_is_work_as_before() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0)
    tr.update(obs(1002.0, 1001.0))
    assert tr.working and tr.idle_for(1003.0) == 1.0


def test_a_hub_restart_never_reclaims_a_server_on_its_first_sample() -> None:
    """A tracker that begins mid-session has no CPU baseline: whatever ran before it is not
    counted as idle, and its first sample does not count as idle either."""
    tr = ActivityTracker(session="s", session_start=1000.0, cpu_threshold=0.05)
    tr.update(cpu_obs(5000.0, {"cgroup": 900.0}))  # no other process: only the server's own work
    assert tr.idle_for(5000.0) == 0.0
    tr.update(cpu_obs(5002.0, {"cgroup": 902.0}))
    assert tr.working and tr.idle_for(5010.0) == 8.0


def test_a_server_holding_cards_is_billed_for_every_second_it_holds_them() -> None:
    """Attack 04: rare CPU bursts kept a card while billing only the bursts. With cards, the
    span runs from when they were taken to the last sample before the stop, whatever runs;
    the idle verdict (what gives the card back) is unchanged."""
    tr = ActivityTracker(
        session="s", session_start=1000.0, cpu_threshold=0.05, holds_cards=True, cards_since=1001.0
    )
    span = tr.update(cpu_obs(1004.0, {"cgroup": 5.0}))  # no process, no work: still billed
    assert span is not None and (span.first, span.last) == (1001.0, 1004.0)
    for t in range(1006, 1300, 2):
        burst = 3.0 if t >= 1200 else 0.0  # a 3-second burst, at t = 1200
        tr.update(cpu_obs(float(t), {"cgroup": 5.0 + burst}))
    assert not tr.working and len(tr.spans) == 1 and not tr.spans[0].closed
    assert tr.idle_for(1400.0) == 1400.0 - 1200.0  # the last burst, at t = 1200
    closed = tr.close()
    assert closed.closed and (closed.first, closed.last) == (1001.0, 1298.0)
    assert tr.observed_seconds() == 297.0


def test_cards_taken_before_the_session_count_from_the_first_sample() -> None:
    tr = ActivityTracker(session="s", session_start=1000.0, holds_cards=True)
    span = tr.update(obs(1005.0))
    assert span is not None and (span.first, span.last) == (1005.0, 1005.0)
    # without cards, the same sample opens nothing
    assert ActivityTracker(session="t", session_start=1000.0).update(obs(1005.0)) is None
