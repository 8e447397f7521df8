"""The operator's money: what billing earned (by GPU type, pricing mode and course; per day and
per user) and every credit it gave (by whom and why), read from the one ledger.

Two readers share these sums, so that every number is the same wherever it is shown:
billing's Prometheus metrics (``metrics``: ``totals``, all time, cached for a few seconds per
scrape) and the admin revenue API the hub's console fetches (``report``, a window of days).

What counts as revenue is what the statements charge:

- a session's charges (``server_sessions.charged_micro``: the sum of its ``charge`` entries in
  the user's and the course pool's books, the same figure the statement's ``amount`` shows),
  labelled with its GPU type (``none`` for no-GPU), pricing (``on_demand``, ``spot``) and course
  (``""`` for none);
- prepaid reservations (``pricing="reservation"``, the course of a pool's reservation);
- storage above the free size (ledger kind ``storage``, ``type="storage"``, ``pricing="storage"``).

Credits, by the metrics' ``kind``: ``trial`` (the trial credit), ``credit`` (top-ups),
``refund`` (positive adjustments: an operator gives money back), ``compensation`` (work a
platform reclaim lost). A negative adjustment takes money back; it is no credit (the report
lists it as ``debit``, with who and why, like every other manual entry).

Money is integer micro-units here; the metrics divide by a million, the report gives
``statements.money``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, case, func, literal_column, select

from gpulab.billing_service import storage
from gpulab.billing_service.models import (
    MICRO,
    Account,
    CourseLedgerEntry,
    LedgerEntry,
    Reservation,
    ServerSession,
)
from gpulab.billing_service.statements import iso, money

US_PER_DAY = 86_400 * MICRO
CREDIT_KINDS = ("credit", "refund", "compensation", "trial")
# Ledger kinds that are money given (or, a negative adjustment, taken back) by hand or rule.
_GIVEN = ("trial", "topup", "adjustment", "compensation")
STORAGE = "storage"
RESERVATION = "reservation"
MAX_CREDITS = 1000  # the report lists at most this many credits (newest first)


def pricing_label(pricing: str) -> str:
    """The metrics' spelling of a pricing mode (the hub's ``on_demand``, not ``on-demand``)."""
    return pricing.replace("-", "_")


def credit_kind(kind: str, amount_micro: int) -> str | None:
    """The metrics' kind of a ledger entry given by hand or rule; None for a debit."""
    if kind == "topup":
        return "credit"
    if kind == "adjustment":
        return "refund" if amount_micro > 0 else None
    return kind if kind in ("trial", "compensation") else None


def threshold_label(value: Decimal) -> str:
    """``10``, ``2.5``, ``0``: a threshold as a label value."""
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "") else text


@dataclass
class Totals:
    """All-time sums for the metrics (micro-units, counts, microseconds)."""

    revenue: dict[tuple[str, str, str], int] = field(default_factory=dict)
    credits: dict[str, int] = field(default_factory=dict)
    below: dict[str, int] = field(default_factory=dict)
    accounts: int = 0
    open_sessions: int = 0
    # The newest sign of life committed for a running server (a start, a heartbeat, a kernel,
    # app or observed span's latest sample), or None with no server running.
    newest_us: int | None = None


