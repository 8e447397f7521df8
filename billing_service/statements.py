"""Read models: a user's usage statement, balance with burn rate, and the admin overview."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, func, select

from gpulab.billing_service import courses, daily, jobs, reservations, storage
from gpulab.billing_service.metering import NEVER
from gpulab.billing_service.models import (
    MICRO,
    Account,
    KernelSpan,
    LedgerEntry,
    Reservation,
    ServerSession,
)
from gpulab.billing_service.rating import (
    US_PER_HOUR,
    PriceBook,
    Window,
    bid_of,
    format_money,
    from_micro,
    merge,
    rated_pricing,
    round_div,
    split_prepaid,
)
from gpulab.billing_service.schemas import APP_PREFIX, OBSERVED_PREFIX
from gpulab.catalog import NO_GPU


def iso(t_us: int | None) -> str | None:
    if t_us is None:
        return None
    return datetime.fromtimestamp(t_us / MICRO, UTC).isoformat().replace("+00:00", "Z")


def money(micro: int) -> dict[str, Any]:
    """Money in API answers: exact (micro-units and decimal string) plus the rounded display."""
    return {"micro": micro, "exact": str(from_micro(micro)), "display": format_money(micro)}


def mode_label(prices: PriceBook, gpu_type: str, gpus: int) -> str:
    cat = prices.catalog
    if gpu_type == NO_GPU:
        return cat.no_gpu.display_name
    gpu = cat.gpu_types.get(gpu_type)
    return f"{gpu.display_name if gpu else gpu_type} x{gpus}"


@dataclass
class _Totals:
    """What ``usage`` adds up over the sessions of a statement."""

    kernel_us: int = 0
    app_us: int = 0
    observed_us: int = 0
    billed_us: int = 0
    amount: int = 0
    course: int = 0  # paid by course pools
    prepaid_us: int = 0
    compensation: int = 0
    per_app_us: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # UTC day -> billed seconds and the charges posted that day
    per_day: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: {"billed_us": 0, "charged_micro": 0})
    )
    spend: dict[int, daily.Day] = field(default_factory=dict)  # spend per day (``daily``)


def usage(
    conn: Connection, prices: PriceBook, user: str, from_us: int, to_us: int
) -> dict[str, Any]:
    """Sessions of ``user`` overlapping [from, to): billed seconds and amount per server,
    kernel-seconds per kernel and app-seconds per app run (with the app's name), app-seconds per
    app; billed seconds and charges posted per UTC day (``days``), and the sessions' spend split
    at midnight (``daily``, see ``daily``), whose amounts add up to the total."""
    sessions = _sessions_in(conn, user, from_us, to_us)
    spans = _spans_by_session(conn, sessions)
    split = courses.paid_by(conn, [s.id for s in sessions if s.course is not None])
    # Sessions on a paid reservation: their seconds inside it are prepaid (charged 0).
    tags = reservations.checks(conn, sessions)
    totals = _Totals()
    servers = [
        _server_row(prices, s, spans.get(s.id, []), tags.get(s.id), split, totals) for s in sessions
    ]
    _add_compensations(conn, servers, totals)
    _add_charges_per_day(conn, user, from_us, to_us, totals)
    own = _own_reservations(conn, user, from_us, to_us)
    return {
        "user": user,
        "currency": prices.catalog.currency,
        "from": iso(from_us),
        "to": iso(to_us),
        "time_zone": daily.TIME_ZONE,
        "servers": servers,
        "days": [
            {
                "day": day,
                "billed_seconds": v["billed_us"] / MICRO,
                "charges": money(v["charged_micro"]),
            }
            for day, v in sorted(totals.per_day.items())
        ],
        # The sessions' spend per day (the page's chart); adds up to total.amount exactly.
        "daily": daily.daily(totals.spend, from_us, to_us),
        # App-seconds per app name, over every server (``total`` has their sum).
        "apps": {name: totals.per_app_us[name] / MICRO for name in sorted(totals.per_app_us)},
        "total": {
            "kernel_seconds": totals.kernel_us / MICRO,
            "app_seconds": totals.app_us / MICRO,
            "observed_seconds": totals.observed_us / MICRO,
            "billed_seconds": totals.billed_us / MICRO,
            "amount": money(totals.amount),
        },
        # Hybrid billing: the user's own prepaid reservations (each charged when made, besides
        # ``total.amount``), their sum, and the billed seconds that fell inside a reservation
        # the session ran on (charged 0; the rest of ``total.billed_seconds`` is on demand).
        "reservations": [reservation_json(r, prices.catalog.currency) for r in own],
        "prepaid": {
            "reservations": money(sum(r.amount_micro for r in own)),
            "seconds": totals.prepaid_us / MICRO,
        },
        # Training jobs' sessions (servers job-ID[-RANK]) as one line per job, and their
        # subtotal (part of ``total.amount``); see ``jobs``.
        "jobs": jobs.summary(servers, prices.catalog.currency, money),
        # Who paid total.amount: course pools (course sessions, ``courses``) and the user.
        "paid_by": {
            "course": money(totals.course),
            "personal": money(totals.amount - totals.course),
        },
        # Credited for lost work (ledger kind ``compensation``), next to the total charged.
        "compensation": money(totals.compensation),
        # The home above the free size, per day (ledger kind ``storage``), besides total.amount.
        "storage": storage.usage(
            conn, prices.catalog.storage, prices.catalog.currency, user, from_us, to_us
        ),
    }


def _sessions_in(conn: Connection, user: str, from_us: int, to_us: int) -> list:
    return conn.execute(
        select(ServerSession)
        .where(
            ServerSession.user == user,
            ServerSession.started_us < to_us,
            func.coalesce(ServerSession.stopped_us, NEVER) >= from_us,
        )
        .order_by(ServerSession.started_us)
    ).all()


def _spans_by_session(conn: Connection, sessions: list) -> dict[int, list]:
    by_session: dict[int, list] = defaultdict(list)
    if sessions:
        for span in conn.execute(
            select(KernelSpan)
            .where(KernelSpan.session_id.in_([s.id for s in sessions]))
            .order_by(KernelSpan.first_us)
        ).all():
            by_session[span.session_id].append(span)
    return by_session


def _units(s, spans: list, totals: _Totals) -> tuple[list, list, list]:
    """A session's spans as the statement lists them: (kernels, apps, observed), each clipped to
    the session; their seconds are added to ``totals``."""
    hi = s.stopped_us if s.stopped_us is not None else NEVER
    kernels, apps, observed = [], [], []
    for k in spans:
        a, b = max(k.first_us, s.started_us), min(k.last_us, hi)
        k_us = max(0, b - a)
        seen = {"first_seen": iso(k.first_us), "last_seen": iso(k.last_us)}
        if k.kernel_id.startswith(OBSERVED_PREFIX):
            # What the hub itself saw running in the server (billed with the kernels).
            totals.observed_us += k_us
            span = k.kernel_id.removeprefix(OBSERVED_PREFIX)
            observed.append({"span": span, **seen, "observed_seconds": k_us / MICRO})
        elif k.kernel_id.startswith(APP_PREFIX):
            run = k.kernel_id.removeprefix(APP_PREFIX)
            # The app's catalog name (e.g. sd-webui) from its app_start/app_stop; a run only
            # ever listed in heartbeats has none, and is named by its run id.
            app = k.name or run
            totals.app_us += k_us
            totals.per_app_us[app] += k_us
            apps.append(
                {"app_id": run, "app": app, "name": k.name, **seen, "app_seconds": k_us / MICRO}
            )
        else:
            totals.kernel_us += k_us
            kernels.append(
                {"kernel_id": k.kernel_id, "name": k.name, **seen, "kernel_seconds": k_us / MICRO}
            )
    return kernels, apps, observed


def _server_row(
    prices: PriceBook, s, spans: list, tag, split: dict[int, tuple[int, int]], totals: _Totals
) -> dict[str, Any]:
    """One session of the statement (``servers[]``), its figures added to ``totals``."""
    kernels, apps, observed = _units(s, spans, totals)
    hi = s.stopped_us if s.stopped_us is not None else NEVER
    merged = merge([(max(k.first_us, s.started_us), min(k.last_us, hi)) for k in spans])
    prepaid = tag.window if tag is not None else None
    prepaid_us = sum(b - a for a, b in split_prepaid(merged, prepaid)[0])
    totals.prepaid_us += prepaid_us
    days = daily.session_days(prices, s, merged, prepaid)
    daily.add_days(totals.spend, days)
    for day, d in days.items():
        if d.billed_us:
            totals.per_day[daily.day_name(day)]["billed_us"] += d.billed_us
    totals.billed_us += s.billed_us
    totals.amount += s.charged_micro
    # Who paid: a course session's charge is split between its pool and the student.
    by_course, by_user = split.get(s.id, (0, 0)) if s.course else (0, s.charged_micro)
    totals.course += by_course
    price = prices.rate_micro_per_hour(
        s.gpu_type,
        s.gpus,
        rated_pricing(s.pricing, s.options),
        s.started_us,
        bid_of(s.options),
        prepaid,
    )
    row = {
        "session": s.id,
        "server": s.server,
        "mode": mode_label(prices, s.gpu_type, s.gpus),
        "gpu_type": s.gpu_type,
        "gpus": s.gpus,
        "pricing": s.pricing,
        "price_per_hour": str(from_micro(price)),
        "started": iso(s.started_us),
        "stopped": iso(s.stopped_us),
        "billed_seconds": s.billed_us / MICRO,
        # Of the billed seconds, those inside the session's paid reservation (charged 0).
        "prepaid_seconds": prepaid_us / MICRO,
        "amount": money(s.charged_micro),
        "course": s.course,
        # The reservation the hub tagged the session with, and whether billing believed it
        # (``applied``; else ``reason``, and the session was rated normally).
        "reservation": None
        if tag is None
        else {
            **tag.to_json(),
            "from": iso(prepaid[0]) if prepaid else None,
            "to": iso(prepaid[1]) if prepaid else None,
            "prepaid_seconds": prepaid_us / MICRO,
        },
        "paid_by": {"course": money(by_course), "personal": money(by_user)},
        "kernels": kernels,
        "apps": apps,
        "observed": observed,
        "rates": rate_periods(prices, s, merged, prepaid, tag.id if tag is not None else None),
    }
    if s.pricing == "spot":
        row["spot"] = spot_summary(prices, s, merged, prepaid)
    return row


def _add_compensations(conn: Connection, servers: list[dict[str, Any]], totals: _Totals) -> None:
    """Credits for work a platform reclaim lost, shown with the session they compensate."""
    by_session: dict[int, list] = defaultdict(list)
    if servers:
        for e in conn.execute(
            select(LedgerEntry)
            .where(
                LedgerEntry.kind == "compensation",
                LedgerEntry.session_id.in_([row["session"] for row in servers]),
            )
            .order_by(LedgerEntry.id)
        ).all():
            by_session[e.session_id].append(e)
    for row in servers:
        entries = by_session.get(row["session"], [])
        totals.compensation += sum(e.amount_micro for e in entries)
        row["compensations"] = [
            {"amount": money(e.amount_micro), "created": iso(e.created_us), "note": e.note}
            for e in entries
        ]


def _add_charges_per_day(
    conn: Connection, user: str, from_us: int, to_us: int, totals: _Totals
) -> None:
    """The user's own charges posted in [from, to), per UTC day."""
    for created, amount in conn.execute(
        select(LedgerEntry.created_us, LedgerEntry.amount_micro).where(
            LedgerEntry.user == user,
            LedgerEntry.kind == "charge",
            LedgerEntry.created_us >= from_us,
            LedgerEntry.created_us < to_us,
        )
    ).all():
        totals.per_day[iso(created)[:10]]["charged_micro"] += -amount


def _own_reservations(conn: Connection, user: str, from_us: int, to_us: int) -> list:
    """The user's own prepaid reservations (``user:NAME``) whose window overlaps [from, to) or
    that were charged in it: each its own line of the statement."""
    return [
        r
        for r in conn.execute(
            select(Reservation)
            .where(Reservation.account == f"user:{user}")
            .order_by(Reservation.start_us, Reservation.id)
        ).all()
        if (r.start_us < to_us and r.end_us > from_us) or from_us <= r.created_us < to_us
    ]


def rate_periods(
    prices: PriceBook,
    s,
    merged: list[tuple[int, int]],
    prepaid: Window | None = None,
    reservation: str | None = None,
) -> list[dict[str, Any]]:
    """The prices a session's billed time was rated at: one entry per run of billed time at one
    price (a spot session gets one per spot price in force while it was billed; an on-demand or
    no-GPU session one per billed interval). ``price_per_card_hour`` is the price charged (per
    hour in no-GPU mode); ``spot_price_recorded`` is False for spot time before any recorded spot
    price (rated at the on-demand price, see ``rating``); a spot run whose price in force was
    above the bid has ``capped: true`` and that ``price_in_force`` (it was charged the bid).
    Billed time inside ``prepaid`` (the session's paid reservation) is one entry per run with
    ``prepaid: true``, the ``reservation`` and price 0."""
    bid = bid_of(s.options) if s.pricing == "spot" else None
    rated = rated_pricing(s.pricing, s.options)
    out: list[dict[str, Any]] = []
    billed_us: list[int] = []
    inside, outside = split_prepaid(merged, prepaid)
    runs = sorted([(a, b, True) for a, b in inside] + [(a, b, False) for a, b in outside])
    for start, end, is_prepaid in runs:
        if is_prepaid:
            out.append(
                {
                    "from": iso(start),
                    "to": iso(end),
                    "price_per_card_hour": "0",
                    "billed_seconds": (end - start) / MICRO,
                    "prepaid": True,
                    "reservation": reservation,
                }
            )
            billed_us.append(end - start)
            continue
        for a, b, price in prices.segments(s.gpu_type, rated, start, end):
            recorded = price is not None
            if price is None:
                price = prices.price_at(s.gpu_type, "on-demand", a)
            charged, capped = prices.capped(price, s.pricing, bid)
            row: dict[str, Any] = {
                "from": iso(a),
                "to": iso(b),
                "price_per_card_hour": str(charged),
                "billed_seconds": (b - a) / MICRO,
            }
            if s.pricing == "spot":
                row["spot_price_recorded"] = recorded
                row["capped"] = capped
                if capped:
                    row["price_in_force"] = str(price)
                # A gap in billed time (an idle stretch) does not make a new spot price: the
                # statement promises one run per price in force, so runs either side join.
                prev = out[-1] if out else None
                if prev is not None and _same_spot_price(prev, row):
                    billed_us[-1] += b - a
                    prev["to"] = row["to"]
                    prev["billed_seconds"] = billed_us[-1] / MICRO
                    continue
            out.append(row)
            billed_us.append(b - a)
    return out


def _same_spot_price(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("price_per_card_hour", "spot_price_recorded", "capped", "price_in_force")
    return all(a.get(k) == b.get(k) for k in keys)


def spot_summary(
    prices: PriceBook, s, merged: list[tuple[int, int]], prepaid: Window | None = None
) -> dict[str, Any]:
    """How a spot session was rated: its average price per card-hour over the billed time, how
    many times the spot price changed while it was billed, time rated at the on-demand price
    because no spot price was recorded yet, its bid, and when and how long a price above the bid
    was capped at the bid (``capped``: one entry per run of such time)."""
    bid = bid_of(s.options)
    rated = prices.rate(s.gpu_type, s.gpus, s.pricing, merged, bid, prepaid)
    card_us = (rated.billed_us - rated.prepaid_us) * max(s.gpus, 1)
    avg = None if card_us == 0 else str(from_micro(round_div(rated.exact, card_us)))
    capped = [
        {
            "from": r["from"],
            "to": r["to"],
            "price_in_force": r["price_in_force"],
            "charged": r["price_per_card_hour"],
            "seconds": r["billed_seconds"],
        }
        for r in rate_periods(prices, s, merged, prepaid)
        if r.get("capped")
    ]
    return {
        "average_price_per_card_hour": avg,
        "price_changes": rated.price_changes,
        "seconds_without_spot_price": rated.unpriced_us / MICRO,
        "bid_per_card_hour": None if bid is None else str(bid),
        "capped_seconds": rated.capped_us / MICRO,
        "capped": capped,
    }


def burning_sessions(conn: Connection, now_us: int, fresh_us: int, user: str | None = None):
    """Open sessions with a kernel seen alive within ``fresh_us``: what is being billed now."""
    q = select(ServerSession).where(
        ServerSession.stopped_us.is_(None), ServerSession.last_busy_us >= now_us - fresh_us
    )
    if user is not None:
        q = q.where(ServerSession.user == user)
    return conn.execute(q).all()


def balance_info(
    conn: Connection,
    prices: PriceBook,
    user: str,
    now_us: int,
    fresh_us: int,
    warn_micro: list[int],
) -> dict[str, Any]:
    bal = conn.execute(select(Account.balance_micro).where(Account.user == user)).scalar() or 0
    burning = burning_sessions(conn, now_us, fresh_us, user)
    tags = reservations.checks(conn, burning)  # a session inside its reservation burns nothing
    burn = sum(
        prices.rate_micro_per_hour(
            s.gpu_type,
            s.gpus,
            rated_pricing(s.pricing, s.options),
            now_us,
            bid_of(s.options),
            tags[s.id].window if s.id in tags else None,
        )
        for s in burning
    )
    time_left = None if burn == 0 else max(0.0, bal / burn * 3600)
    cur = prices.catalog.currency
    warnings = []
    below = [w for w in warn_micro if bal < w]
    if bal <= 0:
        warnings.append(
            f"Your balance is used up ({cur} {format_money(bal)}): top up to keep GPUs."
        )
    elif below:
        warnings.append(
            f"Your balance ({cur} {format_money(bal)}) is below {cur} {format_money(min(below))}."
        )
    return {
        "user": user,
        "currency": cur,
        "balance": money(bal),
        "burn_rate_per_hour": money(burn),
        "time_left_seconds": time_left,
        "warnings": warnings,
    }


def admin_overview(conn: Connection, prices: PriceBook, from_us: int, to_us: int) -> dict[str, Any]:
    """All users' balances and charges, and revenue and billed card-hours per GPU type."""
    charges = dict(
        conn.execute(
            select(LedgerEntry.user, func.sum(-LedgerEntry.amount_micro))
            .where(
                # What the user was charged: sessions and storage.
                LedgerEntry.kind.in_(("charge", storage.KIND)),
                LedgerEntry.created_us >= from_us,
                LedgerEntry.created_us < to_us,
            )
            .group_by(LedgerEntry.user)
        ).all()
    )
    users = [
        {
            "user": u,
            "balance": money(b),
            "charges": money(int(charges.get(u, 0))),
        }
        for u, b in conn.execute(
            select(Account.user, Account.balance_micro).order_by(Account.user)
        ).all()
    ]
    per_type = []
    for gpu_type, amount, card_us in conn.execute(
        select(
            ServerSession.gpu_type,
            func.sum(ServerSession.charged_micro),
            func.sum(ServerSession.billed_us * func.max(ServerSession.gpus, 1))
            if conn.dialect.name == "sqlite"
            else func.sum(ServerSession.billed_us * func.greatest(ServerSession.gpus, 1)),
        )
        .where(ServerSession.started_us >= from_us, ServerSession.started_us < to_us)
        .group_by(ServerSession.gpu_type)
        .order_by(ServerSession.gpu_type)
    ).all():
        per_type.append(
            {
                "gpu_type": gpu_type,
                "display_name": mode_label(prices, gpu_type, 1).removesuffix(" x1"),
                "revenue": money(int(amount or 0)),
                "billed_card_hours": int(card_us or 0) / MICRO / 3600,
            }
        )
    # Prepaid reservations charged in the period (users' and courses'), per GPU type.
    prepaid: dict[str, int] = defaultdict(int)
    for gpu_type, amount in conn.execute(
        select(Reservation.gpu_type, Reservation.amount_micro).where(
            Reservation.created_us >= from_us, Reservation.created_us < to_us
        )
    ).all():
        prepaid[gpu_type] += amount
    for t in per_type:
        t["prepaid_revenue"] = money(prepaid.get(t["gpu_type"], 0))
    return {
        "currency": prices.catalog.currency,
        "from": iso(from_us),
        "to": iso(to_us),
        "users": users,
        "gpu_types": per_type,
        "prepaid_revenue": money(sum(prepaid.values())),
        # Homes above the free size (ledger kind ``storage``), charged in the period.
        "storage_revenue": money(
            -int(
                conn.execute(
                    select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
                        LedgerEntry.kind == storage.KIND,
                        LedgerEntry.created_us >= from_us,
                        LedgerEntry.created_us < to_us,
                    )
                ).scalar()
            )
        ),
    }


def session_options(row) -> dict[str, Any]:
    try:
        return json.loads(row.options or "{}")
    except ValueError:
        return {}


def _period_json(period: tuple[int, int] | None) -> dict[str, Any]:
    return {
        "period_start": iso(period[0]) if period else None,
        "period_end": iso(period[1]) if period else None,
    }


def course_status(conn: Connection, course: str, user: str, now_us: int, currency: str):
    """The balance API's ``course``: where ``user`` stands in ``course`` now."""
    st = courses.student_status(conn, course, user, now_us)
    return {
        "name": course,
        "currency": currency,
        "cap": money(st.settings.cap_micro),
        "used": money(st.used_micro),
        "left": money(st.cap_left_micro),
        # What the pool pays for this student now: min(left, pool balance).
        "available": money(st.available_micro),
        "pool_balance": money(st.pool_micro),
        **st.settings.to_json(),
        **_period_json(st.period),
        "in_period": st.period is not None,
    }


def course_info(conn: Connection, course: str, now_us: int, currency: str) -> dict[str, Any]:
    """A course's settings, pool balance, current period and each student's use of it."""
    row = courses.get(conn, course)
    settings = courses.Settings.of(row)
    period = settings.period_at(now_us)
    prepaid = reservations.listed(conn, f"course:{course}")
    per_user = courses.period_usage(conn, course, period[0]) if period else {}
    names = sorted(set(courses.students(conn, course)) | set(per_user))
    students = []
    for name in names:
        by_course, by_user = per_user.get(name, (0, 0))
        left = max(0, settings.cap_micro - by_course) if period else 0
        students.append(
            {
                "user": name,
                "used": money(by_course),
                "left": money(left),
                "personal": money(by_user),
            }
        )
    return {
        "course": course,
        "currency": currency,
        "configured": row is not None,
        "cap": money(settings.cap_micro),
        **settings.to_json(),
        "pool_balance": money(row.balance_micro if row is not None else 0),
        **_period_json(period),
        "students": students,
        # The course's prepaid reservations, each charged to the pool when made.
        "reservations": [reservation_json(r, currency) for r in prepaid],
        "reservations_total": money(sum(r.amount_micro for r in prepaid)),
    }


def _seconds(t_us: int) -> int | float:
    return t_us // MICRO if t_us % MICRO == 0 else t_us / MICRO


def reservation_json(row, currency: str) -> dict[str, Any]:
    """A reservation as the API and statements show it: its terms, window and prepaid charge."""
    return {
        "id": row.id,
        "account": row.account,
        "paid_by": "course" if row.account.startswith("course:") else "user",
        "gpu_type": row.gpu_type,
        "cards": row.cards,
        "start": _seconds(row.start_us),
        "end": _seconds(row.end_us),
        "from": iso(row.start_us),
        "to": iso(row.end_us),
        "hours": (row.end_us - row.start_us) / US_PER_HOUR,
        "currency": currency,
        "price_per_card_hour": str(from_micro(row.price_micro)),
        "amount": money(row.amount_micro),
        "charged_at": iso(row.created_us),
        "actor": row.actor,
    }


# ---- the statement page's rows (the page only; the JSON and CSV keep their fields) ------------

# Ledger kinds that are rows of their own on the page: money put in. Charges are summed into
# their session's row, compensations shown with the session they compensate, reservation
# prepayments in the page's reservations table.
DASH = "\u2013"  # the en dash of a range of times
CREDIT_LABELS = {"trial": "Trial credit", "topup": "Top-up", "adjustment": "Adjustment"}


def _parse(t: str | None) -> datetime | None:
    return None if t is None else datetime.fromisoformat(t)


def _when(t: str) -> datetime:
    parsed = _parse(t)
    assert parsed is not None
    return parsed


def human_time(t: datetime, now: datetime) -> str:
    """``2 Dec 13:35`` (the year only when it is not this one)."""
    day = f"{t.day} {t:%b}" + (f" {t.year}" if t.year != now.year else "")
    return f"{day} {t:%H:%M}"


def human_duration(seconds: float) -> str:
    """``45 s``, ``27 min``, ``2 h 05 min``, ``3 d 4 h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    minutes = s // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def human_span(started: str, stopped: str | None, now_us: int) -> str:
    """``2 Dec 13:35-14:02 (27 min)``; across midnight ``2 Dec 23:50 - 3 Dec 00:20 (30 min)``;
    a running session ``2 Dec 13:35 - now (27 min so far)`` (with en dashes, as typeset)."""
    now = datetime.fromtimestamp(now_us / MICRO, UTC)
    start = _parse(started)
    assert start is not None
    end = _parse(stopped)
    if end is None:
        took = human_duration((now - start).total_seconds())
        return f"{human_time(start, now)} {DASH} now ({took} so far)"
    took = human_duration((end - start).total_seconds())
    if end.date() == start.date():
        return f"{human_time(start, now)}{DASH}{end:%H:%M} ({took})"
    return f"{human_time(start, now)} {DASH} {human_time(end, now)} ({took})"


def price_text(price: str) -> str:
    """A price as the rest of the page writes money: at least two decimals (``2.10``)."""
    d = Decimal(price)
    return str(d.quantize(Decimal("0.01"))) if d == d.quantize(Decimal("0.01")) else str(d)


def human_period(usage: dict[str, Any], now_us: int) -> str:
    """The statement's period in the page's words: ``1 Dec 00:00 to 3 Dec 02:41``."""
    now = datetime.fromtimestamp(now_us / MICRO, UTC)
    lo, hi = _parse(usage["from"]), _parse(usage["to"])
    assert lo is not None and hi is not None
    return f"{human_time(lo, now)} to {human_time(hi, now)}"


def page_rows(
    usage: dict[str, Any], entries: list[dict[str, Any]], now_us: int, open_end: bool = False
) -> list[dict]:
    """What the statement page lists, newest first: one row per session of ``usage`` (when,
    what it ran on, its total: the ledger's many small charges of a session are one amount),
    and one per credit (trial, top-up, adjustment) posted in the statement's period (``open_end``:
    a period "so far", whose credits include those posted while the page was made, such as a
    new account's trial credit). A training job's sessions are one ``job`` row (``jobs.fold``)."""
    now = datetime.fromtimestamp(now_us / MICRO, UTC)
    rows: list[dict[str, Any]] = [
        {
            "kind": "session",
            "sort": _when(s["started"]),
            "when": human_span(s["started"], s["stopped"], now_us),
            "running": s["stopped"] is None,
            "price": price_text(s["price_per_hour"]),
            "billed": human_duration(s["billed_seconds"]),
            "kernels": [
                {**k, "span": human_span(k["first_seen"], k["last_seen"], now_us)}
                for k in s["kernels"]
            ],
            "apps": [
                {**a, "span": human_span(a["first_seen"], a["last_seen"], now_us)}
                for a in s["apps"]
            ],
            "compensations": [
                {**c, "when": human_time(_when(c["created"]), now)}
                for c in s.get("compensations", [])
            ],
            "session": s,
        }
        for s in usage["servers"]
    ]
    # A training job's sessions (its ranks and attempts) are one row, the sessions inside it.
    rows = jobs.fold(rows, usage["jobs"], lambda a, b: human_span(a, b, now_us))
    lo, hi = _parse(usage["from"]), _parse(usage["to"])
    for e in entries:
        label = CREDIT_LABELS.get(e["kind"])
        created = _parse(e["created"])
        if label is None or created is None or not (lo <= created and (open_end or created < hi)):
            continue
        note = e["note"] or ""
        rows.append(
            {
                "kind": "credit",
                "sort": created,
                "when": human_time(created, now),
                "label": label,
                "note": "" if note == label else note,
                "entry": e,
            }
        )
    for r in storage.page_rows(usage):  # one Storage row per day, after that day's sessions
        day = datetime.fromisoformat(r["date"]).replace(tzinfo=UTC)
        when = f"{day.day} {day:%b}" + (f" {day.year}" if day.year != now.year else "")
        rows.append({**r, "sort": day.replace(hour=23, minute=59, second=59), "when": when})
    rows.sort(key=lambda r: r["sort"], reverse=True)
    return rows
