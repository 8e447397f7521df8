"""The fair queue, decision by decision (issue 26: jobs wait for capacity in order of priority
and submission, with per-user and per-course limits; a gang is placed whole or not at all;
``gpulab jobs list`` says why each waits)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.courses import Course, CourseLimits
from gpulab.spawners.jobs import model
from gpulab.spawners.jobs.model import Job
from gpulab.spawners.jobs.queue import Decision, Free, Limits, plan, queue_order
from gpulab.spawners.jobs.spec import JobSpecError, check_course_rules, parse_job_spec

CATALOG = load_catalog().model_copy(update={"max_gpus_per_server": 8})
A100 = "a100-80g"


def job(
    id: int,
    owner: str = "alice",
    gpus: int = 1,
    *,
    gpu: str = A100,
    nodes: int = 1,
    priority: int = 0,
    at: float | None = None,
    state: str = model.QUEUED,
    **raw,
) -> Job:
    raw = {"command": "python t.py", "gpu": gpu, "nodes": nodes, "priority": priority, **raw}
    if gpu != "none":
        raw["gpus"] = gpus
    spec = parse_job_spec(raw, CATALOG, max_nodes=8, max_gpus=lambda g: 8)
    t = float(id if at is None else at)
    return Job(id=id, owner=owner, spec=spec, submitted_at=t, updated_at=t, state=state)


def on(j: Job, *nodes: str) -> Job:
    """``j`` running on ``nodes`` (one per rank), as the scheduler records it."""
    j.state = model.RUNNING
    j.attempts = [model.Attempt(n=1, started_at=j.submitted_at, servers=j.server_names())]
    j.attempts[0].nodes = list(nodes)
    return j


def free(**nodes: int | dict[str, int]) -> Free:
    return Free({n: v if isinstance(v, dict) else {A100: v} for n, v in nodes.items()})


DEFAULT_LIMITS = Limits()


# Jobs in these tests are submitted at t = their id (or ``at``): at NOW every one of them has
# waited longer than RESERVE_AFTER (the tests of that bound pass their own ``now``).
NOW = 10_000.0
RESERVE_AFTER = 900.0


def decide(
    queued, running=(), pool=None, limits=DEFAULT_LIMITS, prices=None, now=NOW
) -> dict[int, Decision]:
    out = plan(
        list(queued),
        list(running),
        pool if pool is not None else free(n1=8),
        limits,
        spot_price=lambda gpu: (prices or {}).get(gpu),
        now=now,
        reserve_after=RESERVE_AFTER,
        catalog=CATALOG,
    )
    assert [d.job_id for d in out] == [
        j.id for j in queue_order([j for j in queued if not j.cancel_requested])
    ]
    return {d.job_id: d for d in out}


def started(decisions: dict[int, Decision]) -> dict[int, tuple[str, ...]]:
    return {i: d.nodes for i, d in decisions.items() if d.start}


# ---- order --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queued", "cards", "first"),
    [
        # Same priority: first submitted first.
        ([job(1), job(2)], 1, 1),
        ([job(2, at=1.0), job(1, at=2.0)], 1, 2),
        # Same priority and time: lower id first.
        ([job(2, at=5.0), job(1, at=5.0)], 1, 1),
        # Higher priority first, whenever submitted.
        ([job(1), job(2, priority=5)], 1, 2),
        ([job(1, priority=-1), job(2)], 1, 2),
        ([job(1, priority=-10), job(2, priority=-9), job(3, priority=-10)], 1, 2),
    ],
)
def test_the_card_goes_by_priority_then_submission(queued, cards, first) -> None:
    d = decide(queued, pool=free(n1=cards))
    assert list(started(d)) == [first]
    for i, dec in d.items():
        if i != first:
            # The card went this pass: none is free; jobs waiting ahead are counted.
            assert dec.reason.startswith("waiting for 1 x A100-80G on one node (0 free")


# ---- limits -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queued", "running", "limits", "waits", "reason"),
    [
        (
            [job(9)],
            [job(i, state=model.RUNNING) for i in range(1, 5)],
            Limits(),
            9,
            "you have 4 jobs running (the limit is 4 at once)",
        ),
        (
            [job(9, gpus=2)],
            [job(1, gpus=8, state=model.RUNNING), job(2, gpus=7, state=model.STARTING)],
            Limits(),
            9,
            "your jobs hold 15 cards and this one needs 2 more (the limit is 16 cards at once)",
        ),
        (
            [job(9, gpus=8, nodes=3)],
            [],
            Limits(),
            9,
            "it needs 24 cards, more than the 16 one user may hold at once; cancel it and "
            "submit a smaller one",
        ),
        (
            [job(9, "bob", course="ml101")],
            [job(1, "carol", course="ml101", state=model.RUNNING)],
            Limits(course_max_running={"ml101": 1}),
            9,
            "course ml101 has 1 job running or first in line (its limit is 1 at once)",
        ),
        (
            [job(9, "bob", gpus=2, course="ml101")],
            [job(1, "carol", gpus=3, course="ml101", state=model.RUNNING)],
            Limits(course_max_cards={"ml101": 4}),
            9,
            "course ml101's jobs hold 3 cards and this one needs 2 more (its limit is 4 cards "
            "at once)",
        ),
        (
            [job(9, "bob", gpus=5, course="ml101")],
            [],
            Limits(course_max_cards={"ml101": 4}),
            9,
            "it needs 5 cards, more than the 4 course ml101 may hold at once",
        ),
        (
            [job(8), job(9)],
            [],
            Limits(max_running_per_user=1),
            9,
            "you have 1 job running (the limit is 1 at once)",
        ),
    ],
)
def test_limits_hold_a_job_back_and_say_which(queued, running, limits, waits, reason) -> None:
    d = decide(queued, running, pool=free(n1=8, n2=8, n3=8), limits=limits)
    assert not d[waits].start
    assert d[waits].reason == reason


def test_a_user_at_the_limit_does_not_block_anyone_else() -> None:
    running = [job(i, state=model.RUNNING) for i in range(1, 5)]
    d = decide([job(5), job(6, "bob")], running, pool=free(n1=1))
    assert started(d) == {6: ("n1",)}
    # The job over its limit held no place: the one card went to bob.


def test_a_course_limit_counts_only_that_course() -> None:
    running = [job(1, "carol", course="ml101", state=model.RUNNING)]
    limits = Limits(course_max_running={"ml101": 1})
    d = decide(
        [job(2, "bob", course="ml101"), job(3, "bob", course="cv2"), job(4, "bob")],
        running,
        limits=limits,
    )
    assert sorted(started(d)) == [3, 4]


def test_a_line_of_big_jobs_cannot_hold_the_whole_pool() -> None:
    """A user's waiting jobs that hold a place count towards their limits: alice's long line of
    8-card jobs holds at most two nodes' worth (16 cards), and bob's job still starts."""
    pool = free(n1=7, n2=7, n3=7)
    # The eighth card of each node is in carol's jobs: it comes back when they end.
    carol = [on(job(100 + i, "carol"), n) for i, n in enumerate(("n1", "n2", "n3"))]
    line = [job(i, gpus=8) for i in range(1, 6)]
    d = decide([*line, job(6, "bob", gpus=4)], carol, pool=pool)
    assert started(d) == {6: ("n3",)}
    assert d[1].reason == "waiting for 8 x A100-80G on one node (7 free)"
    assert d[2].reason == "waiting for 8 x A100-80G on one node (7 free; 1 job ahead)"
    assert d[3].reason == (
        "your jobs running or ahead need 16 cards and this one needs 8 more (the limit is 16 "
        "cards at once)"
    )
    d = decide(
        [*line, job(6, "bob", gpus=4)], carol, pool=pool, limits=Limits(max_cards_per_user=64)
    )
    assert d[5].reason == (
        "you have 0 jobs running and 4 waiting ahead of this one (the limit is 4 at once)"
    )
    assert not d[6].start  # alice's four 8-card places hold all three nodes: bob waits his turn


# ---- capacity, fairness, backfill ---------------------------------------------------------


def test_a_big_job_holds_its_place_against_small_ones_behind_it() -> None:
    """Once it has waited RESERVE_AFTER, and its fourth card is in a job (it comes back)."""
    dave = on(job(100, "dave"), "n1")
    queued = [job(1, gpus=4), job(2, "bob"), job(3, "carol")]
    d = decide(queued, [dave], pool=free(n1=3), now=1.0 + 20 * 60)
    assert started(d) == {}
    assert d[1].reason == "waiting for 4 x A100-80G on one node (3 free)"
    # What bob reads: the cards are free but kept, for how long, and by nobody named.
    assert d[2].reason == (
        "waiting for 1 x A100-80G on one node (3 free, kept for an older job that has waited "
        "20 min)"
    )
    assert d[3].reason == d[2].reason  # bob's waiting job keeps nothing: nothing was left


def test_a_small_job_backfills_where_the_big_one_does_not_wait() -> None:
    """The big job holds the node with the most free cards; a job that fits elsewhere starts."""
    d = decide([job(1, gpus=4), job(2, "bob", gpus=2)], pool=free(n1=2, n2=3))
    assert started(d) == {2: ("n1",)}
    # And a job of another type is never held up by an A100 job.
    pool = free(n1={A100: 3, "rtx-4090": 1})
    d = decide([job(1, gpus=4), job(2, "bob", gpu="rtx-4090")], pool=pool)
    assert started(d) == {2: ("n1",)}


def test_a_4_card_job_is_not_starved_by_a_stream_of_1_card_jobs() -> None:
    """Issue 26, fair queues: one 4-card node, busy with 1-card jobs that end one per tick while
    a new 1-card job is submitted every tick. The 4-card job starts as soon as the node has been
    drained (within 4 ticks), not never."""
    ends: dict[int, int] = {100 + i: i + 1 for i in range(4)}  # running job id -> tick it ends
    running = {i: job(i, f"u{i}", state=model.RUNNING) for i in ends}
    queued = {1: job(1, "big", gpus=4, at=0.5)}
    next_id = 200
    for tick in range(1, 12):
        for i in [i for i, end in ends.items() if end == tick]:
            running.pop(i)
            ends.pop(i)
        queued[next_id] = job(next_id, f"u{next_id}", at=float(tick))
        next_id += 1
        held = sum(j.spec.cards() for j in running.values())
        d = decide(list(queued.values()), list(running.values()), pool=free(n1=4 - held))
        for i in started(d):
            running[i] = queued.pop(i)
            ends[i] = tick + 3
        if 1 in running:
            break
    assert 1 in running and tick == 4, f"the 4-card job did not start by tick {tick}"


def test_best_fit_keeps_a_whole_node_whole() -> None:
    d = decide([job(1), job(2, "bob", gpus=8)], pool=free(big=8, small=1))
    assert started(d) == {1: ("small",), 2: ("big",)}


# ---- gangs --------------------------------------------------------------------------------


def test_a_gang_gets_distinct_nodes_each_with_its_cards() -> None:
    pool = free(n1=4, n2=8, n3=2, n4=4)
    d = decide([job(1, gpus=4, nodes=2)], pool=pool)
    assert started(d) == {1: ("n1", "n4")}  # best fit: the two 4s, not the 8
    d = decide([job(1, gpus=4, nodes=3)], pool=pool)
    assert started(d) == {1: ("n1", "n4", "n2")}
    assert len(set(started(d)[1])) == 3


def test_a_gang_that_cannot_be_placed_whole_starts_nowhere() -> None:
    """Issue 26: all or nothing, never a partial set holding cards."""
    pool = free(n1=4, n2=3, n3=4)
    dave = [on(job(100, "dave"), "n2")]  # n2's fourth card comes back when dave's job ends
    d = decide([job(1, gpus=4, nodes=3), job(2, "bob", gpus=3)], dave, pool=pool)
    assert not d[1].start and d[1].nodes == ()
    assert d[1].reason == "waiting for 3 nodes with 4 x A100-80G free each (2 such nodes now)"
    # It holds its place on the three nodes with the most free: bob's 3 cards must wait too.
    assert d[2].reason.startswith(
        "waiting for 3 x A100-80G on one node (4 free, kept for an older job that has waited"
    )
    d = decide([job(1, gpus=4, nodes=2), job(2, "bob", gpus=3)], dave, pool=free(n1=4, n2=3, n3=3))
    assert not d[1].start
    assert started(d) == {2: ("n3",)}


# ---- spot ---------------------------------------------------------------------------------


def test_a_spot_job_waits_while_the_price_is_above_its_bid_and_holds_nothing() -> None:
    spot = job(1, pricing="spot", max_price="2.00")
    d = decide([spot, job(2, "bob")], pool=free(n1=1), prices={A100: Decimal("3.10")})
    assert d[1].reason == (
        "the spot price of A100-80G, CNY 3.10 per card-hour, is above your bid of CNY 2.00"
    )
    assert started(d) == {2: ("n1",)}
    # At or below the bid, or with no price known, it starts like any job.
    for price in (Decimal("2.00"), Decimal("1.00"), None):
        d = decide([spot], pool=free(n1=1), prices={A100: price})
        assert started(d) == {1: ("n1",)}


# ---- the rest -----------------------------------------------------------------------------


def test_a_no_gpu_job_needs_no_cards() -> None:
    d = decide([job(1, gpu="none")], pool=free())
    assert d[1] == Decision(1, True, "starting", ())


def test_a_job_being_cancelled_gets_no_decision() -> None:
    j = job(1)
    j.cancel_requested = True
    assert decide([j, job(2)], pool=free(n1=1)) == {2: Decision(2, True, "starting on n1", ("n1",))}


def test_nothing_free_anywhere_says_so() -> None:
    d = decide([job(1, gpus=2)], pool=free())
    assert d[1].reason == "waiting for 2 x A100-80G on one node (0 free)"
    d = decide([job(1, gpus=2, nodes=2)], pool=free())
    assert d[1].reason == "waiting for 2 nodes with 2 x A100-80G free each (0 such nodes now)"


# ---- the place a waiting job keeps is bounded (issue 26, F2) ------------------------------


def test_a_fresh_job_keeps_free_cards_only_from_its_owners_later_jobs() -> None:
    """Issue 26, F2: alice's 4-card job waits for a card in dave's job. For RESERVE_AFTER
    seconds it keeps nothing from other users (bob's 1-card job starts on a free card); her
    own later jobs wait behind it from the start; once it has waited RESERVE_AFTER, bob waits
    too and reads why, without anyone named."""
    dave = [on(job(100, "dave"), "n1")]
    queued = [job(1, gpus=4, at=1000.0), job(2, "bob", at=1001.0), job(3, at=1002.0)]
    d = decide(queued, dave, pool=free(n1=3), now=1000.0 + 60)
    assert started(d) == {2: ("n1",)}
    assert d[3].reason == (
        "waiting for 1 x A100-80G on one node (2 free, kept for your job 1 ahead of this one)"
    )
    d = decide(queued, dave, pool=free(n1=3), now=1000.0 + RESERVE_AFTER)
    assert started(d) == {}
    assert d[2].reason == (
        "waiting for 1 x A100-80G on one node (3 free, kept for an older job that has waited "
        "15 min)"
    )
    assert "alice" not in d[2].reason


def test_a_job_waiting_for_cards_in_servers_keeps_nothing_from_anyone() -> None:
    """Issue 26, F2 as the attack ran it: one of the four cards is in a notebook server (not a
    job: the queue cannot stop it, it may never come back). A 4-card job that has waited for
    hours still keeps no free card from bob's 1-card job, which starts at once."""
    queued = [job(1, gpus=4, at=0.0), job(2, "bob", at=1.0)]
    d = decide(queued, pool=free(n1=3), now=6 * 3600.0)
    assert started(d) == {2: ("n1",)}
    assert d[1].reason == "waiting for 4 x A100-80G on one node (3 free)"
    # Its owner's own later job is not held back by it either: nothing is kept.
    d = decide([job(1, gpus=4, at=0.0), job(3, at=2.0)], pool=free(n1=3), now=6 * 3600.0)
    assert started(d) == {3: ("n1",)}


def test_a_job_still_starting_counts_its_cards_as_coming_back_anywhere() -> None:
    """A job just started has no node recorded yet: its cards may be on any node, so a job
    that waits for them keeps its place (no starvation while a job starts)."""
    starting = job(100, "dave", state=model.STARTING)
    queued = [job(1, gpus=4, at=0.0), job(2, "bob", at=1.0)]
    d = decide(queued, [starting], pool=free(n1=3), now=RESERVE_AFTER)
    assert started(d) == {}
    assert d[2].reason.startswith("waiting for 1 x A100-80G on one node (3 free, kept for")


# ---- the course rules at submit (issue 26, F0/F3) -----------------------------------------


def test_a_job_its_owners_courses_do_not_allow_is_refused_naming_the_field() -> None:
    """Issue 26, F0/F3: the course rules of a server start, applied at submit: a user in no
    course may not name one, a student may not name a course of which they are not a student,
    nor ask for what their course does not allow; each is a 400 naming the field."""
    ml101 = Course(name="ml101", limits=CourseLimits(gpu_types=("rtx-4090", "none")))
    cases = [
        ({"course": "nonexist"}, [], "course", "you are not a student of course 'nonexist'"),
        ({"course": "cv2"}, [ml101], "course", "you are not a student of course 'cv2'"),
        ({"course": "ml101"}, [ml101], "gpu", "course ml101 does not allow gpu type 'a100-80g'"),
    ]
    for extra, courses, field, words in cases:
        spec = job(1, **extra).spec
        with pytest.raises(JobSpecError) as e:
            check_course_rules(spec, courses, CATALOG)
        assert e.value.field == field and e.value.status == 400
        assert str(e.value).startswith(f"{field}:") and words in str(e.value), str(e.value)
    # What the course allows, or no course for a user in none, passes.
    check_course_rules(job(1, gpu="rtx-4090", course="ml101").spec, [ml101], CATALOG)
    check_course_rules(job(1, gpu="rtx-4090").spec, [ml101], CATALOG)
    check_course_rules(job(1).spec, [], CATALOG)
