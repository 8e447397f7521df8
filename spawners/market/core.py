"""The spot market's pure core: the price function, the low-price schedule, and the matching tick.

Nothing here touches the hub, the disk or the clock: the hub (:class:`.hub.SpotMarket`) and the
simulation (``benchmarks/spot_market.py``) feed the same functions, so what the benchmark measures
is what the hub runs.

Prices are :class:`~decimal.Decimal` per card-hour, quantised to the catalog's cent.

Billing's seam: ``gpulab.catalog.price_history.price_at`` answers the spot price in
force for a GPU type at any second, from the durable history.
"""

from __future__ import annotations

import bisect
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, time
from decimal import ROUND_HALF_UP, Decimal

__all__ = ["Decisions", "Order", "Schedule", "TypeBook", "decide", "spot_price"]

CENT = Decimal("0.01")
# HH:MM-HH:MM, seconds optional (HH:MM:SS) for windows that end between whole minutes.
_HMS = r"([01]\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?"
WINDOW_RE = re.compile(rf"^{_HMS}-{_HMS}$")

# Why a preemption happens (the "reason" in the API, the webhook and the records).
REASON_PRICE = "price-above-max"
REASON_ON_DEMAND = "on-demand-reclaim"
REASON_WINDOW = "low-price-window-ended"
# The card is held for a monthly reservation or a lab session (spawners/node/holds.py).
REASON_HOLD = "reserved"


# ---- the price -------------------------------------------------------------------------------


def spot_price(
    floor: Decimal,
    on_demand: Decimal,
    utilization: float,
    low_window: bool,
    *,
    window_factor: Decimal = Decimal("0.5"),
    exponent: int = 2,
) -> Decimal:
    """The spot price of one card-hour.

    ``utilization`` (held plus queued cards over total, clamped to [0, 1]) drives the price from
    the floor towards the on-demand price along ``u ** exponent``: idle cards stay cheap, the
    last free cards get dear. Inside a low-price window the premium above the floor is scaled by
    ``window_factor``. The result always lies in [floor, on_demand].
    """
    u = min(max(utilization, 0.0), 1.0)
    # Decimal from a float is exact; quantising first keeps the arithmetic short and reproducible.
    pressure = Decimal(str(round(u**exponent, 6)))
    premium = (on_demand - floor) * pressure
    if low_window:
        premium *= window_factor
    price = (floor + premium).quantize(CENT, rounding=ROUND_HALF_UP)
    return min(max(price, floor), on_demand)


@dataclass(frozen=True)
class Schedule:
    """Low-price windows in the operator's local time, plus (optionally) whole weekends."""

    windows: tuple[tuple[time, time], ...]
    weekends: bool = True

    @classmethod
    def parse(cls, windows: Iterable[str], weekends: bool = True) -> Schedule:
        parsed = []
        for w in windows:
            m = WINDOW_RE.match(w.strip())
            if not m:
                raise ValueError(
                    f"low-price window {w!r} must look like '18:00-09:00' (HH:MM-HH:MM, "
                    "seconds optional: HH:MM:SS)"
                )
            h1, m1, s1, h2, m2, s2 = (int(g or 0) for g in m.groups())
            parsed.append((time(h1, m1, s1), time(h2, m2, s2)))
        return cls(tuple(parsed), weekends)

    def is_low(self, local: datetime) -> bool:
        """Whether ``local`` (an aware or naive local time) falls in a low-price window."""
        if self.weekends and local.weekday() >= 5:
            return True
        t = local.time()
        for start, end in self.windows:
            if start <= end:
                if start <= t < end:
                    return True
            elif t >= start or t < end:  # crosses midnight, e.g. 18:00-09:00
                return True
        return False


# ---- the order book ----------------------------------------------------------------------------


@dataclass(slots=True)
class Order:
    """A server that holds, or waits for, cards of one GPU type."""

    owner: str  # "user/server"
    gpu_type: str
    cards: int
    pricing: str  # "spot" | "on-demand"
    max_price: Decimal | None = None  # spot only
    windows_only: bool = False
    created: float = 0.0


