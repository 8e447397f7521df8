"""One typed picture of the hub's GPUs at one moment: :func:`snapshot`.

The Prometheus collector (``collector.py``) and the admin console's API
(``hub_config/api/console.py``) both read this one value, so the console's numbers are the
metrics' numbers. It is built from the live objects of the hub process, on the event loop
(where the allocator and the market change them, so a snapshot is consistent): the pool and its
allocator (cards, allocations, holds), the spot market (queue, prices), the card sampler
(readings, idle time), the hub's spawners (who pays what) and the spawn log. Building it does
no I/O and no database query: the hub's users are walked in memory once, for the spawners that
hold cards.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpulab.catalog.pricing import quote
from gpulab.hub_config.metrics.sampler import CardSampler
from gpulab.hub_config.metrics.spawns import SPAWNS, SpawnRecord
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.allocator import RESERVED, Allocation
from gpulab.spawners.node.holds import Hold
from gpulab.spawners.node.inventory import GpuDevice
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.node.telemetry import CardReading

CARD_STATES = ("free", "held", "reserved", "offline")
PRICINGS = ("on_demand", "spot", "course", "reservation")
HOSTNAME = socket.gethostname()

# The hub app, kept by install() (plugin.attach) for callers that have none at hand.
_APP: list[Any] = []


@dataclass(frozen=True)
class CardView:
    """One card of the pool: where it is, who holds it, at what price, what it is doing."""

    uuid: str
    index: int
    type: str
    display_name: str
    node: str  # the cluster node's name, or this machine's host name
    model: str  # the device's name ("NVIDIA A100-SXM4-80GB", "A100 80GB (simulated)")
    minor: int | None
    simulated: bool
    state: str  # free | held | reserved (offline cards are counted in Snapshot.offline)
    user: str | None
    server: str | None
    since: float | None  # when its holder took it
    pricing: str | None  # on_demand | spot | course | reservation (held and reserved cards)
    price_per_hour: Decimal | None  # what its holder pays per card-hour now
    util_pct: float | None
    idle_seconds: float | None  # held cards: seconds since last seen busy
    reading: CardReading | None


@dataclass(frozen=True)
class AllocationView:
    """One server's cards (a switch's reservation for the next start is not one)."""

    owner: str
    user: str
    server: str
    type: str
    node: str
    pricing: str
    cards: int
    since: float


@dataclass(frozen=True)
class QueueEntry:
    """One request waiting in the spot market's queue."""

    id: str
    user: str
    server: str
    gpu_type: str
    gpus: int
    pricing: str
    max_price: Decimal | None
    current_price: Decimal | None
    queued_at: float
    position: int | None
    why: str


@dataclass(frozen=True)
class HoldView:
    """A reservation or booking that is not over: waiting (before it keeps cards) or active."""

    hold_id: str
    kind: str  # reservation | booking
    account: str
    type: str
    cards: int
    state: str  # waiting | active
    start: float
    end: float
    used: int  # cards its servers hold now


@dataclass(frozen=True)
class BookingView:
    """A lab session whose window is open: its booked cards with a ready server, and without."""

    hold_id: str
    course: str
    type: str
    cards: int
    ready: int
    not_ready: int


@dataclass(frozen=True)
class OfflineCards:
    """Cards of a cluster node that takes no servers now (down, drained, paused)."""

    type: str
    node: str
    simulated: bool
    count: int


@dataclass(frozen=True)
class Snapshot:
    time: float
    currency: str
    cards: tuple[CardView, ...]
    offline: tuple[OfflineCards, ...]
    allocations: tuple[AllocationView, ...]
    queues: tuple[QueueEntry, ...]
    spot_prices: dict[str, Decimal]  # per card-hour, types the market has priced
    holds: tuple[HoldView, ...]
    bookings: tuple[BookingView, ...]
    spawns: tuple[SpawnRecord, ...]  # oldest first, at most 200

    @property
    def types(self) -> list[str]:
        """The GPU types the pool has cards of (present or offline), sorted."""
        return sorted({c.type for c in self.cards} | {o.type for o in self.offline})


def install(app: Any) -> None:
    """Keep the hub ``app`` for :func:`snapshot` callers without one (plugin.attach)."""
    _APP[:] = [app]


def installed_app() -> Any:
    return _APP[0] if _APP else None


