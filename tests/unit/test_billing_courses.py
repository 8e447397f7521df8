"""Course money on the store (real SQLite and a real PostgreSQL): education prices, the pool
paying first up to the student's cap per period, the rest personal, and money never lost or
counted twice (re-ingestion, concurrent batches, a billing process SIGKILLed mid-way)."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from billing.courses import (
    PRICES,
    TRIAL,
    audit,
    balance,
    course_start,
    enforcer_app,
    feed,
    paid,
    pool,
)
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from billing.scenario import heartbeat, kernel, server_stop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from gpulab.billing_service import courses, ledger, statements
from gpulab.billing_service.csv_export import render
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.enforce import Enforcer
from gpulab.billing_service.models import MICRO, Course, CourseCharge, ServerSession

# Monday 2026-06-01 00:00 UTC: a week boundary.
MONDAY = datetime(2026, 6, 1, tzinfo=UTC).timestamp()
A100_EDU = 1_500_000  # catalog education price of a100-80g per card-hour (on-demand 2.10)


def name(prefix: str = "u") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def course_name() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


def setup_course(engine, course: str, pool: str = "100", **settings) -> None:
    with engine.begin() as conn:
        current = courses.Settings.of(courses.get(conn, course))
        body = {"cap": "1.00", **settings}
        courses.put_settings(conn, course, courses.parse_settings(body, current), 0, "teacher")
        if pool != "0":
            ledger.credit(
                conn,
                ledger.pool(course),
                "topup",
                int(Decimal(pool) * MICRO),
                uuid.uuid4().hex,
                0,
                actor="admin",
            )


def run_kernel(user: str, course: str | None, t0: float, seconds: float, **kw) -> list[dict]:
    """A course server with one kernel alive from t0 for ``seconds`` (heartbeats each 60 s)."""
    server = kw.pop("server", "")
    kid = f"k-{uuid.uuid4().hex[:6]}"
    out = [
        course_start(user, t0, course, server=server, **kw),
        kernel("kernel_start", user, kid, t0, server),
    ]
    t = 60.0
    while t < seconds:
        out.append(heartbeat(user, t0 + t, [kid], server))
        t += 60.0
    out.append(kernel("kernel_stop", user, kid, t0 + seconds, server))
    out.append(server_stop(user, t0 + seconds, server))
    return out


def test_week_starts_on_monday_utc() -> None:
    assert datetime.fromtimestamp(MONDAY, UTC).weekday() == 0
    monday = round(MONDAY * MICRO)
    assert courses.week_start(monday) == monday
    assert courses.week_start(monday - 1) == monday - 7 * 86_400 * MICRO
    assert courses.week_start(monday + 6 * 86_400 * MICRO) == monday


def test_course_sessions_are_rated_at_the_education_price(engine) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, cap="100")
    feed(engine, run_kernel(user, course, MONDAY + 3600, 3600))
    # The same hour outside the course: on-demand; a spot course session: spot rules (no price
    # history here: the on-demand price, as for any spot session).
    feed(engine, run_kernel(user, None, MONDAY + 3 * 3600, 3600, server="plain"))
    feed(engine, run_kernel(user, course, MONDAY + 5 * 3600, 3600, server="s", pricing="spot"))
    with engine.connect() as conn:
        charged = {
            (s.server, s.pricing): s.charged_micro
            for s in conn.execute(select(ServerSession).where(ServerSession.user == user))
        }
        u = statements.usage(conn, PRICES, user, 0, round((MONDAY + 86_400) * MICRO))
    assert charged == {
        ("", "on-demand"): A100_EDU,
        ("plain", "on-demand"): 2_100_000,
        ("s", "spot"): 2_100_000,
    }
    rows = {s["server"]: s for s in u["servers"]}
    assert (
        rows[""]["price_per_hour"] == "1.5"
        and rows[""]["rates"][0]["price_per_card_hour"] == "1.50"
    )
    assert rows[""]["course"] == course and rows["plain"]["course"] is None
    # No-GPU mode has its own education price (0.05/h against 0.09/h).
    feed(engine, run_kernel(user, course, MONDAY + 7 * 3600, 3600, server="cpu", gpu="none"))
    with engine.connect() as conn:
        (cpu,) = conn.execute(
            select(ServerSession.charged_micro).where(
                ServerSession.user == user, ServerSession.server == "cpu"
            )
        ).scalars()
    assert cpu == 50_000
    audit(engine, course, [user])


def test_the_pool_pays_first_up_to_the_cap_then_the_student(engine) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, pool="3.00", cap="1.00")
    feed(engine, run_kernel(user, course, MONDAY + 3600, 3600))  # 1.50 at the education price
    assert paid(engine, user) == (1_000_000, 500_000)
    assert pool(engine, course) == 2_000_000
    assert balance(engine, user) == TRIAL - 500_000
    # The statement says who paid, in JSON and CSV.
    with engine.connect() as conn:
        u = statements.usage(conn, PRICES, user, 0, round((MONDAY + 86_400) * MICRO))
    (s,) = u["servers"]
    assert s["paid_by"] == {
        "course": statements.money(1_000_000),
        "personal": statements.money(500_000),
    }
    assert u["paid_by"]["course"]["micro"] == 1_000_000
    (row,) = [r for r in csv.DictReader(io.StringIO(render(u))) if r["row"] == "server"]
    assert (row["course"], row["paid_by_course"], row["paid_by_personal"]) == (course, "1", "0.5")
    assert row["amount_CNY"] == "1.5"
    audit(engine, course, [user])


def test_the_pool_never_pays_more_than_it_holds(engine) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, pool="0.30", cap="1.00")
    feed(engine, run_kernel(user, course, MONDAY + 3600, 3600))
    assert paid(engine, user) == (300_000, 1_200_000)
    assert pool(engine, course) == 0
    audit(engine, course, [user])


def test_the_cap_is_per_week_and_seconds_count_in_the_week_they_fall_in(engine) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, cap="0.50")
    # 23:30 Sunday to 00:30 Monday: 0.75 in each week at 1.50/h.
    feed(engine, run_kernel(user, course, MONDAY - 1800, 3600))
    with engine.connect() as conn:
        sunday = courses.used(conn, course, user, round((MONDAY - 7 * 86_400) * MICRO))
        monday = courses.used(conn, course, user, round(MONDAY * MICRO))
    assert (sunday, monday) == (500_000, 500_000)
    assert paid(engine, user) == (1_000_000, 500_000)
    # Later the same week: the cap is used up, all personal; the next week starts afresh.
    feed(engine, run_kernel(user, course, MONDAY + 86_400, 600, server="b"))
    assert paid(engine, user) == (1_000_000, 750_000)
    feed(engine, run_kernel(user, course, MONDAY + 7 * 86_400, 600, server="c"))
    assert paid(engine, user) == (1_250_000, 750_000)
    audit(engine, course, [user])


def test_the_cap_per_term_and_time_outside_the_term(engine) -> None:
    user, course = name(), course_name()
    setup_course(
        engine, course, cap="1.00", period="term", term_start="2026-06-01", term_end="2026-06-30"
    )
    # 30 minutes before the term starts and 30 inside it: the first half is the student's.
    feed(engine, run_kernel(user, course, MONDAY - 1800, 3600))
    assert paid(engine, user) == (750_000, 750_000)
    # Two weeks later, still the same term: only 0.25 of the cap is left.
    feed(engine, run_kernel(user, course, MONDAY + 14 * 86_400, 3600, server="b"))
    assert paid(engine, user) == (1_000_000, 2_000_000)
    # The last day of the term counts (term_end is inclusive); the day after does not.
    last = datetime(2026, 6, 30, 23, 0, tzinfo=UTC).timestamp()
    with engine.connect() as conn:
        st = courses.student_status(conn, course, user, round(last * MICRO))
        assert st.period is not None and st.cap_left_micro == 0
        after = courses.student_status(conn, course, user, round((last + 3600) * MICRO))
        assert after.period is None and after.available_micro == 0
    audit(engine, course, [user])


def test_a_changed_session_is_refunded_to_who_paid_last(engine) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, cap="1.00")
    events = run_kernel(user, course, MONDAY + 3600, 3600)
    stop = events.pop()  # the server_stop
    feed(engine, events)
    assert paid(engine, user) == (1_000_000, 500_000)
    # The hub's stop report says the server stopped after 30 minutes: 0.75 in all, and the
    # student's share goes back first.
    feed(engine, [{**stop, "t": MONDAY + 3600 + 1800}])
    assert paid(engine, user) == (750_000, 0)
    assert balance(engine, user) == TRIAL
    audit(engine, course, [user])


def test_reingesting_and_reordering_change_nothing(engine) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, cap="1.00")
    events = run_kernel(user, course, MONDAY + 3600, 3600)
    feed(engine, events)
    before = (paid(engine, user), pool(engine, course), balance(engine, user))
    feed(engine, events)
    feed(engine, list(reversed(events)))
    for ev in events:
        feed(engine, [ev])
    assert (paid(engine, user), pool(engine, course), balance(engine, user)) == before
    # The same events in another order for another student give the same split.
    other = name()
    renamed = [{**e, "user": other, "id": f"{other}:{e['id']}"} for e in reversed(events)]
    for i in range(0, len(renamed), 3):
        feed(engine, renamed[i : i + 3])
    assert paid(engine, other) == before[0]
    audit(engine, course, [user, other])


def test_a_user_named_like_the_pool_gets_nothing_of_it(engine) -> None:
    course = course_name()
    attacker = f"course:{course}"
    setup_course(engine, course, pool="50.00", cap="10.00")
    # The attacker runs servers (one claiming the course in options the hub never sent is
    # impossible: reporters cannot send server_start) and gets an account of their own.
    feed(engine, run_kernel(attacker, None, MONDAY + 3600, 3600))
    with engine.begin() as conn:
        ledger.ensure(conn, course, 0, trial_micro=TRIAL)  # a user named like the course, too
        # An admin's top-up of the user "course:COURSE" goes to that user, not the pool.
        ledger.credit(conn, attacker, "topup", 5 * MICRO, uuid.uuid4().hex, 0, trial_micro=TRIAL)
    assert balance(engine, attacker) == TRIAL - 2_100_000 + 5 * MICRO
    assert balance(engine, course) == TRIAL
    assert pool(engine, course) == 50 * MICRO
    with engine.connect() as conn:
        # The pool is in its own table: no account row carries it.
        assert conn.execute(select(Course.balance_micro).where(Course.name == course)).scalar()
        assert ledger.balance(conn, f"course:{course}") != 50 * MICRO
    audit(engine, course, [attacker])


def test_a_course_name_that_is_not_one_is_no_course(engine) -> None:
    user = name()
    feed(engine, run_kernel(user, "ML 101; drop", MONDAY + 3600, 3600))
    with engine.connect() as conn:
        (s,) = conn.execute(select(ServerSession).where(ServerSession.user == user)).all()
    assert s.course is None and s.charged_micro == 2_100_000


def test_pool_topups_are_idempotent(engine) -> None:
    course, key = course_name(), uuid.uuid4().hex
    with engine.begin() as conn:
        entry, created = ledger.credit(conn, ledger.pool(course), "topup", 5 * MICRO, key, 0)
    assert created
    with engine.begin() as conn:
        again, created = ledger.credit(conn, ledger.pool(course), "topup", 5 * MICRO, key, 0)
    assert not created and again.id == entry.id
    with pytest.raises(ledger.IdempotencyConflict), engine.begin() as conn:
        ledger.credit(conn, ledger.pool(course), "topup", 7 * MICRO, key, 0)
    with pytest.raises(ledger.IdempotencyConflict), engine.begin() as conn:
        ledger.credit(conn, ledger.pool(course_name()), "topup", 5 * MICRO, key, 0)
    assert pool(engine, course) == 5 * MICRO
    audit(engine, course, [])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cap": "-1"}, "cap"),
        ({"cap": "lots"}, "cap"),
        ({"cap": 1.5}, "cap"),
        ({"cap": "0.0000001"}, "cap"),
        ({"period": "month"}, "period"),
        ({"overflow": "free"}, "overflow"),
        ({"period": "term"}, "term_start"),
        ({"period": "term", "term_start": "2026-09-01"}, "term_end"),
        ({"period": "term", "term_start": "2026-09-01", "term_end": "2026-08-01"}, "term_end"),
        ({"term_start": "1 Sept"}, "term_start"),
        ({"colour": "red"}, "colour"),
        ([], "body"),
    ],
)
def test_bad_settings_name_the_field(body, field) -> None:
    with pytest.raises(courses.SettingsError) as e:
        courses.parse_settings(body, courses.Settings())
    assert e.value.field == field
    if field in ("period", "overflow"):
        assert "allowed" in str(e.value)


@pytest.mark.parametrize("overflow", ["refuse", "personal"])
def test_the_enforcer_stops_refusing_courses_at_the_cap(engine, overflow) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, cap="0.50", overflow=overflow)
    now = time.time()
    kid = "k"
    # A server running for 30 minutes up to now: 0.75, 0.25 beyond the cap.
    events = [course_start(user, now - 1800, course), kernel("kernel_start", user, kid, now - 1800)]
    events.append(heartbeat(user, now - 1, [kid]))
    feed(engine, events)
    assert paid(engine, user)[0] == 500_000
    decisions = Enforcer(enforcer_app(engine)).decide()
    mine = [(a, r) for a, s, r in decisions if s.user == user]
    if overflow == "refuse":
        assert mine == [("stop", f"course {course}: the cap per student is used up")]
    else:
        assert mine == []  # the student's own balance pays on
    audit(engine, course, [user])


def concurrent_batches(engine, user: str, course: str, servers: int, rounds: int) -> None:
    errors: list[BaseException] = []
    t0 = MONDAY + 3600

    def run(server: str) -> None:
        try:
            feed(engine, [course_start(user, t0, course, server=server)])
            for i in range(rounds):
                feed(engine, [heartbeat(user, t0 + 60 * (i + 1), ["k"], server)])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f"s{i}",)) for i in range(servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_concurrent_servers_of_one_student_never_pass_the_cap(engine) -> None:
    user, course = name(), course_name()
    setup_course(engine, course, cap="0.40")
    # Three servers, each heartbeat batch 60 s more of an A100 at 1.50/h (0.025): 12 rounds
    # (the first heartbeat starts the span) make 660 s, 0.275 per server, 0.825 in all, of which
    # the pool pays exactly the cap.
    concurrent_batches(engine, user, course, servers=3, rounds=12)
    assert paid(engine, user) == (400_000, 425_000)
    assert pool(engine, course) == 100 * MICRO - 400_000
    audit(engine, course, [user])


def test_concurrent_topups_and_course_charges_on_postgresql(pg_url) -> None:  # noqa: F811
    engine = make_engine(pg_url)
    upgrade(engine)
    course, user = course_name(), name()
    setup_course(engine, course, pool="0", cap="5.00")
    keys = [uuid.uuid4().hex for _ in range(30)]
    errors: list[BaseException] = []

    def topups(part):
        try:
            for key in part:
                with engine.begin() as conn:
                    ledger.credit(conn, ledger.pool(course), "topup", 20_000, key, 0)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=topups, args=(keys[i::3] * 2,)) for i in range(3)]
    threads.append(threading.Thread(target=concurrent_batches, args=(engine, user, course, 2, 10)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    c, p = paid(engine, user)
    assert c + p == 2 * 225_000  # 540 s per server at 1.50/h
    assert pool(engine, course) == 30 * 20_000 - c >= 0
    audit(engine, course, [user])


KILLER = """
import sys, time, json
sys.path.insert(0, {tests!r})
from billing.courses import feed
from gpulab.billing_service.db import make_engine
engine = make_engine({url!r})
events = json.load(open({path!r}))
for i in range(0, len(events), 2):
    feed(engine, events[i : i + 2])
    print(i, flush=True)
