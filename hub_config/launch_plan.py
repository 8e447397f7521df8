"""Which server a one-click app launch starts: the cheapest GPU type with a free card that fits.

A pure function of the catalog, the free cards and the prices in force, so the hub's launch API
and its tests agree on every choice. Refusals name what to pick instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpulab.catalog import NO_GPU, App, Catalog
from gpulab.spawners.options import PRICING, app_gpu_types


class LaunchRefused(Exception):
    """A launch that cannot go ahead; ``status`` is the HTTP answer, the message names a fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Choice:
    gpu: str  # a GPU type slug or NO_GPU
    price: Decimal  # per hour, in the catalog's currency
    free: int


def _need(app: App) -> str:
    return f"a card with at least {app.min_vram_gb} GB of VRAM" if app.min_vram_gb else "a card"


def plan_launch(
    app: App,
    catalog: Catalog,
    counts: dict[str, dict[str, int]],
    spot_prices: dict[str, Decimal],
    body: dict[str, Any],
) -> tuple[dict[str, Any], Choice]:
    """The spawn options for launching ``app`` with the user's ``body`` (pricing, max_price, and
    optionally gpu and datasets), and the choice made. Raises :class:`LaunchRefused`."""
    unknown = sorted(set(body) - {"pricing", "max_price", "gpu", "datasets", "course"})
    if unknown:
        raise LaunchRefused(
            400, f"{unknown[0]}: unknown field; allowed: pricing, max_price, gpu, datasets, course"
        )
    pricing = body.get("pricing") or "on-demand"
    if pricing not in PRICING:
        raise LaunchRefused(
            400, f"pricing: unknown pricing {pricing!r}; allowed: {', '.join(PRICING)}"
        )
    options: dict[str, Any] = {"app": app.slug, "pricing": pricing}
    for key in ("max_price", "datasets", "course"):
        if body.get(key) is not None:
            options[key] = body[key]
    fits = app_gpu_types(app, catalog)
    if body.get("gpu") is not None:
        # The user picked: the spawn's own checks (options, cards, market) answer for it.
        options["gpu"] = body["gpu"]
        gpu = str(body["gpu"])
        price = _price(catalog, spot_prices, gpu, pricing)
        return options, Choice(gpu, price, counts.get(gpu, {}).get("free", 0))
    if NO_GPU in fits and pricing == "on-demand":
        options["gpu"] = NO_GPU
        return options, Choice(NO_GPU, catalog.no_gpu.price_per_hour, 0)

    max_price = None
    if pricing == "spot" and body.get("max_price") is not None:
        try:
            max_price = Decimal(str(body["max_price"]))
        except ArithmeticError:
            raise LaunchRefused(
                400, f"max_price: must be a positive number, not {body['max_price']!r}"
            ) from None
    candidates: list[Choice] = []
    too_dear: list[str] = []
    for slug in fits:
        if slug == NO_GPU:
            continue
        gt = catalog.gpu_types[slug]
        free = counts.get(slug, {}).get("free", 0)
        if free < 1:
            continue
        price = _price(catalog, spot_prices, slug, pricing)
        if max_price is not None and price > max_price:
            too_dear.append(f"{gt.display_name} at {price}")
            continue
        candidates.append(Choice(slug, price, free))
    if not candidates:
        raise LaunchRefused(409, _no_card_message(app, catalog, counts, fits, too_dear, max_price))
    best = min(candidates, key=lambda c: c.price)  # min() keeps catalog order among equals
    options["gpu"] = best.gpu
    return options, best


def _price(catalog: Catalog, spot_prices: dict[str, Decimal], gpu: str, pricing: str) -> Decimal:
    """Per card-hour now: the spot price in force (on-demand where the market has none), the
    on-demand price, or no-GPU mode's for NO_GPU (and for a type the spawn will refuse)."""
    if gpu not in catalog.gpu_types:
        return catalog.no_gpu.price_per_hour
    on_demand = catalog.gpu_types[gpu].on_demand_price
    return spot_prices.get(gpu, on_demand) if pricing == "spot" else on_demand


def _no_card_message(
    app: App,
    catalog: Catalog,
    counts: dict[str, dict[str, int]],
    fits: list[str],
    too_dear: list[str],
    max_price: Decimal | None,
) -> str:
    cur = catalog.currency
    if too_dear:
        return (
            f"No free card for {app.display_name} at your max_price {max_price} {cur}/h: "
            f"{', '.join(too_dear)}. Raise max_price, launch on-demand, or launch on spot with "
            "a queue place (the spawn form's 'wait')."
        )
    busy = ", ".join(
        f"{catalog.gpu_types[s].display_name} {counts.get(s, {}).get('free', 0)}/"
        f"{counts.get(s, {}).get('total', 0)} free"
        for s in fits
        if s != NO_GPU
    )
    small = [
        f"{gt.display_name} ({gt.vram_gb} GB)"
        for slug, gt in catalog.gpu_types.items()
        if slug not in fits and counts.get(slug, {}).get("free", 0) > 0
    ]
    msg = f"No free card for {app.display_name}, which needs {_need(app)}"
    msg += f": {busy}." if busy else ": no GPU type in this catalog fits it."
    if small:
        msg += f" Free cards with too little VRAM for it: {', '.join(small)}."
    msg += " Pick JupyterLab (on a free GPU type or in no-GPU mode) or launch it again later."
    return msg