def node_name(pool: GpuPool, device: GpuDevice) -> str:
    if device.node is None:
        return HOSTNAME
    return str(pool.cluster_nodes.get(device.node, {}).get("name") or device.node)


def pricing_label(alloc: Allocation, holds: dict[str, Hold], options: Any) -> str:
    """How a server's cards are paid: through a reservation, a course (a booking, or a course
    server), on spot or on demand."""
    hold = holds.get(alloc.hold_id) if alloc.hold_id else None
    if hold is not None:
        return "course" if hold.kind == "booking" else "reservation"
    if options is not None and getattr(options, "course", None):
        return "course"
    return "spot" if alloc.pricing == "spot" else "on_demand"


def _spawners_by_owner(app: Any, owners: set[str]) -> dict[str, Any]:
    """The hub's spawners of ``owners`` ("user/server"), found in memory (no DB query)."""
    out: dict[str, Any] = {}
    users = getattr(app, "users", None)
    if not owners or users is None:
        return out
    for user in list(users.values()):
        for name, spawner in list(user.spawners.items()):
            owner = f"{user.name}/{name}"
            if owner in owners:
                out[owner] = spawner
    return out


def snapshot(app: Any = None, *, now: float | None = None) -> Snapshot:
    """The pool, queue, holds and recent spawns now (see the module docstring); ``app`` the hub
    (default: the one :func:`install` kept), for who pays what."""
    app = app if app is not None else installed_app()
    config = getattr(app, "config", None)
    pool = GpuPool.instance(config=config) if config is not None else GpuPool.instance()
    market = SpotMarket.instance(pool=pool) if SpotMarket.initialized() else None
    sampler = CardSampler.instance()
    now = time.time() if now is None else now
    catalog = pool.catalog
    allocator = pool.allocator
    holds = {h.hold_id: h for h in allocator.holds}
    allocations = allocator.allocations
    held = {u: a for a in allocations for u in a.uuids}
    spawners = _spawners_by_owner(app, {a.owner for a in allocations if a.uuids})
    latest = sampler.latest()
    prices: dict[str, Decimal] = {}
    if market is not None:
        for slug in catalog.gpu_types:
            price = market.history.latest(slug)
            if price is not None:
                prices[slug] = price

    # Free cards kept for holds count as reserved: per type, that many of the free ones.
    counts = allocator.counts()
    kept = {slug: c.get("held", 0) for slug, c in counts.items()}
    cards: list[CardView] = []
    devices = sorted(allocator.devices, key=lambda d: (d.node or "", d.index))
    for device in devices:
        alloc = held.get(device.uuid)
        node = node_name(pool, device)
        reading = latest.get(device.uuid)
        user = server = pricing = None
        since = price = idle = None
        if alloc is None:
            state = "free"
            if kept.get(device.gpu_type, 0) > 0:
                kept[device.gpu_type] -= 1
                state = "reserved"
        else:
            reserved = alloc.owner.endswith(RESERVED)
            owner = alloc.owner.removesuffix(RESERVED)
            user, _, server = owner.partition("/")
            state = "reserved" if reserved else "held"
            since = alloc.created
            spawner = spawners.get(alloc.owner)
            options = getattr(spawner, "gpulab_options", None)
            pricing = pricing_label(alloc, holds, options)
            price = _card_price(catalog, alloc, options, prices, market)
            if not reserved:
                idle = sampler.idle_seconds(device.uuid, now)
        cards.append(
            CardView(
                uuid=device.uuid,
                index=device.index,
                type=device.gpu_type,
                display_name=catalog.gpu_types[device.gpu_type].display_name,
                node=node,
                model=device.name,
                minor=device.minor,
                simulated=device.simulated,
                state=state,
                user=user,
                server=server,
                since=since,
                pricing=pricing,
                price_per_hour=price,
                util_pct=reading.util_pct if reading is not None else None,
                idle_seconds=idle,
                reading=reading,
            )
        )

    return Snapshot(
        time=now,
        currency=catalog.currency,
        cards=tuple(cards),
        offline=tuple(_offline(pool)),
        allocations=tuple(_allocations(pool, allocations, holds, spawners)),
        queues=tuple(_queue(market, prices) if market is not None else ()),
        spot_prices=prices,
        holds=tuple(_holds(allocations, holds.values(), now)),
        bookings=tuple(_bookings(allocations, holds.values(), spawners, now)),
        spawns=tuple(SPAWNS.records()),
    )


