"""Compensation for work lost to a platform reclaim: the rule, the credit, once per key."""

from __future__ import annotations

import csv
import io
import time
import uuid

import pytest
from billing.scenario import app, heartbeat, kernel, server_start, server_stop

from gpulab.billing_service import ledger, statements
from gpulab.billing_service.compensation import Rule, compensate, find_session
from gpulab.billing_service.csv_export import render
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import PriceBook
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import load_catalog

PRICES = PriceBook(load_catalog())
T0 = 1_780_000_000.0


def test_rules_parse_or_say_what_is_allowed() -> None:
    assert Rule.parse("last-minutes:10") == Rule(minutes=10.0)
    assert Rule.parse("fixed:1.50") == Rule(fixed_micro=1_500_000)
    for bad in ("", "last-minutes:0", "last-minutes:x", "fixed:-1", "fixed:0.0000001", "all"):
        with pytest.raises(ValueError, match="last-minutes:N"):
            Rule.parse(bad)


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path / 'billing.sqlite'}")
    upgrade(eng)
    yield eng
    eng.dispose()


def test_compensation_credits_the_last_minutes_once(engine) -> None:
    user = f"c{uuid.uuid4().hex[:8]}"
    # A kernel ran 30 minutes (0-1800 s) on an A100 (2.10/h); the server was reclaimed at 1800 s.
    events = [server_start(user, T0), kernel("kernel_start", user, "k1", T0)]
    events += [heartbeat(user, T0 + t, ["k1"]) for t in range(60, 1801, 60)]
    events.append(server_stop(user, T0 + 1800))
    ingest(engine, parse_batch({"events": events}, time.time()), PRICES, 10 * MICRO, 0)
    rule = Rule.parse("last-minutes:10")
    with engine.begin() as conn:
        sess = find_session(conn, user, "", None)
        entry, created = compensate(
            conn,
            PRICES,
            rule,
            sess,
            reason="spot-preemption",
            checkpoint="failed",
            key="k-1",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
    assert created and entry.kind == "compensation" and entry.session_id == sess.id
    assert entry.amount_micro == 350_000  # 10 minutes of 2.10/h
    assert "spot-preemption, checkpoint failed" in entry.note
    with engine.begin() as conn:
        again, created = compensate(
            conn,
            PRICES,
            rule,
            sess,
            reason="spot-preemption",
            checkpoint="failed",
            key="k-1",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
        assert not created and again.id == entry.id
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)
        usage = statements.usage(conn, PRICES, user, 0, round((T0 + 3600) * MICRO))
    assert usage["compensation"]["micro"] == 350_000
    (s,) = usage["servers"]
    assert [c["amount"]["micro"] for c in s["compensations"]] == [350_000]
    rows = list(csv.DictReader(io.StringIO(render(usage))))
    (comp,) = [r for r in rows if r["row"] == "compensation"]
    assert comp["amount_CNY"] == "-0.35" and "spot-preemption" in comp["note"]
    # Another session's key cannot be reused.
    other = f"o{uuid.uuid4().hex[:8]}"
    ingest(engine, parse_batch({"events": [server_start(other, T0)]}, time.time()), PRICES, 0, 0)
    with pytest.raises(ledger.IdempotencyConflict), engine.begin() as conn:
        compensate(
            conn,
            PRICES,
            rule,
            find_session(conn, other, "", None),
            reason="node-failure",
            checkpoint="timeout",
            key="k-1",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )


def _course_session(engine, user: str, course: str, cap: str) -> None:
    """``course`` with 3.00 in its pool and ``cap`` per student; ``user`` ran an A100 for one
    hour under it (1.50 at the education price), the server reclaimed at its end."""
    from billing.courses import course_start, feed

    from gpulab.billing_service import courses

    with engine.begin() as conn:
        current = courses.Settings.of(courses.get(conn, course))
        settings = courses.parse_settings({"cap": cap}, current)
        courses.put_settings(conn, course, settings, 0, "teacher")
        ledger.credit(
            conn, ledger.pool(course), "topup", 3 * MICRO, uuid.uuid4().hex, 0, actor="admin"
        )
    t0 = 1_780_272_000.0  # a Monday 00:00 UTC: the hour lies in one week
    events = [course_start(user, t0, course), kernel("kernel_start", user, "k1", t0)]
    events += [heartbeat(user, t0 + t, ["k1"]) for t in range(60, 3601, 60)]
    events.append(server_stop(user, t0 + 3600))
    feed(engine, events)


@pytest.mark.parametrize(
    ("cap", "pool_paid", "own_paid"),
    [("100", 1_500_000, 0), ("1.00", 1_000_000, 500_000)],
    ids=["pool-paid-all", "pool-paid-up-to-the-cap"],
)
def test_a_course_sessions_compensation_goes_back_to_whoever_paid(
    engine, cap, pool_paid, own_paid
) -> None:
    """Attack 06: a student's course session (paid by the pool) is compensated; the credit must
    not turn pool money into the student's own. The pool gets back its share, the student only
    what their own balance paid."""
    from gpulab.billing_service import courses

    user, course = f"s{uuid.uuid4().hex[:8]}", f"c{uuid.uuid4().hex[:8]}"
    _course_session(engine, user, course, cap)
    with engine.begin() as conn:
        sess = find_session(conn, user, "", None)
        assert courses.paid_by(conn, [sess.id])[sess.id] == (pool_paid, own_paid)
        pool_before = ledger.balance(conn, ledger.pool(course))
        own_before = ledger.balance(conn, user)
        entry, created = compensate(
            conn,
            PRICES,
            Rule.parse("last-minutes:60"),  # the whole hour: 1.50
            sess,
            reason="spot-preemption",
            checkpoint="cut-short",
            key="k-course",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
        assert created and entry.amount_micro == own_paid
        assert ledger.balance(conn, ledger.pool(course)) == pool_before + pool_paid
        assert ledger.balance(conn, user) == own_before + own_paid
        assert ledger.balance(conn, ledger.pool(course)) == ledger.recompute_balance(
            conn, ledger.pool(course)
        )
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)
        # A replay credits nobody again.
        _, created = compensate(
            conn,
            PRICES,
            Rule.parse("last-minutes:60"),
            sess,
            reason="spot-preemption",
            checkpoint="cut-short",
            key="k-course",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
        assert not created
        assert ledger.balance(conn, ledger.pool(course)) == pool_before + pool_paid
        assert ledger.balance(conn, user) == own_before + own_paid


@pytest.mark.parametrize("notebooks", [False, True], ids=["app-only", "kernel-ran"])
def test_a_failed_launch_is_credited_only_if_no_notebook_ran(engine, notebooks) -> None:
    """Attack wave F1 (issue 22): a user stalled their own app (its readiness answer is theirs)
    and ran a kernel on the card for the 5.5 minutes the hub waited; the failed launch was then
    credited whole: free GPU time. A launch-failed credit now covers a session in which only
    the app ran; a session whose server ran kernels is credited nothing, and says why."""
    user = f"l{uuid.uuid4().hex[:8]}"
    events = [server_start(user, T0), app("app_start", user, "r1", T0)]
    if notebooks:
        events.append(kernel("kernel_start", user, "k1", T0 + 10))
    events += [
        heartbeat(user, T0 + t, ["k1"] if notebooks else [], apps=["r1"])
        for t in range(30, 331, 30)
    ]
    events.append(server_stop(user, T0 + 330))
    ingest(engine, parse_batch({"events": events}, time.time()), PRICES, 10 * MICRO, 0)
    with engine.begin() as conn:
        sess = find_session(conn, user, "", None)
        entry, created = compensate(
            conn,
            PRICES,
            Rule.parse("last-minutes:1"),
            sess,
            reason="launch-failed",
            checkpoint="not-run",
            key=f"launch-failed-{user}",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
    assert created
    if notebooks:
        assert entry.amount_micro == 0 and "notebooks ran" in entry.note
    else:
        # The whole session (330 s of an A100 at 2.10/h), not the operator's last minute.
        assert entry.amount_micro == 192_500
