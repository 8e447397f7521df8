"""What one hour of a server costs: the one price function every part of gpulab asks.

Billing's rating (``billing_service.rating``), the hub's balance check and home page
(``hub_config.billing.hooks.hourly_price``), the one-click launch plan (``hub_config.launch_plan``),
the spawn form, ``ServerOptions.price_per_hour`` (the price the status bar shows) and the hub's
spot status all price a server here, so a course student sees the education price billing
charges, and a spot server the spot price in force, everywhere.

The rules (the same ones billing has always rated by):

- no-GPU mode: the catalog's ``no_gpu.price_per_hour`` per hour, whatever the card count; a course
  session pays ``education_price_per_hour`` (where set);
- on-demand: the type's ``on_demand_price`` per card-hour; a course session pays its
  ``education_price`` (where set);
- spot: the spot price in force per card-hour (the on-demand price while the market has recorded
  none: its ceiling, so a missing price never gives GPU time away), never above the server's bid
  (``max_price``). Course sessions on spot follow the spot rules unchanged.

A home's storage is priced here too (``storage_quote``: per GB-day above the free size), for the
hub's storage API and page and billing's metering.

A pure function of its arguments: nothing is read from disk or the network here.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from gpulab.catalog.models import Catalog, GiB, Storage
from gpulab.catalog.no_gpu import NO_GPU

ON_DEMAND = "on-demand"
SPOT = "spot"
EDUCATION = "education"  # the kind of an on-demand course session's price
PRICINGS = (ON_DEMAND, SPOT)


@dataclass(frozen=True)
class Quote:
    """The price of a server now."""

    per_card: Decimal  # per card-hour (per hour in no-GPU mode)
    cards: int  # what ``per_card`` is multiplied by: the GPU count, 1 in no-GPU mode
    kind: str  # "on-demand", "spot" or "education": what billing rates its seconds as
    capped: bool = False  # spot: the bid is below the spot price in force (charged the bid)
    unpriced: bool = False  # spot: no spot price known (charged the on-demand price)

    @property
    def per_hour(self) -> Decimal:
        return self.per_card * self.cards

    @property
    def label(self) -> str:
        """A few words for messages: "education price ", "spot price " or "" (on-demand)."""
        return "" if self.kind == ON_DEMAND else f"{self.kind} price "


def quote(
    catalog: Catalog,
    gpu: str,
    gpus: int = 1,
    pricing: str = ON_DEMAND,
    *,
    spot_price: Decimal | None = None,
    bid: Decimal | None = None,
    education: bool = False,
) -> Quote:
    """What ``gpus`` cards of GPU type ``gpu`` (or ``NO_GPU``) cost per hour now.

    ``pricing`` is "on-demand" or "spot"; ``spot_price`` the spot price per card-hour in force
    (None: none known); ``bid`` the server's ``max_price`` per card-hour (spot only);
    ``education`` whether the server runs under a course (its ``course`` option). Raises KeyError
    for a GPU type the catalog does not have, ValueError for an unknown pricing."""
    if pricing not in PRICINGS:
        raise ValueError(f"pricing: unknown pricing {pricing!r}; allowed: {', '.join(PRICINGS)}")
    if gpu == NO_GPU:
        no_gpu = catalog.no_gpu
        if education:
            return Quote(no_gpu.course_price, 1, EDUCATION)
        return Quote(no_gpu.price_per_hour, 1, ON_DEMAND)
    gpu_type = catalog.gpu_types.get(gpu)
    if gpu_type is None:
        raise KeyError(f"unknown GPU type {gpu!r}")
    cards = int(gpus)
    if pricing == SPOT:
        unpriced = spot_price is None
        price = gpu_type.on_demand_price if spot_price is None else spot_price
        capped = bid is not None and price > bid
        return Quote(bid if capped else price, cards, SPOT, capped=capped, unpriced=unpriced)
    if education:
        return Quote(gpu_type.course_price, cards, EDUCATION)
    return Quote(gpu_type.on_demand_price, cards, ON_DEMAND)


def price_list(catalog: Catalog, education: bool = False) -> dict[str, object]:
    """One viewer's on-demand prices, for pages and extensions that list every choice (the
    JupyterLab switch dialog and no-GPU toggle): per GPU type its price per card-hour, and
    no-GPU mode's per hour, with their kind ("education" for a course's student)."""

    def entry(q: Quote) -> dict[str, str]:
        return {"price_per_hour": str(q.per_card), "price_kind": q.kind}

    return {
        "gpu_types": {
            slug: entry(quote(catalog, slug, 1, education=education)) for slug in catalog.gpu_types
        },
        "no_gpu": entry(quote(catalog, NO_GPU, education=education)),
    }


@dataclass(frozen=True)
class StorageQuote:
    """What a home costs per day: the bytes billed (above the free size) and their price."""

    billable_bytes: int
    per_day: Decimal  # exact, in the catalog's currency


def storage_quote(storage: Storage, quota_bytes: int, used_bytes: int = 0) -> StorageQuote:
    """One day of a home whose quota is ``quota_bytes`` and which holds ``used_bytes`` (its own
    files plus its owner's published datasets): ``max(quota, used) - free``, never below 0, at
    the catalog's ``storage.price_per_gb_day`` per GB (2**30 bytes), pro rata. No request fees."""
    billable = max(0, max(int(quota_bytes), int(used_bytes)) - storage.free_bytes)
    return StorageQuote(billable, Decimal(billable) / GiB * storage.price_per_gb_day)