def totals(conn: Connection, thresholds: list[tuple[str, int]]) -> Totals:
    """Everything the metrics need from the database, read in one transaction."""
    out = Totals()
    revenue: dict[tuple[str, str, str], int] = defaultdict(int)
    for gpu_type, pricing, course, amount in conn.execute(
        select(
            ServerSession.gpu_type,
            ServerSession.pricing,
            ServerSession.course,
            func.sum(ServerSession.charged_micro),
        ).group_by(ServerSession.gpu_type, ServerSession.pricing, ServerSession.course)
    ).all():
        revenue[(gpu_type, pricing_label(pricing), course or "")] += int(amount or 0)
    for gpu_type, account, amount in conn.execute(
        select(Reservation.gpu_type, Reservation.account, func.sum(Reservation.amount_micro))
        .where(Reservation.account.like("course:%"))
        .group_by(Reservation.gpu_type, Reservation.account)
    ).all():
        revenue[(gpu_type, RESERVATION, account.removeprefix("course:"))] += int(amount or 0)
    for gpu_type, amount in conn.execute(
        select(Reservation.gpu_type, func.sum(Reservation.amount_micro))
        .where(Reservation.account.not_like("course:%"))
        .group_by(Reservation.gpu_type)
    ).all():
        revenue[(gpu_type, RESERVATION, "")] += int(amount or 0)
    stored = conn.execute(
        select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
            LedgerEntry.kind == storage.KIND
        )
    ).scalar()
    if stored:
        revenue[(STORAGE, STORAGE, "")] += -int(stored)
    out.revenue = dict(revenue)

    credits = dict.fromkeys(CREDIT_KINDS, 0)
    for model in (LedgerEntry, CourseLedgerEntry):
        # Money given only: a negative adjustment is a debit, not a credit.
        given = func.sum(case((model.amount_micro > 0, model.amount_micro), else_=0))
        for kind, amount in conn.execute(
            select(model.kind, given).where(model.kind.in_(_GIVEN)).group_by(model.kind)
        ).all():
            label = credit_kind(kind, 1)
            if label is not None:
                credits[label] += int(amount or 0)
    out.credits = credits

    columns = [func.count()] + [
        func.coalesce(func.sum(case((Account.balance_micro < micro, 1), else_=0)), 0)
        for _, micro in thresholds
    ]
    accounts, *below = conn.execute(select(*columns)).one()
    out.accounts = int(accounts)
    out.below = {label: int(n) for (label, _), n in zip(thresholds, below, strict=True)}

    n, started, heartbeat, busy = conn.execute(
        select(
            func.count(),
            func.max(ServerSession.started_us),
            func.max(ServerSession.last_heartbeat_us),
            func.max(ServerSession.last_busy_us),
        ).where(ServerSession.stopped_us.is_(None))
    ).one()
    out.open_sessions = int(n)
    signs = [t for t in (started, heartbeat, busy) if t is not None]
    out.newest_us = max(signs) if n and signs else None
    return out


# ---- the admin report ------------------------------------------------------------------------


def day_start(t_us: int) -> int:
    """Midnight UTC of the day of ``t_us``."""
    return t_us - t_us % US_PER_DAY


def _day_of(column):
    """The UTC day (days since 1970) of a time column, as SQL: the divisor is written into the
    statement, so that the same expression groups and selects (PostgreSQL compares them)."""
    return column.op("/")(literal_column(str(US_PER_DAY)))


def _day_name(day_index: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(days=day_index)).date().isoformat()


