"""Prices in force, and the cost of billed time.

Rounding rule (the one place money is rounded):

- Prices come from the catalog (and, for spot seconds, from the spot market's price history) as
  Decimals with at most 6 decimal places, so a price per hour is an exact whole number of
  micro-units per hour.
- A server session's amount is computed from its whole billed time at once:
  ``sum(price_micro_per_hour x microseconds) / 3,600,000,000`` (the billed intervals split at
  every spot price change, each piece at the price in force), rounded half-to-even to whole
  micro-units (1 CNY = 1,000,000 micro-units). The ledger records the difference between that
  amount and what the session was already charged, so the charges of a session always add up to
  the rounded amount of its total time, never to a sum of rounded pieces.
- Presentation rounds micro-units to the currency's cents, half-to-even (``format_money``).

Spot never costs more than the bid: every spot second is rated at min(price in force, the
server's bid), the bid being the ``max_price`` of the spawn options the hub reported with
``server_start``. The market reclaims a server whose price rises above its bid only after a
warning period; those seconds are rated at the bid (``Rated.capped_us`` counts them).

Course sessions (a ``course`` in the options the hub reported with ``server_start``) on on-demand
pricing are rated at the catalog's education price (``GpuType.education_price``, no-GPU
``education_price_per_hour``; the on-demand price where none is set): their rated pricing is
``"education"`` (``rated_pricing``). Spot course sessions follow the spot rules unchanged.

Every price above comes from one function, :func:`gpulab.catalog.pricing.quote`, the same one the
hub's home page, spawn form, launch plan and the servers' status bar ask (``PriceBook.quote``).

Reservations (``reservations``): the seconds of a session that fall inside the [start, end) of
the paid reservation it runs on (its ``prepaid`` window) are rated at 0 (``Rated.prepaid_us``
counts them); the rest of its seconds are rated as above, and still rounded once per session.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

from gpulab.billing_service.models import MICRO
from gpulab.catalog import NO_GPU, Catalog, GpuType
from gpulab.catalog.price_history import PriceHistory, history_for
from gpulab.catalog.pricing import EDUCATION, Quote, quote

US_PER_HOUR = 3600 * MICRO
OUTSIDE = -1  # the period key of a course session's time outside every period (its term)
# [start, end) in microseconds: a session's paid reservation, whose seconds are rated at 0.
Window = tuple[int, int]


def to_micro(amount: Decimal) -> int:
    """An exact Decimal amount in micro-units; refuses amounts finer than a micro-unit."""
    micro = amount * MICRO
    if micro != micro.to_integral_value():
        raise ValueError(f"{amount} has more than 6 decimal places")
    return int(micro)


def from_micro(micro: int) -> Decimal:
    return Decimal(micro) / MICRO


# Storage (``storage``): bytes above the free size, charged per GB-day (GB = 2**30 bytes) pro rata.
GIB = 2**30
US_PER_DAY = 86_400 * MICRO


def storage_exact(billable_bytes: int, us: int, price_micro_per_gb_day: int) -> int:
    """``billable_bytes`` held for ``us`` microseconds at a price per GB-day, exactly (the
    numerator of ``storage_micro``): sums of these are exact, so a day is rounded once."""
    return billable_bytes * us * price_micro_per_gb_day


def storage_micro(exact: int) -> int:
    """A sum of ``storage_exact`` in micro-units, rounded half-to-even (the one rounding)."""
    return round_div(exact, GIB * US_PER_DAY)


def format_money(micro: int) -> str:
    """Micro-units as a currency amount with two decimals (half-to-even), e.g. ``9.87``."""
    return str(from_micro(micro).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


def round_div(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded half-to-even, in integers."""
    q, r = divmod(numerator, denominator)
    twice = 2 * r
    if twice > denominator or (twice == denominator and q % 2 == 1):
        q += 1
    return q


