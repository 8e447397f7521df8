"""Helpers for the course-money tests: course sessions and an audit of who paid what."""

from __future__ import annotations

import time
from types import SimpleNamespace

from sqlalchemy import func, select

from billing.scenario import server_start
from gpulab.billing_service import ledger
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import (
    CourseCharge,
    CourseLedgerEntry,
    LedgerEntry,
    ServerSession,
)
from gpulab.billing_service.rating import PriceBook
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import load_catalog

PRICES = PriceBook(load_catalog())
TRIAL = 10_000_000


def course_start(
    user: str,
    t: float,
    course: str | None,
    gpu: str = "a100-80g",
    gpus: int = 1,
    server: str = "",
    pricing: str = "on-demand",
):
    """The hub's server_start of a server of ``course`` (its spawn option ``course``)."""
    ev = server_start(user, t, gpu, gpus, server)
    ev["pricing"] = pricing
    ev["options"] = {**ev["options"], "course": course, "pricing": pricing}
    return ev


def feed(engine, events: list[dict], prices: PriceBook = PRICES, now_us: int | None = None):
    """Events as the hub and admins post them (trusted: no reporter bounds)."""
    now = time.time_ns() // 1000 if now_us is None else now_us
    result = ingest(engine, parse_batch({"events": events}, time.time()), prices, TRIAL, now)
    assert not result.rejected
    return result


def paid(engine, user: str, course: str | None = None) -> tuple[int, int]:
    """(paid by course pools, paid by the user) over all of ``user``'s sessions."""
    with engine.connect() as conn:
        q = select(
            func.coalesce(func.sum(CourseCharge.course_micro), 0),
            func.coalesce(func.sum(CourseCharge.personal_micro), 0),
        ).where(CourseCharge.user == user)
        if course is not None:
            q = q.where(CourseCharge.course == course)
        c, p = conn.execute(q).one()
    return int(c), int(p)


def audit(engine, course: str, users: list[str]) -> None:
    """Money is neither lost nor counted twice: every balance is the sum of its ledger, every
    course session's charge is split exactly once, and each side's share is in its ledger."""
    with engine.connect() as conn:
        pool_id = ledger.pool(course)
        assert (ledger.balance(conn, pool_id) or 0) == ledger.recompute_balance(conn, pool_id)
        for user in users:
            assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)
        for sess in conn.execute(select(ServerSession).where(ServerSession.user.in_(users))).all():
            rows = conn.execute(
                select(CourseCharge).where(CourseCharge.session_id == sess.id)
            ).all()
            personal_charged = -int(
                conn.execute(
                    select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
                        LedgerEntry.session_id == sess.id, LedgerEntry.kind == "charge"
                    )
                ).scalar()
            )
            pool_charged = -int(
                conn.execute(
                    select(func.coalesce(func.sum(CourseLedgerEntry.amount_micro), 0)).where(
                        CourseLedgerEntry.session_id == sess.id
                    )
                ).scalar()
            )
            if sess.course is None:
                assert not rows and pool_charged == 0
                assert personal_charged == sess.charged_micro
                continue
            assert all(r.course_micro + r.personal_micro == r.amount_micro for r in rows)
            assert all(r.course_micro >= 0 and r.personal_micro >= 0 for r in rows)
            assert sum(r.amount_micro for r in rows) == sess.charged_micro
            assert sum(r.course_micro for r in rows) == pool_charged
            assert sum(r.personal_micro for r in rows) == personal_charged


def enforcer_app(engine, **settings):
    """What billing's :class:`Enforcer` reads of the service: its store, prices and settings
    (defaults as the service's, ``settings`` overriding them)."""
    return SimpleNamespace(
        **{
            "engine": engine,
            "prices": PRICES,
            "heartbeat_interval": 10.0,
            "busy_window": 60.0,
            "switch_margin": 60.0,
            "zero_balance_action": "no-gpu",
            "start_minutes": 10.0,
            "idle_timeout": 900.0,
            "silent_timeout": 0,
            "started_us": 0,
            **settings,
        }
    )


def pool(engine, course: str) -> int:
    """A course's pool balance (micro)."""
    with engine.connect() as conn:
        return ledger.balance(conn, ledger.pool(course)) or 0


def balance(engine, user: str) -> int:
    """A user's balance (micro)."""
    with engine.connect() as conn:
        return ledger.balance(conn, user)
