"""The sums behind billing's metrics and the console's revenue report (``revenue``), on SQLite
and on a real PostgreSQL: they are the ledger's, to the micro-unit.

Issue 24: "revenue by type, pricing mode and course ... balances below a threshold"; the
console's "revenue per day and per user, top spenders, credits and refunds with who gave them
and why", "every number on it is the same number as in the metrics and the statement"."""

from __future__ import annotations

import time

from billing.courses import PRICES, TRIAL, course_start, feed
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from billing.scenario import eid, server_stop, session_events
from sqlalchemy import func, select

from gpulab.billing_service import courses, ledger, revenue, statements, storage
from gpulab.billing_service.metrics import thresholds_of
from gpulab.billing_service.models import MICRO, Account, CourseLedgerEntry, LedgerEntry

THRESHOLDS = thresholds_of(PRICES.catalog.billing.low_balance_thresholds)


def run_a_day(engine, tag: str) -> tuple[dict[str, str], str]:
    """Usage of every kind, charged now: an A100 session, a no-GPU one, a course session half
    paid by its pool, a home above the free size; a top-up, a refund, a debit and a
    compensation, each with who and why. The users' names and the course's (unique per run)."""
    now = time.time()
    names = {k: f"{k}-{tag}" for k in ("alice", "bob", "carol")}
    alice, bob, carol = names.values()
    course = f"c{tag}"
    with engine.begin() as conn:
        current = courses.Settings.of(courses.get(conn, course))
        courses.put_settings(
            conn, course, courses.parse_settings({"cap": "0.10"}, current), 0, "teacher"
        )
        ledger.credit(conn, ledger.pool(course), "topup", 50 * MICRO, f"p-{tag}", 0, actor="ops")
    feed(engine, session_events(alice, now - 3000, [(1, 1201)], stop_at=1300))
    feed(engine, session_events(bob, now - 3000, [(1, 1801)], gpu="none", stop_at=1900))
    feed(
        engine,
        [
            course_start(carol, now - 3000, course),
            *[
                e
                for e in session_events(carol, now - 3000, [(1, 600)])
                if e["kind"] != "server_start"
            ],
            server_stop(carol, now - 3000 + 700),
        ],
    )
    st = PRICES.catalog.storage
    with engine.begin() as conn:
        for t in (now - 7200, now - 3600):
            m = storage.Measurement(alice, int(t * MICRO), 0, st.free_bytes + 2**30, 0)
            storage.record(conn, st, m, int(time.time() * MICRO), TRIAL)
        t_us = int(time.time() * MICRO)
        ledger.credit(conn, alice, "topup", 5 * MICRO, f"t-{tag}", t_us, note="bank", actor="ops")
        ledger.credit(conn, bob, "adjustment", -MICRO, f"d-{tag}", t_us, note="dup", actor="ops")
        ledger.credit(conn, bob, "adjustment", 2 * MICRO, f"r-{tag}", t_us, note="out", actor="o2")
        ledger.post(
            conn, alice, "compensation", 300_000, t_us, key=f"c-{tag}", note="spot", actor="hub"
        )
    return names, course


def ledger_charged(conn) -> int:
    """What both books charged: sessions (users' and pools' charges) and storage."""
    own = conn.execute(
        select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
            LedgerEntry.kind.in_(("charge", storage.KIND))
        )
    ).scalar()
    pool = conn.execute(
        select(func.coalesce(func.sum(CourseLedgerEntry.amount_micro), 0)).where(
            CourseLedgerEntry.kind == "charge"
        )
    ).scalar()
    return -int(own) - int(pool)


def test_metrics_sums_are_the_ledgers(engine) -> None:
    """Revenue by (type, pricing, course) adds up to every charge both books posted; each
    session's series is the statements' amount; credits by kind are the entries given (a debit
    is none); balances below each threshold are the accounts' balances."""
    names, course = run_a_day(engine, eid()[:8])
    alice, _, carol = names.values()
    with engine.connect() as conn:
        before = revenue.totals(conn, THRESHOLDS)
        # Only this test's rows are new on the module's shared SQLite file: compare the deltas.
        assert sum(before.revenue.values()) == ledger_charged(conn)
        now_us = time.time_ns() // 1000
        amounts = {}
        for user in names.values():
            usage = statements.usage(conn, PRICES, user, 0, now_us + 1)
            amounts[user] = usage
        carol_session = amounts[carol]["servers"][0]
        assert carol_session["paid_by"]["course"]["micro"] == 100_000  # the cap: 0.10
        # The course's own series: this session alone (a course name of this run).
        assert before.revenue[("a100-80g", "on_demand", course)] == carol_session["amount"]["micro"]
        assert (
            before.revenue[("storage", "storage", "")]
            >= amounts[alice]["storage"]["total"]["micro"]
            > 0
        )
        assert before.credits["refund"] >= 2 * MICRO and before.credits["credit"] >= 55 * MICRO
        assert before.credits["compensation"] >= 300_000
        balances = [b for (b,) in conn.execute(select(Account.balance_micro)).all()]
        assert before.accounts == len(balances)
        for label, micro in THRESHOLDS:
            assert before.below[label] == sum(b < micro for b in balances)
        assert before.open_sessions == 0 and before.newest_us is None


