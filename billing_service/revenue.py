"""The operator's money: what billing earned (by GPU type, pricing mode and course; per day and
per user) and every credit it gave (by whom and why), read from the one ledger.

Two readers share these sums, so that every number is the same wherever it is shown:
billing's Prometheus metrics (``metrics``: ``totals``, all time, cached for a few seconds per
scrape) and the admin revenue API the hub's console fetches (``report``, a window of days).

What counts as revenue is what the statements charge:

- a session's charges (its ``charge`` entries in the user's and the course pool's books,
  which always add up to its ``server_sessions.charged_micro``, the statement's ``amount``),
  labelled with its GPU type (``none`` for no-GPU), pricing (``on_demand``, ``spot``) and course
  (``""`` for none);
- prepaid reservations (``pricing="reservation"``, the course of a pool's reservation);
- storage above the free size (ledger kind ``storage``, ``type="storage"``, ``pricing="storage"``).

Credits, by the metrics' ``kind``: ``trial`` (the trial credit), ``credit`` (top-ups),
``refund`` (positive adjustments: an operator gives money back), ``compensation`` (work a
platform reclaim lost). A negative adjustment takes money back; it is no credit (the report
lists it as ``debit``, with who and why, like every other manual entry).

The ledger only grows (entries are never changed), so the metrics read each entry once: the
sums of entries older than ``SETTLE_US`` are kept (``Settled``) and each scrape adds what was
posted since (``totals``), instead of summing a ledger of millions of charges every few seconds.

Money is integer micro-units here; the metrics divide by a million, the report gives
``statements.money``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, case, func, select

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


Key = tuple[str, str, str]  # (type, pricing, course) of the revenue family

# Ledger entries older than this are settled: no transaction still to commit can hold one (an
# entry is stamped when its request arrived; a commit minutes later would mean billing is far
# behind, which the lag metric shows). Their sums are kept, and each read adds only what is newer.
SETTLE_US = 15 * 60 * MICRO


@dataclass(frozen=True)
class Settled:
    """The sums of the ledger's entries stamped before ``until_us``: append-only, they never
    change, so the metrics read each entry once (``totals``), not the whole ledger per scrape."""

    until_us: int = 0
    revenue: dict[Key, int] = field(default_factory=dict)
    credits: dict[str, int] = field(default_factory=dict)

    def plus(self, until_us: int, revenue: dict[Key, int], credits: dict[str, int]) -> Settled:
        return Settled(until_us, _add(self.revenue, revenue), _add(self.credits, credits))


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


@dataclass
class Totals:
    """All-time sums for the metrics (micro-units, counts, microseconds)."""

    revenue: dict[Key, int] = field(default_factory=dict)
    credits: dict[str, int] = field(default_factory=dict)
    below: dict[str, int] = field(default_factory=dict)
    accounts: int = 0
    open_sessions: int = 0
    # The newest sign of life committed for a running server (a start, a heartbeat, a kernel,
    # app or observed span's latest sample), or None with no server running.
    newest_us: int | None = None
    settled: Settled = field(default_factory=Settled)


def ledger_sums(
    conn: Connection, from_us: int, to_us: int | None
) -> tuple[dict[Key, int], dict[str, int]]:
    """Revenue and credits posted in [from, to) (to None: no end), from both books: sessions'
    charges labelled by their session, storage, and money given by kind."""
    revenue: dict[Key, int] = defaultdict(int)
    credits: dict[str, int] = defaultdict(int)
    for model in (LedgerEntry, CourseLedgerEntry):
        window = [model.created_us >= from_us]
        if to_us is not None:
            window.append(model.created_us < to_us)
        for gpu_type, pricing, course, amount in conn.execute(
            select(
                ServerSession.gpu_type,
                ServerSession.pricing,
                ServerSession.course,
                func.sum(model.amount_micro),
            )
            .join(ServerSession, ServerSession.id == model.session_id)
            .where(model.kind == "charge", *window)
            .group_by(ServerSession.gpu_type, ServerSession.pricing, ServerSession.course)
        ).all():
            revenue[(gpu_type, pricing_label(pricing), course or "")] -= int(amount or 0)
        # Money given only: a negative adjustment is a debit, not a credit.
        given = func.sum(case((model.amount_micro > 0, model.amount_micro), else_=0))
        for kind, amount in conn.execute(
            select(model.kind, given).where(model.kind.in_(_GIVEN), *window).group_by(model.kind)
        ).all():
            label = credit_kind(kind, 1)
            if label is not None:
                credits[label] += int(amount or 0)
    window = [LedgerEntry.created_us >= from_us]
    if to_us is not None:
        window.append(LedgerEntry.created_us < to_us)
    stored = conn.execute(
        select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
            LedgerEntry.kind == storage.KIND, *window
        )
    ).scalar()
    if stored:
        revenue[(STORAGE, STORAGE, "")] -= int(stored)
    return dict(revenue), dict(credits)


def totals(
    conn: Connection,
    thresholds: list[tuple[str, int]],
    settled: Settled | None = None,
    now_us: int | None = None,
) -> Totals:
    """Everything the metrics need from the database. The ledger's sums are ``settled`` (the
    previous read's, or none) plus what was posted since: only entries newer than
    ``SETTLE_US`` are read again at each call, the rest once."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    settled = settled or Settled()
    horizon = now_us - SETTLE_US
    if horizon > settled.until_us:
        settled = settled.plus(horizon, *ledger_sums(conn, settled.until_us, horizon))
    live_revenue, live_credits = ledger_sums(conn, settled.until_us, None)
    revenue = _add(settled.revenue, live_revenue)
    # Prepaid reservations: few rows, read whole.
    for gpu_type, account, amount in conn.execute(
        select(Reservation.gpu_type, Reservation.account, func.sum(Reservation.amount_micro))
        .where(Reservation.account.like("course:%"))
        .group_by(Reservation.gpu_type, Reservation.account)
    ).all():
        key = (gpu_type, RESERVATION, account.removeprefix("course:"))
        revenue[key] = revenue.get(key, 0) + int(amount or 0)
    for gpu_type, amount in conn.execute(
        select(Reservation.gpu_type, func.sum(Reservation.amount_micro))
        .where(Reservation.account.not_like("course:%"))
        .group_by(Reservation.gpu_type)
    ).all():
        key = (gpu_type, RESERVATION, "")
        revenue[key] = revenue.get(key, 0) + int(amount or 0)
    out = Totals(
        revenue=revenue,
        credits={k: 0 for k in CREDIT_KINDS} | _add(settled.credits, live_credits),
        settled=settled,
    )

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