@dataclass
class TypeBook:
    """One GPU type's running spot servers and queued requests, kept sorted between ticks.

    Running spot servers are sorted by (bid, created) so the lowest bid is first; queued spot
    requests by (-bid, created) so the highest bid is first. Insertions and removals are bisects,
    so a tick never sorts.
    """

    running: list[tuple[Decimal, float, str]] = field(default_factory=list)
    queued: list[tuple[Decimal, float, str]] = field(default_factory=list)
    queued_windows: list[tuple[Decimal, float, str]] = field(default_factory=list)
    queued_on_demand: deque[str] = field(default_factory=deque)
    orders: dict[str, Order] = field(default_factory=dict)
    running_windows: set[str] = field(default_factory=set)
    preempting: dict[str, str] = field(default_factory=dict)  # owner -> reason
    running_cards: int = 0
    queued_cards: int = 0

    @staticmethod
    def _run_key(o: Order) -> tuple[Decimal, float, str]:
        return (o.max_price or Decimal(0), o.created, o.owner)

    @staticmethod
    def _queue_key(o: Order) -> tuple[Decimal, float, str]:
        return (-(o.max_price or Decimal(0)), o.created, o.owner)

    def add_running(self, o: Order) -> None:
        """A spot server that holds cards (on-demand servers are not in the book)."""
        self.orders[o.owner] = o
        bisect.insort(self.running, self._run_key(o))
        self.running_cards += o.cards
        if o.windows_only:
            self.running_windows.add(o.owner)

    def add_queued(self, o: Order) -> None:
        self.orders[o.owner] = o
        self.queued_cards += o.cards
        if o.pricing == "on-demand":
            self.queued_on_demand.append(o.owner)
        else:
            bisect.insort(
                self.queued_windows if o.windows_only else self.queued, self._queue_key(o)
            )

    def remove(self, owner: str) -> Order | None:
        o = self.orders.pop(owner, None)
        if o is None:
            return None
        self.preempting.pop(owner, None)
        run_key = self._run_key(o)
        i = bisect.bisect_left(self.running, run_key)
        if i < len(self.running) and self.running[i] == run_key:
            del self.running[i]
            self.running_cards -= o.cards
            self.running_windows.discard(owner)
            return o
        self.queued_cards -= o.cards
        if o.pricing == "on-demand":
            self.queued_on_demand.remove(owner)
            return o
        book = self.queued_windows if o.windows_only else self.queued
        q_key = self._queue_key(o)
        i = bisect.bisect_left(book, q_key)
        if i < len(book) and book[i] == q_key:
            del book[i]
        return o

    @property
    def queue_length(self) -> int:
        """How many requests wait for this type."""
        return len(self.orders) - len(self.running)

    def queue_position(self, owner: str) -> int | None:
        """A queued request's place (1 = next) in the order the market serves the queue:
        on-demand requests first (arrival order), then spot bids, highest first (window-only
        ones among them, though they start only inside a window). None if not queued."""
        o = self.orders.get(owner)
        if o is None or self.is_running(owner):
            return None
        if o.pricing == "on-demand":
            return list(self.queued_on_demand).index(owner) + 1
        key = self._queue_key(o)
        # Both spot queues are sorted by (-bid, created): a bisect counts the bids ahead.
        ahead = sum(bisect.bisect_left(q, key) for q in (self.queued, self.queued_windows))
        return len(self.queued_on_demand) + ahead + 1

    def is_running(self, owner: str) -> bool:
        o = self.orders.get(owner)
        if o is None:
            return False
        key = self._run_key(o)
        i = bisect.bisect_left(self.running, key)
        return i < len(self.running) and self.running[i] == key


@dataclass
class Decisions:
    """What one tick decided for one GPU type; the caller carries it out."""

    starts: list[Order] = field(default_factory=list)
    preempt: list[tuple[str, str]] = field(default_factory=list)  # (owner, reason)
    cancel: list[str] = field(default_factory=list)


def utilization(total: int, free: int, queued_cards: int) -> float:
    """Demand over supply: held cards plus cards asked for in the queue, over all cards."""
    if total <= 0:
        return 1.0
    return min(1.0, (total - free + queued_cards) / total)