"""


def test_billing_killed_mid_way_loses_and_doubles_nothing(engine, tmp_path: Path) -> None:
    """A billing process SIGKILLed while it ingests a student's course usage: what it committed
    is consistent, and delivering everything again (the reporters' retries) ends exactly where an
    uninterrupted run does."""
    import json

    user, ref, course = name(), name(), course_name()
    setup_course(engine, course, cap="0.60")
    events: list[dict] = []
    for i in range(3):
        events += run_kernel(user, course, MONDAY + 3600 * (i + 1), 1500, server=f"s{i}")
    path = tmp_path / "events.json"
    path.write_text(json.dumps(events))
    url = engine.url.render_as_string(hide_password=False)
    script = KILLER.format(tests=str(Path(__file__).parents[1]), url=url, path=str(path))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert proc.stdout is not None
    for _ in range(len(events) // 4):  # part of the way through, mid-transaction or not
        proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    audit(engine, course, [user])
    # The retries: every event again, in one batch and then one by one.
    feed(engine, events)
    for ev in events:
        feed(engine, [ev])
    feed(engine, [{**e, "user": ref, "id": f"{ref}:{e['id']}"} for e in events])
    assert paid(engine, user) == paid(engine, ref)
    c, p = paid(engine, user)
    assert c == 600_000 and c + p == 3 * 625_000  # 25 minutes at 1.50/h, three times
    audit(engine, course, [user, ref])


def test_settings_put_keeps_the_pool(engine) -> None:
    course = course_name()
    setup_course(engine, course, pool="7.00", cap="2.00")
    with engine.begin() as conn:
        current = courses.Settings.of(courses.get(conn, course))
        new = courses.parse_settings({"overflow": "refuse"}, current)
        courses.put_settings(conn, course, new, 0, "t")
    with engine.connect() as conn:
        st = courses.Settings.of(courses.get(conn, course))
    assert (st.cap_micro, st.overflow, st.period) == (2 * MICRO, "refuse", "week")
    assert pool(engine, course) == 7 * MICRO


sessions_strategy = st.lists(
    st.tuples(
        st.integers(-3 * 86_400, 9 * 86_400),  # start, around two week boundaries
        st.integers(60, 2 * 86_400),  # length
        st.sampled_from(["a100-80g", "rtx-4090", "none"]),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    spans=sessions_strategy,
    cap=st.integers(0, 3_000_000),
    pool_micro=st.integers(0, 5_000_000),
    seed=st.integers(),
)
def test_generated_usage_never_passes_the_cap_nor_loses_money(
    sqlite_engine, spans, cap, pool_micro, seed
) -> None:
    import random

    user, course = name(), course_name()
    with sqlite_engine.begin() as conn:
        courses.put_settings(conn, course, courses.Settings(cap_micro=cap), 0, "t")
        if pool_micro:
            ledger.credit(conn, ledger.pool(course), "topup", pool_micro, uuid.uuid4().hex, 0)
    events: list[dict] = []
    for i, (start, length, gpu) in enumerate(spans):
        events += run_kernel(user, course, MONDAY + start, length, server=f"s{i}", gpu=gpu)
    rng = random.Random(seed)
    rng.shuffle(events)
    for i in range(0, len(events), 7):
        feed(sqlite_engine, events[i : i + 7])
    feed(sqlite_engine, events)  # delivered again: nothing changes
    audit(sqlite_engine, course, [user])
    with sqlite_engine.connect() as conn:
        per_period: dict[int, int] = {}
        for r in conn.execute(select(CourseCharge).where(CourseCharge.user == user)).all():
            per_period[r.period_start_us] = per_period.get(r.period_start_us, 0) + r.course_micro
            assert (
                r.period_start_us == courses.OUTSIDE
                or courses.week_start(r.period_start_us) == r.period_start_us
            )
        charged = sum(
            conn.execute(
                select(ServerSession.charged_micro).where(ServerSession.user == user)
            ).scalars()
        )
    assert all(v <= cap for v in per_period.values())
    c, p = paid(sqlite_engine, user)
    assert c + p == charged and c <= pool_micro
    assert pool(sqlite_engine, course) == pool_micro - c
    # The pool pays as much as it may: up to the cap of each week, up to what it held.
    assert c == pool_micro or all(
        v == cap or v == total for (v, total) in _week_totals(sqlite_engine, user).values()
    )


def _week_totals(engine, user: str) -> dict[int, tuple[int, int]]:
    with engine.connect() as conn:
        out: dict[int, tuple[int, int]] = {}
        for r in conn.execute(select(CourseCharge).where(CourseCharge.user == user)).all():
            c, a = out.get(r.period_start_us, (0, 0))
            out[r.period_start_us] = (c + r.course_micro, a + r.amount_micro)
        return out