def _card_price(
    catalog: Any,
    alloc: Allocation,
    options: Any,
    prices: dict[str, Decimal],
    market: SpotMarket | None,
) -> Decimal | None:
    """What the holder pays per card-hour now, by the one price function billing rates by."""
    if alloc.gpu_type not in catalog.gpu_types:
        return None
    bid = None
    if alloc.pricing == "spot":
        order = market.bids.get(alloc.owner) if market is not None else None
        bid = order.max_price if order is not None else getattr(options, "max_price", None)
    try:
        q = quote(
            catalog,
            alloc.gpu_type,
            len(alloc.uuids),
            "spot" if alloc.pricing == "spot" else "on-demand",
            spot_price=prices.get(alloc.gpu_type),
            bid=bid,
            education=bool(getattr(options, "course", None)),
        )
    except (KeyError, ValueError):
        return None
    return q.per_card


def _allocations(
    pool: GpuPool, allocations: list[Allocation], holds: dict[str, Hold], spawners: dict
) -> list[AllocationView]:
    out = []
    for a in allocations:
        if not a.uuids or a.owner.endswith(RESERVED) or a.gpu_type is None:
            continue
        device = pool.inventory.by_uuid(a.uuids[0])
        user, _, server = a.owner.partition("/")
        options = getattr(spawners.get(a.owner), "gpulab_options", None)
        out.append(
            AllocationView(
                owner=a.owner,
                user=user,
                server=server,
                type=a.gpu_type,
                node=node_name(pool, device) if device is not None else "",
                pricing=pricing_label(a, holds, options),
                cards=len(a.uuids),
                since=a.created,
            )
        )
    return out


def _offline(pool: GpuPool) -> list[OfflineCards]:
    out = []
    for node_id, info in pool.cluster_nodes.items():
        takes = info.get("state") == "ready" and info.get("availability") == "active"
        slug = info.get("gpu_type")
        if takes or not info.get("gpus") or slug not in pool.catalog.gpu_types:
            continue
        out.append(
            OfflineCards(
                type=slug,
                node=str(info.get("name") or node_id),
                simulated=bool(info.get("simulated")),
                count=int(info["gpus"]),
            )
        )
    return out


def _queue(market: SpotMarket, prices: dict[str, Decimal]) -> list[QueueEntry]:
    out = []
    for entry in sorted(market.queue.values(), key=lambda e: e["order"].created):
        order = entry["order"]
        user, _, server = order.owner.partition("/")
        book = market.books.get(order.gpu_type)
        if order.pricing == "on-demand":
            why = "waiting for a spot server to give its card back"
        elif order.windows_only:
            why = "waiting for the low-price window and a card at or below the bid"
        else:
            why = "waiting for a free card at or below the bid"
        out.append(
            QueueEntry(
                id=entry["id"],
                user=user,
                server=server,
                gpu_type=order.gpu_type,
                gpus=order.cards,
                pricing=order.pricing,
                max_price=order.max_price,
                current_price=prices.get(order.gpu_type),
                queued_at=order.created,
                position=book.queue_position(order.owner) if book is not None else None,
                why=why,
            )
        )
    return out


def _holds(allocations: list[Allocation], holds: Any, now: float) -> list[HoldView]:
    used: dict[str, int] = {}
    for a in allocations:
        if a.hold_id:
            used[a.hold_id] = used.get(a.hold_id, 0) + len(a.uuids)
    return [
        HoldView(
            hold_id=h.hold_id,
            kind=h.kind,
            account=h.account,
            type=h.gpu_type,
            cards=h.cards,
            state="active" if now >= h.reclaim_from else "waiting",
            start=h.start,
            end=h.end,
            used=used.get(h.hold_id, 0),
        )
        for h in holds
        if now < h.end
    ]


def _bookings(
    allocations: list[Allocation], holds: Any, spawners: dict[str, Any], now: float
) -> list[BookingView]:
    out = []
    for h in holds:
        if h.kind != "booking" or not h.start <= now < h.end:
            continue
        ready = sum(
            len(a.uuids)
            for a in allocations
            if a.hold_id == h.hold_id and getattr(spawners.get(a.owner), "ready", False)
        )
        ready = min(ready, h.cards)
        out.append(
            BookingView(
                hold_id=h.hold_id,
                course=h.account.removeprefix("course:"),
                type=h.gpu_type,
                cards=h.cards,
                ready=ready,
                not_ready=h.cards - ready,
            )
        )
    return out
