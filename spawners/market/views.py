"""The market as JSON, for the API handlers, the spawn form and the JupyterLab extension.

:func:`prices_json`, :func:`queue_json`, :func:`queue_entry_json`, :func:`status_json` and
:func:`preemptions_json` read the market and change nothing (except that a GPU type's first
price may be computed and recorded, as :meth:`SpotMarket.current_price` does).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpulab.catalog.pricing import quote

if TYPE_CHECKING:
    from gpulab.spawners.market.hub import SpotMarket


def prices_json(market: SpotMarket, hours: float) -> dict[str, Any]:
    """Each traded GPU type's price, floor, on-demand price, cards and the last ``hours`` of
    price changes, with the market's schedule and timing."""
    now = time.time()
    since = now - hours * 3600
    types = []
    counts = market.pool.allocator.counts()
    for slug, gt in market.pool.catalog.gpu_types.items():
        c = counts.get(slug)
        if not c:
            continue
        book = market.books[slug]
        types.append(
            {
                "slug": slug,
                "display_name": gt.display_name,
                "price": str(market.current_price(slug)),
                "spot_floor_price": str(gt.spot_floor_price),
                "on_demand_price": str(gt.on_demand_price),
                "pinned": slug in market.pins,
                "total": c["total"],
                "free": c["free"],
                "queued": book.queue_length,
                "history": market.history.changes(slug, since),
            }
        )
    return {
        "currency": market.pool.catalog.currency,
        "time": now,
        "low_price_window": market.in_low_window(now),
        "timezone": market.timezone or str(market.local_now(now).tzinfo),
        "low_price_windows": list(market.low_price_windows),
        "weekends_low": market.weekends_low,
        "warning_seconds": market.warning_seconds,
        "tick_interval": market.tick_interval,
        "last_tick_ms": None
        if market.last_tick_seconds is None
        else round(market.last_tick_seconds * 1e3, 3),
        "gpu_types": types,
    }


def queue_entry_json(market: SpotMarket, entry: dict[str, Any]) -> dict[str, Any]:
    """One queued request as the API shows it, with its place in its GPU type's queue."""
    order = entry["order"]
    name, _, server = order.owner.partition("/")
    book = market.books[order.gpu_type]
    return {
        "id": entry["id"],
        "user": name,
        "server": server,
        "gpu_type": order.gpu_type,
        "gpus": order.cards,
        "pricing": order.pricing,
        "max_price": None if order.max_price is None else str(order.max_price),
        "windows_only": order.windows_only,
        "queued_at": order.created,
        "current_price": str(market.current_price(order.gpu_type)),
        "waiting_for": "reclaim" if order.pricing == "on-demand" else "match",
        "position": book.queue_position(order.owner),
        "queue_length": book.queue_length,
        "options": entry["options"],
    }


def queue_json(market: SpotMarket, user: str | None = None) -> list[dict[str, Any]]:
    """Queued requests (all, or ``user``'s), oldest first."""
    return [
        queue_entry_json(market, entry)
        for entry in sorted(market.queue.values(), key=lambda e: e["order"].created)
        if user is None or entry["order"].owner.partition("/")[0] == user
    ]


def status_json(market: SpotMarket, owner: str) -> dict[str, Any]:
    """One server's spot status: price, bid, its latest preemption and its queued request."""
    alloc = market.pool.allocator.get(owner)
    order = market.bids.get(owner) if alloc is not None else None
    records = market.preemptions.of_owner(owner)
    gpu_type = alloc.gpu_type if alloc is not None else None
    return {
        "server": owner,
        "running": alloc is not None,
        "pricing": alloc.pricing if alloc is not None else None,
        "gpu_type": gpu_type,
        "max_price": None if order is None or order.max_price is None else str(order.max_price),
        "windows_only": bool(order and order.windows_only),
        "price": str(market.current_price(gpu_type)) if gpu_type in market.books else None,
        # This server's price per hour now, by the one price function billing rates by.
        "price_per_hour": _price_per_hour(market, alloc, order),
        "currency": market.pool.catalog.currency,
        "low_price_window": market.in_low_window(),
        "warning_seconds": market.warning_seconds,
        # The JupyterLab extension saves open documents with changes this often on spot.
        "save_interval_seconds": market.save_interval,
        "time": time.time(),  # the hub's clock, for a countdown that ignores client skew
        # The JupyterLab extension saves open documents when this turns to a warning.
        "preemption": records[-1].public() if records else None,
        "queued": market.queued_entry(owner),
    }


def _price_per_hour(market: SpotMarket, alloc: Any, order: Any) -> str | None:
    """A running spot server's price per hour now (None for any other): the spot price in force,
    never above its bid, times its cards."""
    if alloc is None or alloc.pricing != "spot" or alloc.gpu_type not in market.books:
        return None
    q = quote(
        market.pool.catalog,
        alloc.gpu_type,
        len(alloc.uuids),
        "spot",
        spot_price=market.current_price(alloc.gpu_type),
        bid=None if order is None else order.max_price,
    )
    return str(q.per_hour)


def preemptions_json(market: SpotMarket, user: str | None = None) -> list[dict[str, Any]]:
    """Preemption records (all, or ``user``'s), oldest first."""
    return market.preemptions.public(user)