def report(conn: Connection, currency: str, now_us: int, days: int) -> dict[str, Any]:
    """Revenue per UTC day of the last ``days`` days (today included) by type, per user, the
    top 10 spenders, and every credit, refund, compensation and debit posted by hand or rule in
    that window, newest first, with who posted it and why.

    A day's revenue is what was charged that day (the charges the ledger posted, re-ratings
    included), so the days add up to the metrics' revenue over the same time. A user's total
    is what their usage was charged, whoever paid (``paid_by_course`` of it came from course
    pools), their storage and their own prepaid reservations."""
    from_us = day_start(now_us) - (days - 1) * US_PER_DAY
    first_day = from_us // US_PER_DAY
    per_day: dict[int, dict[str, int]] = {first_day + i: defaultdict(int) for i in range(days)}
    per_user: dict[str, int] = defaultdict(int)
    by_course_for_user: dict[str, int] = defaultdict(int)
    per_course: dict[str, int] = defaultdict(int)

    def add(day_index: int, what: str, amount: int) -> None:
        if day_index in per_day:
            per_day[day_index][what] += amount

    # Charges of sessions, in the users' books and the pools' (the student's usage either way).
    for model, owner in (
        (LedgerEntry, LedgerEntry.user),
        (CourseLedgerEntry, CourseLedgerEntry.user),
    ):
        day = _day_of(model.created_us)
        rows = conn.execute(
            select(day, owner, ServerSession.gpu_type, func.sum(-model.amount_micro))
            .join(ServerSession, ServerSession.id == model.session_id)
            .where(model.kind == "charge", model.created_us >= from_us, model.created_us <= now_us)
            .group_by(day, owner, ServerSession.gpu_type)
        ).all()
        for d, user, gpu_type, amount in rows:
            amount = int(amount or 0)
            add(int(d), gpu_type, amount)
            per_user[user] += amount
            if model is CourseLedgerEntry:
                by_course_for_user[user] += amount
    # Storage above the free size.
    day = _day_of(LedgerEntry.created_us)
    for d, user, amount in conn.execute(
        select(day, LedgerEntry.user, func.sum(-LedgerEntry.amount_micro))
        .where(
            LedgerEntry.kind == storage.KIND,
            LedgerEntry.created_us >= from_us,
            LedgerEntry.created_us <= now_us,
        )
        .group_by(day, LedgerEntry.user)
    ).all():
        amount = int(amount or 0)
        add(int(d), STORAGE, amount)
        per_user[user] += amount
    # Prepaid reservations, the day they were paid.
    for created, account, gpu_type, amount in conn.execute(
        select(
            Reservation.created_us,
            Reservation.account,
            Reservation.gpu_type,
            Reservation.amount_micro,
        ).where(Reservation.created_us >= from_us, Reservation.created_us <= now_us)
    ).all():
        add(created // US_PER_DAY, gpu_type, amount)
        kind, _, name = account.partition(":")
        if kind == "course":
            per_course[name] += amount
        else:
            per_user[name] += amount
    for course, amount in conn.execute(
        select(CourseLedgerEntry.course, func.sum(-CourseLedgerEntry.amount_micro))
        .where(
            CourseLedgerEntry.kind == "charge",
            CourseLedgerEntry.created_us >= from_us,
            CourseLedgerEntry.created_us <= now_us,
        )
        .group_by(CourseLedgerEntry.course)
    ).all():
        per_course[course] += int(amount or 0)

    by_user = [
        {
            "user": user,
            "total": money(amount),
            "paid_by_course": money(by_course_for_user.get(user, 0)),
        }
        for user, amount in sorted(per_user.items())
    ]
    top = sorted(by_user, key=lambda u: (-u["total"]["micro"], u["user"]))[:10]
    credits, credit_count = _credits(conn, from_us, now_us)
    return {
        "currency": currency,
        "from": iso(from_us),
        "to": iso(now_us),
        "days": [
            {
                "date": _day_name(d),
                "total": money(sum(by_type.values())),
                "by_type": {t: money(a) for t, a in sorted(by_type.items())},
            }
            for d, by_type in sorted(per_day.items())
        ],
        "total": money(sum(sum(v.values()) for v in per_day.values())),
        "by_user": by_user,
        "top": top,
        "by_course": [{"course": c, "total": money(a)} for c, a in sorted(per_course.items())],
        "credits": credits,
        "credits_count": credit_count,
        "credits_truncated": credit_count > len(credits),
    }


def _credits(conn: Connection, from_us: int, to_us: int) -> tuple[list[dict[str, Any]], int]:
    """Money given (or taken back) by hand or rule in the window: top-ups, adjustments and
    compensations of both books, newest first (at most ``MAX_CREDITS``), and how many there are.
    Trial credits, one per new account, are not listed (the metrics count them)."""
    kinds = ("topup", "adjustment", "compensation")
    rows = []
    count = 0
    for model, kind_of in ((LedgerEntry, "user"), (CourseLedgerEntry, "course")):
        where = (
            model.kind.in_(kinds),
            model.created_us >= from_us,
            model.created_us <= to_us,
            model.amount_micro != 0,
        )
        count += int(conn.execute(select(func.count()).select_from(model).where(*where)).scalar())
        for r in conn.execute(
            select(model).where(*where).order_by(model.created_us.desc()).limit(MAX_CREDITS)
        ).all():
            name = r.user if kind_of == "user" else r.course
            rows.append(
                {
                    "when": iso(r.created_us),
                    "account": f"{kind_of}:{name}",
                    # A pool's compensation: the student whose session it was.
                    "user": r.user,
                    "amount": money(r.amount_micro),
                    "kind": credit_kind(r.kind, r.amount_micro) or "debit",
                    "entry_kind": r.kind,
                    "by": r.actor,
                    "reason": r.note,
                    "_sort": (r.created_us, r.id),
                }
            )
    rows.sort(key=lambda r: r.pop("_sort"), reverse=True)
    return rows[:MAX_CREDITS], count