def decide(
    book: TypeBook,
    free: int,
    price: Decimal,
    low_window: bool,
    held_need: int = 0,
    price_without: Callable[[int], Decimal] | None = None,
) -> Decisions:
    """One market tick for one GPU type. Pure: reads ``book``, changes nothing.

    1. Spot servers bidding below the price they are measured against are preempted; window-only
       ones are preempted when the low-price window ends. A preemption for price (or window end)
       is cancelled when the condition holds again before its deadline.
       ``price_without(cards)`` is the price were ``cards`` held cards free again: a spot holder
       is measured against ``price_without(its own cards)``, so a price that only its own cards
       raise (the last free card of a type, taken by itself) never preempts it; other holders'
       cards and queued demand still do. Without it every holder is measured against ``price``.
    2. Queued on-demand requests start first, in arrival order, on free cards; if cards are still
       missing, the lowest-bid spot servers not already leaving are preempted to make room. A
       reclaim no longer needed (the request was cancelled, a card freed) is cancelled.
    3. While no on-demand request waits, queued spot requests start by highest bid while their bid
       covers the price (window-only ones only inside a window) and cards are free.

    ``held_need``: cards that reservations and lab sessions need now but spot servers occupy;
    those spot servers are reclaimed like on-demand ones (lowest bids first), for ``reserved``.
    """
    d = Decisions()
    orders = book.orders
    bars: dict[int, Decimal] = {}

    def bar(o: Order) -> Decimal:
        """The price ``o`` is measured against: ``price`` less what its own cards add."""
        if price_without is None:
            return price
        if o.cards not in bars:
            bars[o.cards] = min(price, price_without(o.cards))
        return bars[o.cards]

    def keeps_running(o: Order) -> bool:
        return (
            o.max_price is not None and o.max_price >= bar(o) and (low_window or not o.windows_only)
        )

    incoming = 0  # cards that servers leaving for price or window end will give back
    reclaims = []  # servers leaving to make room for on-demand requests
    for owner, reason in book.preempting.items():
        o = orders[owner]
        if reason in (REASON_ON_DEMAND, REASON_HOLD):
            reclaims.append(owner)
        elif keeps_running(o):
            d.cancel.append(owner)
        else:
            incoming += o.cards
    cancelled = set(d.cancel)
    leaving = {owner for owner in book.preempting if owner not in cancelled}

    # Bids below the price are a prefix of the sorted running list; a holder's own bar is at
    # most the price, so only that prefix can be out-bid.
    cut = bisect.bisect_left(book.running, (price,))
    for _bid, _, owner in book.running[:cut]:
        if owner not in leaving and owner not in cancelled:
            o = orders[owner]
            if o.max_price is not None and o.max_price >= bar(o):
                continue  # only its own cards raise the price above its bid
            d.preempt.append((owner, REASON_PRICE))
            leaving.add(owner)
            incoming += orders[owner].cards
    if not low_window:
        for owner in book.running_windows:
            if owner not in leaving:
                d.preempt.append((owner, REASON_WINDOW))
                leaving.add(owner)
                incoming += orders[owner].cards

    available = free
    waiting_on_demand = 0
    for owner in book.queued_on_demand:
        o = orders[owner]
        if waiting_on_demand == 0 and o.cards <= available:
            d.starts.append(o)
            available -= o.cards
        else:
            waiting_on_demand += o.cards

    # Reclaims still needed (lowest bids first) stay; the rest are called off, e.g. when the
    # on-demand request was cancelled or a card freed by itself.
    need = waiting_on_demand + held_need - incoming
    reclaims.sort(key=lambda owner: book._run_key(orders[owner]))
    for owner in reclaims:
        o = orders[owner]
        if need > 0 or not keeps_running(o):
            need -= o.cards
        else:
            d.cancel.append(owner)
            leaving.discard(owner)
    if need > 0:
        for _, _, owner in book.running:
            if owner in leaving:
                continue
            d.preempt.append((owner, REASON_ON_DEMAND if waiting_on_demand else REASON_HOLD))
            leaving.add(owner)
            need -= orders[owner].cards
            if need <= 0:
                break
    if waiting_on_demand:
        return d

    # Queued spot: merge the two bid-sorted books (window-only ones only inside a window).
    books = [book.queued, book.queued_windows] if low_window else [book.queued]
    pos = [0] * len(books)
    neg_price = -price
    while available > 0:
        best = -1
        for b, lst in enumerate(books):
            if pos[b] < len(lst) and (best < 0 or lst[pos[b]] < books[best][pos[best]]):
                best = b
        if best < 0:
            break
        key = books[best][pos[best]]
        if key[0] > neg_price:  # bid below the price: nobody after it qualifies either
            break
        pos[best] += 1
        o = orders[key[2]]
        if o.cards <= available:
            d.starts.append(o)
            available -= o.cards
    return d
