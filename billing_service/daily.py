"""Spend per day: each session's charge split at midnight, so that its days add up to it exactly.

Days are UTC days, as everywhere in billing (the usage API's ``days``, its ``from``/``to`` dates,
the month a statement covers by default): the service has no time zone of its own and does not
know its users'. ``TIME_ZONE`` names it for the page and the API.

A session's amount is rated once, over its whole billed time (``rating``). Here its billed
intervals are cut at every midnight and each day's pieces are rated by the same
``PriceBook.rate`` (spot pieces at the price in force, capped at the bid): the exact, unrounded
rating is a sum over time, so the days' exact amounts add up to the session's, and a span crossing
midnight is shared between the two days in proportion to its seconds (at one price). Each day but
the session's last is rounded down to the micro-unit and the last day takes the rest, so the days
of a session add up to its amount to the micro-unit, and none is negative.

The usage API's ``daily`` and the statement page's chart are both this module's ``daily``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import (
    US_PER_HOUR,
    PriceBook,
    Window,
    bid_of,
    from_micro,
    rated_pricing,
)

TIME_ZONE = "UTC"
DAY_US = 86_400 * MICRO
# Beyond this many days, a statement's ``daily`` leaves out the empty days before its first and
# after its last billed day: the API takes any period (clients ask for "since 2000"), and decades
# of empty days say nothing.
MAX_PERIOD_DAYS = 366


@dataclass
class Day:
    """One day of spend: billed microseconds and amount in micro-units."""

    billed_us: int = 0
    micro: int = 0


def day_start(t_us: int) -> int:
    """The midnight (UTC) at or before ``t_us``."""
    return t_us // DAY_US * DAY_US


def day_name(day_us: int) -> str:
    return datetime.fromtimestamp(day_us // MICRO, UTC).date().isoformat()


def cut_at_midnight(intervals: Iterable[tuple[int, int]]) -> dict[int, list[tuple[int, int]]]:
    """Intervals cut at every midnight, grouped by the day (its midnight) each piece lies in."""
    out: dict[int, list[tuple[int, int]]] = {}
    for a, b in intervals:
        while a < b:
            day = day_start(a)
            end = min(b, day + DAY_US)
            out.setdefault(day, []).append((a, end))
            a = end
    return out


def session_days(
    prices: PriceBook,
    session: Any,
    merged: list[tuple[int, int]],
    prepaid: Window | None = None,
) -> dict[int, Day]:
    """A session's billed time and charge per day, from its merged billed intervals (the ones
    ``metering.rate_session`` rated; seconds inside ``prepaid``, its paid reservation, at 0).
    The days' amounts add up to ``session.charged_micro``."""
    bid = bid_of(session.options)
    out: dict[int, Day] = {}
    for day, pieces in sorted(cut_at_midnight(merged).items()):
        pricing = rated_pricing(session.pricing, session.options)
        rated = prices.rate(session.gpu_type, session.gpus, pricing, pieces, bid, prepaid)
        out[day] = Day(rated.billed_us, rated.exact // US_PER_HOUR)
    if out:
        # The rounding remainder goes to the last day; it also absorbs any difference between
        # what the ledger charged and a re-rating now, so the days always match the charge.
        last = max(out)
        out[last].micro += session.charged_micro - sum(d.micro for d in out.values())
    elif session.charged_micro:
        # Charged with no billed time left (not produced by the metering): keep it visible.
        out[day_start(session.started_us)] = Day(0, session.charged_micro)
    return out


def add_days(total: dict[int, Day], days: dict[int, Day]) -> None:
    for day, d in days.items():
        t = total.setdefault(day, Day())
        t.billed_us += d.billed_us
        t.micro += d.micro


def day_range(per_day: dict[int, Day], from_us: int, to_us: int) -> list[int]:
    """Every day (its midnight) a statement shows: each day of the period [from, to), and any day
    outside it on which a session of the statement was billed (a statement counts each session
    overlapping its period whole). Periods longer than ``MAX_PERIOD_DAYS`` are trimmed to the
    first and last billed days."""
    ends = [day_start(from_us), day_start(to_us - 1)] if to_us > from_us else []
    billed = sorted(per_day)
    ends += billed[:1] + billed[-1:]
    if not ends:
        return []
    lo, hi = min(ends), max(ends)
    if (hi - lo) // DAY_US + 1 > MAX_PERIOD_DAYS:
        if not billed:
            return []
        lo, hi = billed[0], billed[-1]
    return list(range(lo, hi + 1, DAY_US))


def daily(per_day: dict[int, Day], from_us: int, to_us: int) -> list[dict[str, Any]]:
    """The usage API's ``daily``: one entry per day of ``day_range``, empty days included."""
    out = []
    for day in day_range(per_day, from_us, to_us):
        d = per_day.get(day, Day())
        out.append(
            {
                "date": day_name(day),
                "amount": str(from_micro(d.micro)),
                "micro": d.micro,
                "seconds": d.billed_us / MICRO,
            }
        )
    return out