def _day_name(day_index: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(days=day_index)).date().isoformat()


@dataclass(frozen=True)
class Day:
    """What one UTC day earned (micro-units): by type (a session's GPU type, ``storage``, a
    reservation's type), by user (their usage whoever paid, storage, own reservations), what
    pools paid of each user's, and by course (what each pool paid, its reservations)."""

    by_type: dict[str, int]
    by_user: dict[str, int]
    paid_by_course: dict[str, int]
    by_course: dict[str, int]


def day_figures(conn: Connection, day_index: int) -> Day:
    """The ledger's charges, storage and reservations posted on one UTC day."""
    d0 = day_index * US_PER_DAY
    d1 = d0 + US_PER_DAY
    by_type: dict[str, int] = defaultdict(int)
    by_user: dict[str, int] = defaultdict(int)
    paid_by_course: dict[str, int] = defaultdict(int)
    by_course: dict[str, int] = defaultdict(int)
    # Charges of sessions, in the users' books and the pools' (the student's usage either way).
    for model in (LedgerEntry, CourseLedgerEntry):
        for user, gpu_type, amount in conn.execute(
            select(model.user, ServerSession.gpu_type, func.sum(-model.amount_micro))
            .join(ServerSession, ServerSession.id == model.session_id)
            .where(model.kind == "charge", model.created_us >= d0, model.created_us < d1)
            .group_by(model.user, ServerSession.gpu_type)
        ).all():
            amount = int(amount or 0)
            by_type[gpu_type] += amount
            by_user[user] += amount
            if model is CourseLedgerEntry:
                paid_by_course[user] += amount
    for course, amount in conn.execute(
        select(CourseLedgerEntry.course, func.sum(-CourseLedgerEntry.amount_micro))
        .where(
            CourseLedgerEntry.kind == "charge",
            CourseLedgerEntry.created_us >= d0,
            CourseLedgerEntry.created_us < d1,
        )
        .group_by(CourseLedgerEntry.course)
    ).all():
        by_course[course] += int(amount or 0)
    # Storage above the free size.
    for user, amount in conn.execute(
        select(LedgerEntry.user, func.sum(-LedgerEntry.amount_micro))
        .where(
            LedgerEntry.kind == storage.KIND,
            LedgerEntry.created_us >= d0,
            LedgerEntry.created_us < d1,
        )
        .group_by(LedgerEntry.user)
    ).all():
        by_type[STORAGE] += int(amount or 0)
        by_user[user] += int(amount or 0)
    # Prepaid reservations, the day they were paid.
    for account, gpu_type, amount in conn.execute(
        select(Reservation.account, Reservation.gpu_type, Reservation.amount_micro).where(
            Reservation.created_us >= d0, Reservation.created_us < d1
        )
    ).all():
        by_type[gpu_type] += amount
        kind, _, name = account.partition(":")
        (by_course if kind == "course" else by_user)[name] += amount
    return Day(dict(by_type), dict(by_user), dict(paid_by_course), dict(by_course))