def test_the_report_is_the_statements(engine) -> None:
    """The console's report: today's revenue by type, each user's total (the statement's
    session amounts plus storage), the top spenders, and every credit with who and why."""
    names, _ = run_a_day(engine, eid()[:8])
    alice, bob, carol = names.values()
    now_us = time.time_ns() // 1000
    with engine.connect() as conn:
        report = revenue.report(conn, "CNY", now_us, 1)
        (today,) = report["days"]
        by_user = {u["user"]: u["total"]["micro"] for u in report["by_user"]}
        for user in names.values():
            usage = statements.usage(conn, PRICES, user, 0, now_us + 1)
            expected = usage["total"]["amount"]["micro"] + usage["storage"]["total"]["micro"]
            assert by_user[user] == expected, user
        carol_row = next(u for u in report["by_user"] if u["user"] == carol)
        assert carol_row["paid_by_course"]["micro"] == 100_000
        assert (
            today["total"]["micro"]
            == sum(a["micro"] for a in today["by_type"].values())
            == report["total"]["micro"]
        )
        assert today["by_type"]["storage"]["micro"] >= by_user[alice] - next(
            s["amount"]["micro"]
            for s in statements.usage(conn, PRICES, alice, 0, now_us + 1)["servers"]
        )
        top = [u["user"] for u in report["top"]]
        assert top == sorted(by_user, key=lambda u: (-by_user[u], u))[:10]
        mine = {
            (c["account"], c["kind"], c["amount"]["micro"], c["by"], c["reason"])
            for c in report["credits"]
            if c["account"].split(":", 1)[1] in names.values()
        }
        assert mine == {
            (f"user:{alice}", "credit", 5 * MICRO, "ops", "bank"),
            (f"user:{bob}", "debit", -MICRO, "ops", "dup"),
            (f"user:{bob}", "refund", 2 * MICRO, "o2", "out"),
            (f"user:{alice}", "compensation", 300_000, "hub", "spot"),
        }
        # Newest first.
        whens = [c["when"] for c in report["credits"]]
        assert whens == sorted(whens, reverse=True)


def test_each_ledger_entry_is_summed_once_as_time_goes_by(engine) -> None:
    """The metrics keep the sums of settled entries and add only newer ones at each read
    (``revenue.Settled``): read after read, as charges and credits keep arriving over an
    hour, the kept-and-added sums equal the ledger summed afresh."""
    start_us = time.time_ns() // 1000
    settled = None
    for i in range(7):
        now_us = start_us + i * 10 * 60 * MICRO
        user = f"s{i}-{eid()[:8]}"
        t = time.time()
        feed(engine, session_events(user, t - 600, [(1, 300)], stop_at=400), now_us=now_us)
        with engine.begin() as conn:
            ledger.credit(conn, user, "topup", (i + 1) * MICRO, eid(), now_us, actor="ops")
        with engine.connect() as conn:
            kept = revenue.totals(conn, THRESHOLDS, settled, now_us + 1)
            fresh = revenue.totals(conn, THRESHOLDS, None, now_us + 1)
        assert kept.revenue == fresh.revenue and kept.credits == fresh.credits, i
        assert kept.settled.until_us == fresh.settled.until_us == now_us + 1 - revenue.SETTLE_US
        assert sum(kept.revenue.values()) == with_ledger(engine)
        settled = kept.settled
    # An hour on, most of it is settled: the sums kept cover every entry but the last quarter.
    assert settled is not None and settled.revenue and settled.credits["credit"] > 0


def with_ledger(engine) -> int:
    with engine.connect() as conn:
        return ledger_charged(conn)


def test_the_report_reads_each_past_day_once(engine) -> None:
    """The console's report keeps the figures of days that are over (``revenue.Day``): opened
    again, it gives the same money as read afresh, and today is always read afresh."""
    now_us = time.time_ns() // 1000
    day = revenue.US_PER_DAY
    for back in (3, 1, 0):
        user = f"d{back}-{eid()[:8]}"
        t = time.time()
        feed(
            engine,
            session_events(user, t - 600, [(1, 300)], stop_at=400),
            now_us=now_us - back * day,
        )
    cache: dict[int, revenue.Day] = {}
    with engine.connect() as conn:
        fresh = revenue.report(conn, "CNY", now_us, 5)
        first = revenue.report(conn, "CNY", now_us, 5, cache)
        again = revenue.report(conn, "CNY", now_us, 5, cache)
    assert fresh == first == again
    today = now_us // day
    assert set(cache) <= set(range(today - 4, today)) and today - 3 in cache
    assert [d["total"]["micro"] > 0 for d in fresh["days"]] == [False, True, False, True, True]