def bid_of(options: str | dict[str, Any] | None) -> Decimal | None:
    """A spot server's bid per card-hour (``max_price`` in its spawn options), or None.

    Rounded down to the micro-unit (a finer bid can only lower the price). Options that carry no
    usable bid give None: spot time is then capped by the on-demand price alone, as before bids.
    """
    if isinstance(options, str):
        try:
            options = json.loads(options or "{}")
        except ValueError:
            return None
    raw = (options or {}).get("max_price") if isinstance(options, dict) else None
    if raw is None or isinstance(raw, bool):
        return None
    try:
        bid = Decimal(str(raw))
    except InvalidOperation:
        return None
    if not bid.is_finite() or bid < 0:
        return None
    if bid.as_tuple().exponent < -6:  # finer than a micro-unit: rates are whole micro-units
        bid = bid.quantize(Decimal("0.000001"), rounding=ROUND_FLOOR)
    return bid


COURSE_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def options_dict(options: str | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(options, str):
        try:
            options = json.loads(options or "{}")
        except ValueError:
            return {}
    return options if isinstance(options, dict) else {}


def course_of(options: str | dict[str, Any] | None) -> str | None:
    """The course a session runs under (its options' ``course``), or None; a name that is not a
    course name (lowercase letters, digits, '-') is no course."""
    course = options_dict(options).get("course")
    if isinstance(course, str) and len(course) <= 64 and COURSE_RE.match(course):
        return course
    return None


def paid_by_course(options: str | dict[str, Any] | None) -> bool:
    """Whether the hub says only the course's pool pays this session (options' ``paid_by`` is
    ``"course"``): a server started by someone other than its owner (the course's staff). Such a
    session runs as under ``overflow = "refuse"`` and never charges the student's own balance."""
    return course_of(options) is not None and options_dict(options).get("paid_by") == "course"


def reservation_of(options: str | dict[str, Any] | None) -> str | None:
    """The reservation the hub says a server's cards came from (its options' ``reservation``),
    or None; believed only as far as ``reservations.check`` finds it paid and matching."""
    tag = options_dict(options).get("reservation")
    if isinstance(tag, str) and 1 <= len(tag) <= 128:
        return tag
    return None


def rated_pricing(pricing: str, options: str | dict[str, Any] | None) -> str:
    """The pricing a session's seconds are rated at: ``"education"`` for an on-demand session of
    a course, else its own (``"on-demand"``, ``"spot"``)."""
    if pricing == "on-demand" and course_of(options) is not None:
        return EDUCATION
    return pricing


@dataclass(frozen=True)
class Rated:
    """Billed intervals priced exactly, before the one rounding."""

    exact: int  # sum of price_micro_per_hour x microseconds (x cards)
    billed_us: int
    price_changes: int  # spot price changes strictly inside the billed intervals
    unpriced_us: int  # spot time before any recorded spot price (rated at on-demand)
    capped_us: int = 0  # spot time whose price in force was above the bid (rated at the bid)
    prepaid_us: int = 0  # time inside the session's paid reservation (rated at 0)

    @property
    def amount_micro(self) -> int:
        return round_div(self.exact, US_PER_HOUR)


class PriceBook:
    """What one second of a server costs at a given time.

    On-demand and no-GPU prices come from the catalog and never change. Spot seconds are rated at
    the spot market's price in force at that second, read from the market's durable price history
    in ``market_data_dir`` (the hub's data dir: the file the hub appends to before a price takes
    effect, so no network call to the hub is needed). Time before the first recorded spot price of
    a type (an empty history, or no ``market_data_dir``) is rated at the on-demand price: the
    ceiling of every spot price, so a misplaced history can never give GPU time away.
    """

    def __init__(self, catalog: Catalog, market_data_dir: str | os.PathLike | None = None) -> None:
        self.catalog = catalog
        self.market_data_dir = market_data_dir

    def _history(self) -> PriceHistory | None:
        return history_for(self.market_data_dir) if self.market_data_dir else None

    def _gpu(self, gpu_type: str) -> GpuType:
        gpu = self.catalog.gpu_types.get(gpu_type)
        if gpu is None:
            raise KeyError(f"unknown GPU type {gpu_type!r}")
        return gpu

    def segments(
        self,
        gpu_type: str,
        pricing: str,
        start_us: int,
        end_us: int,
        history: PriceHistory | None = None,
    ) -> list[tuple[int, int, Decimal | None]]:
        """[start, end) cut where the price changes, each piece with its price per card-hour (per
        hour in no-GPU mode); ``None`` for spot time before any recorded spot price."""
        if end_us <= start_us:
            return []
        if gpu_type != NO_GPU:
            self._gpu(gpu_type)
        if gpu_type == NO_GPU or pricing != "spot":
            # A fixed price: the one price function's (catalog.pricing), like every other.
            return [(start_us, end_us, self.quote(gpu_type, 1, pricing).per_card)]
        if history is None:
            history = self._history()
        if history is None:
            return [(start_us, end_us, None)]
        # The file stores seconds with 3 decimals: ask with a margin, then decide in integers.
        changes = history.window(gpu_type, start_us / MICRO - 0.01, end_us / MICRO + 0.01)
        price: Decimal | None = None
        cuts: list[tuple[int, Decimal]] = []
        for t, p in changes:
            t_us = round(t * MICRO)
            if t_us <= start_us:
                price = p  # in force at start (the latest change at or before it)
            elif t_us < end_us:
                cuts.append((t_us, p))
        out: list[tuple[int, int, Decimal | None]] = []
        a = start_us
        for t_us, p in cuts:
            if p != price:
                out.append((a, t_us, price))
                a, price = t_us, p
        out.append((a, end_us, price))
        return out

    def price_at(self, gpu_type: str, pricing: str, t_us: int) -> Decimal:
        """Price per card-hour (per hour in no-GPU mode) in force at ``t_us``."""
        ((_, _, price),) = self.segments(gpu_type, pricing, t_us, t_us + 1)
        return self.quote(gpu_type, 1, pricing, price).per_card

    def quote(
        self,
        gpu_type: str,
        gpus: int,
        pricing: str,
        spot_price: Decimal | None = None,
        bid: Decimal | None = None,
    ) -> Quote:
        """The one price function's answer (:func:`gpulab.catalog.pricing.quote`) for a second
        rated ``pricing`` (``rated_pricing``: "education" is an on-demand course session) at the
        spot price ``spot_price`` in force (spot only; None: none recorded)."""
        education = pricing == EDUCATION
        base = "on-demand" if education else pricing
        if gpu_type == NO_GPU:
            base = "on-demand"
        return quote(
            self.catalog, gpu_type, gpus, base, spot_price=spot_price, bid=bid, education=education
        )

    @staticmethod
    def capped(price: Decimal, pricing: str, bid: Decimal | None) -> tuple[Decimal, bool]:
        """The price charged for a second priced ``price``: a spot second never above the bid
        (the one price function's rule). Returns (charged price, whether the bid capped it)."""
        if pricing == "spot" and bid is not None and price > bid:
            return bid, True
        return price, False

    def change_points(self, gpu_type: str, pricing: str, start_us: int, end_us: int) -> list[int]:
        """Times strictly inside (start, end) where the price changes (none for fixed prices)."""
        return [a for a, _, _ in self.segments(gpu_type, pricing, start_us, end_us)[1:]]

    def rate_micro_per_hour(
        self,
        gpu_type: str,
        gpus: int,
        pricing: str,
        t_us: int,
        bid: Decimal | None = None,
        prepaid: Window | None = None,
    ) -> int:
        if prepaid is not None and prepaid[0] <= t_us < prepaid[1]:
            return 0  # inside the session's paid reservation
        ((_, _, price),) = self.segments(gpu_type, pricing, t_us, t_us + 1)
        q = self.quote(gpu_type, gpus, pricing, price, bid)
        return to_micro(q.per_card) * q.cards

    def rate(
        self,
        gpu_type: str,
        gpus: int,
        pricing: str,
        intervals: Iterable[tuple[int, int]],
        bid: Decimal | None = None,
        prepaid: Window | None = None,
    ) -> Rated:
        """Price these (disjoint) billed intervals exactly, split at every price change; spot
        seconds at min(price in force, ``bid``); seconds inside ``prepaid`` (the [start, end)
        of the session's paid reservation) at 0."""
        history = self._history() if pricing == "spot" else None
        exact = billed = changes = unpriced = capped_us = prepaid_us = 0
        inside, outside = split_prepaid(intervals, prepaid)
        for a, b in inside:
            prepaid_us += b - a
            billed += b - a
        for start, end in outside:
            pieces = self.segments(gpu_type, pricing, start, end, history)
            changes += max(len(pieces) - 1, 0)
            for a, b, price in pieces:
                # Each piece at the one price function's price (spot: the price in force then).
                q = self.quote(gpu_type, gpus, pricing, price, bid)
                if q.unpriced:
                    unpriced += b - a
                if q.capped:
                    capped_us += b - a
                exact += to_micro(q.per_card) * q.cards * (b - a)
                billed += b - a
        return Rated(exact, billed, changes, unpriced, capped_us, prepaid_us)

    def cost_micro(
        self,
        gpu_type: str,
        gpus: int,
        pricing: str,
        intervals: Iterable[tuple[int, int]],
        bid: Decimal | None = None,
        prepaid: Window | None = None,
    ) -> int:
        """The amount for these (disjoint) billed intervals, rounded once (see module doc)."""
        return self.rate(gpu_type, gpus, pricing, intervals, bid, prepaid).amount_micro


# A course's periods (``courses.Settings.cut``): billed intervals cut at period boundaries,
# {period start or OUTSIDE: (period end, pieces)}.
PeriodCut = Callable[[Iterable[tuple[int, int]]], dict[int, tuple[int, list[tuple[int, int]]]]]


@dataclass(frozen=True)
class Charge:
    """What a session costs now: its ``amount_micro`` (rounded once) and, for a course session,
    that amount split by the periods its seconds fall in (``periods``: {period start or OUTSIDE:
    (period end, micro)}, adding up to the amount)."""

    amount_micro: int
    billed_us: int
    periods: dict[int, tuple[int, int]] = field(default_factory=dict)


def rate_charge(
    prices: PriceBook,
    sess,
    merged: list[tuple[int, int]],
    prepaid: Window | None = None,
    cut: PeriodCut | None = None,
) -> Charge:
    """Rate a session's merged billed intervals, in one place and in order:

    1. the pricing its seconds are rated at (``rated_pricing``: education in a course) and its bid;
    2. the amount of all of its billed time, rounded once (seconds inside ``prepaid``, the paid
       reservation it runs on, at 0);
    3. for a course session (``cut``, its course's periods), that amount split by period: each
       period's exact amount rounded down, the latest period the rest, so the parts add up to the
       amount (seconds inside ``prepaid`` cost 0 and so count towards no cap)."""
    pricing = rated_pricing(sess.pricing, sess.options)
    bid = bid_of(sess.options)
    rated = prices.rate(sess.gpu_type, sess.gpus, pricing, merged, bid, prepaid)
    amount = rated.amount_micro
    if cut is None:
        return Charge(amount, rated.billed_us)
    parts: list[tuple[int, int, int, int]] = []  # (last second, key, end, micro)
    for key, (end, pieces) in cut(merged).items():
        exact = prices.rate(sess.gpu_type, sess.gpus, pricing, pieces, bid, prepaid).exact
        parts.append((max(b for _, b in pieces), key, end, exact // US_PER_HOUR))
    periods = {key: (end, micro) for _, key, end, micro in parts}
    if parts:
        _, key, end, micro = max(parts)
        periods[key] = (end, micro + amount - sum(p[3] for p in parts))
    elif amount:
        periods[OUTSIDE] = (0, amount)
    return Charge(amount, rated.billed_us, periods)


def split_prepaid(
    intervals: Iterable[tuple[int, int]], prepaid: Window | None
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the parts inside ``prepaid`` [start, end), the parts outside it) of these intervals."""
    if prepaid is None:
        return [], list(intervals)
    lo, hi = prepaid
    inside: list[tuple[int, int]] = []
    outside: list[tuple[int, int]] = []
    for a, b in intervals:
        if b <= a:
            continue
        if a < lo:
            outside.append((a, min(b, lo)))
        if max(a, lo) < min(b, hi):
            inside.append((max(a, lo), min(b, hi)))
        if b > hi:
            outside.append((max(a, hi), b))
    return inside, outside


def merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]