def report(
    conn: Connection,
    currency: str,
    now_us: int,
    days: int,
    cache: dict[int, Day] | None = None,
) -> dict[str, Any]:
    """Revenue per UTC day of the last ``days`` days (today included) by type, per user, the
    top 10 spenders, and every credit, refund, compensation and debit posted by hand or rule in
    that window, newest first, with who posted it and why.

    A day's revenue is what was charged that day (the charges the ledger posted, re-ratings
    included), so the days add up to the metrics' revenue over the same time. A user's total
    is what their usage was charged, whoever paid (``paid_by_course`` of it came from course
    pools), their storage and their own prepaid reservations.

    ``cache``: the figures of days over (and settled, ``SETTLE_US``) are kept there, so a
    console opened again reads only today's entries (and each past day once)."""
    today = now_us // US_PER_DAY
    first_day = today - (days - 1)
    figures: dict[int, Day] = {}
    for d in range(first_day, today + 1):
        found = cache.get(d) if cache is not None else None
        if found is None:
            found = day_figures(conn, d)
            if cache is not None and (d + 1) * US_PER_DAY + SETTLE_US <= now_us:
                cache[d] = found
        figures[d] = found
    if cache is not None:  # a year back at most
        for d in [d for d in cache if d < today - 400]:
            cache.pop(d, None)

    per_user: dict[str, int] = defaultdict(int)
    paid_by_course: dict[str, int] = defaultdict(int)
    per_course: dict[str, int] = defaultdict(int)
    for day in figures.values():
        for target, source in (
            (per_user, day.by_user),
            (paid_by_course, day.paid_by_course),
            (per_course, day.by_course),
        ):
            for k, v in source.items():
                target[k] += v
    by_user = [
        {
            "user": user,
            "total": money(amount),
            "paid_by_course": money(paid_by_course.get(user, 0)),
        }
        for user, amount in sorted(per_user.items())
    ]
    top = sorted(by_user, key=lambda u: (-u["total"]["micro"], u["user"]))[:10]
    from_us = first_day * US_PER_DAY
    credits, credit_count = _credits(conn, from_us, now_us)
    return {
        "currency": currency,
        "from": iso(from_us),
        "to": iso(now_us),
        "days": [
            {
                "date": _day_name(d),
                "total": money(sum(day.by_type.values())),
                "by_type": {t: money(a) for t, a in sorted(day.by_type.items())},
            }
            for d, day in sorted(figures.items())
        ],
        "total": money(sum(sum(day.by_type.values()) for day in figures.values())),
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
