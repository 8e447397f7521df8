"""Which server a one-click app launch starts: the cheapest GPU type with a free card that fits.

A pure function of the catalog, the free cards and the prices in force, so the hub's launch API
and its tests agree on every choice. Refusals name what to pick instead. Prices come from the one
price function billing rates by (:func:`gpulab.catalog.pricing.quote`): a course student's
launch is priced at the education price, a spot launch at the spot price in force.

:func:`plan_table` is what the home page's tiles show: for every GPU choice of the tile's
dropdown and both pricings, what a click would start and at which price, so the tile's "Now:"
line follows the user's choice without the page computing a price itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpulab.catalog import NO_GPU, App, Catalog
from gpulab.catalog.pricing import ON_DEMAND, quote
from gpulab.spawners.options import PRICING, OptionsError, app_gpu_types, parse_max_price

# A tile's GPU choice that names no type: the cheapest free one that fits.
CHEAPEST = ""


class LaunchRefused(Exception):
    """A launch that cannot go ahead; ``status`` is the HTTP answer, the message names a fix
    (in the API's words); ``human`` says it to a person, ``details`` the refused field."""

    def __init__(
        self, status: int, message: str, human: str = "", details: dict | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.human = human
        self.details = dict(details or {})


@dataclass(frozen=True)
class Choice:
    gpu: str  # a GPU type slug or NO_GPU
    price: Decimal  # per hour, in the catalog's currency
    free: int
    kind: str = ON_DEMAND  # the price's kind: "on-demand", "spot" or "education"


def _need(app: App) -> str:
    return f"a card with at least {app.min_vram_gb} GB of VRAM" if app.min_vram_gb else "a card"


def plan_launch(
    app: App,
    catalog: Catalog,
    counts: dict[str, dict[str, int]],
    spot_prices: dict[str, Decimal],
    body: dict[str, Any],
    *,
    education: bool = False,
) -> tuple[dict[str, Any], Choice]:
    """The spawn options for launching ``app`` with the user's ``body`` (pricing, max_price, and
    optionally gpu and datasets), and the choice made. ``education``: the user is a course's
    student (their server runs under a course, so on demand it pays the education price; so does
    a ``course`` in the body). Raises :class:`LaunchRefused`."""
    fields = ("pricing", "max_price", "confirm_max_price", "gpu", "datasets", "course")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise LaunchRefused(
            400,
            f"{unknown[0]}: unknown field; allowed: {', '.join(fields)}",
            "",
            {"field": unknown[0]},
        )
    pricing = body.get("pricing") or "on-demand"
    if pricing not in PRICING:
        raise LaunchRefused(
            400, f"pricing: unknown pricing {pricing!r}; allowed: {', '.join(PRICING)}"
        )
    options: dict[str, Any] = {"app": app.slug, "pricing": pricing}
    for key in ("max_price", "confirm_max_price", "datasets", "course"):
        if body.get(key) is not None:
            options[key] = body[key]
    education = education or body.get("course") is not None
    bid = _bid(body) if pricing == "spot" else None

    def choice(gpu: str, free: int) -> Choice:
        price, kind = _quote(catalog, spot_prices, gpu, pricing, bid, education)
        return Choice(gpu, price, free, kind)

    fits = app_gpu_types(app, catalog)
    if body.get("gpu") is not None:
        # The user picked: the spawn's own checks (options, cards, market) answer for it.
        options["gpu"] = body["gpu"]
        gpu = str(body["gpu"])
        return options, choice(gpu, counts.get(gpu, {}).get("free", 0))
    if NO_GPU in fits and pricing == "on-demand":
        options["gpu"] = NO_GPU
        return options, choice(NO_GPU, 0)

    max_price = None
    if pricing == "spot" and body.get("max_price") is not None:
        try:
            # The options' one reader of a max price (a 400 naming it, never a default instead).
            max_price = parse_max_price(body["max_price"])
        except OptionsError as e:
            raise LaunchRefused(400, str(e), e.human, e.details()) from None
    candidates: list[Choice] = []
    too_dear: list[str] = []
    for slug in fits:
        if slug == NO_GPU:
            continue
        gt = catalog.gpu_types[slug]
        free = counts.get(slug, {}).get("free", 0)
        if free < 1:
            continue
        # The spot price in force, uncapped: a type dearer than the max price is not admitted.
        price, kind = _quote(catalog, spot_prices, slug, pricing, None, education)
        if max_price is not None and price > max_price:
            too_dear.append(f"{gt.display_name} at {price}")
            continue
        candidates.append(Choice(slug, price, free, kind))
    if not candidates:
        human = ""
        if too_dear:
            human = (
                f"No free card for {app.display_name} is within your max price "
                f"({catalog.currency} {max_price} per hour): {', '.join(too_dear)}. Raise your "
                "max price, or launch it on demand."
            )
        raise LaunchRefused(
            409, _no_card_message(app, catalog, counts, fits, too_dear, max_price), human
        )
    best = min(candidates, key=lambda c: c.price)  # min() keeps catalog order among equals
    options["gpu"] = best.gpu
    return options, best


def _bid(body: dict[str, Any]) -> Decimal | None:
    """The body's max price as a bid for pricing, or None where it is unreadable (the spawn's
    own check refuses that, naming the field)."""
    try:
        bid = Decimal(str(body["max_price"])) if body.get("max_price") is not None else None
    except ArithmeticError:
        return None
    return bid if bid is not None and bid.is_finite() and bid > 0 else None


def _quote(
    catalog: Catalog,
    spot_prices: dict[str, Decimal],
    gpu: str,
    pricing: str,
    bid: Decimal | None,
    education: bool,
) -> tuple[Decimal, str]:
    """(per hour for one card, its kind) from the one price function: the spot price in force
    (on-demand where the market has none), the on-demand or education price, or no-GPU mode's
    for NO_GPU (and for a type the spawn will refuse)."""
    if gpu not in catalog.gpu_types:
        gpu, pricing = NO_GPU, "on-demand"
    q = quote(
        catalog,
        gpu,
        1,
        pricing if gpu != NO_GPU else "on-demand",
        spot_price=spot_prices.get(gpu),
        bid=bid,
        education=education,
    )
    return q.per_hour, q.kind


def plan_table(
    app: App,
    catalog: Catalog,
    counts: dict[str, dict[str, int]],
    spot_prices: dict[str, Decimal],
    choices: list[str],
    *,
    education: bool = False,
) -> dict[str, dict[str, dict[str, Any]]]:
    """What a home page tile's click starts, for each of its GPU ``choices`` ("" first: the
    cheapest free one that fits) and each pricing: ``{"gpu", "price_per_hour", "price_kind"}``
    or ``{"refused": why}``, in plain words."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for gpu in [CHEAPEST, *choices]:
        row: dict[str, dict[str, Any]] = {}
        for pricing in PRICING:
            if gpu == NO_GPU and pricing == "spot":
                row[pricing] = {
                    "refused": f"{catalog.no_gpu.display_name} has no spot price: untick "
                    "Spot, or pick a GPU."
                }
                continue
            if gpu and gpu != NO_GPU and counts.get(gpu, {}).get("free", 0) < 1:
                name = catalog.gpu_types[gpu].display_name if gpu in catalog.gpu_types else gpu
                row[pricing] = {"refused": f"No {name} card is free right now: pick another."}
                continue
            body: dict[str, Any] = {"pricing": pricing}
            if gpu:
                body["gpu"] = gpu
            try:
                _, c = plan_launch(app, catalog, counts, spot_prices, body, education=education)
            except LaunchRefused as e:
                row[pricing] = {"refused": str(e)}
                continue
            row[pricing] = {"gpu": c.gpu, "price_per_hour": str(c.price), "price_kind": c.kind}
        table[gpu] = row
    return table


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
