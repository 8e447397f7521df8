"""What the market answers a spawn: :class:`MarketAnswer` when it may not allocate now, and
:class:`Admission`, an answer a spawn request carries on to the spawner.

:meth:`SpotMarket.admit` decides and changes the market's state; this module holds the pure part:
the reasons a spot request cannot start (:func:`spot_problems`) and the messages the user reads
(in the spawn form, or the REST API's answer) when a request is queued or refused.

Each answer has two texts: ``message`` in the API's words (``max_price``, ``"wait": true``, the
queue's URL) for API clients, and ``human`` in plain words for the form and the home page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal


class MarketAnswer(Exception):
    """A spawn that the market does not start now. ``status`` 202: queued; 409: refused.
    ``message`` names the API's fields; ``human`` says the same to a person."""

    def __init__(self, status: int, message: str, human: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.human = human or message


class Problem(str):
    """One reason a spot request cannot start: the string in the API's words, ``plain`` in a
    person's."""

    plain: str

    def __new__(cls, api: str, plain: str) -> Problem:
        out = super().__new__(cls, api)
        out.plain = plain
        return out


@dataclass(frozen=True)
class Admission:
    """The market's answer to one spawn, asked before JupyterHub's spawn began and carried by
    its :class:`~gpulab.spawners.request.SpawnRequest`, so that the start does not ask again:
    admission changes the market's state (bids, the queue, reclaims) and must run once per
    spawn."""

    refusal: MarketAnswer | None = None  # None: admitted


def spot_problems(
    slug: str,
    price: Decimal,
    bid: Decimal,
    cards: int,
    counts: dict[str, int],
    windows_only: bool,
    low_window: bool,
    windows: str,
    on_demand_waiting: bool,
    currency: str,
) -> list[Problem]:
    """Why a spot request for ``cards`` of ``slug`` at ``bid`` cannot start now (empty: it
    can). ``counts`` has the type's total and free cards; ``windows`` describes the low-price
    windows for the user."""
    problems: list[Problem] = []
    if price > bid:
        problems.append(
            Problem(
                f"the spot price of {slug} is {price} {currency}/card-hour, above your max_price "
                f"{bid}",
                f"the spot price of {slug} is {currency} {price} per card-hour, above your max "
                f"price of {currency} {bid}",
            )
        )
    if counts["free"] < cards:
        held = counts.get("held", 0)
        more = f" ({held} more held for reservations or lab sessions)" if held else ""
        text = f"{counts['free']} of {counts['total']} {slug} cards are free{more}"
        problems.append(Problem(text, text))
    if windows_only and not low_window:
        text = f"it is outside the low-price windows ({windows})"
        problems.append(Problem(text, text))
    if on_demand_waiting:
        problems.append(
            Problem(
                f"on-demand requests are waiting for {slug}",
                f"people who pay the on-demand price are waiting for {slug} cards",
            )
        )
    return problems


def _plain(problems: Sequence[str]) -> str:
    return "; ".join(getattr(p, "plain", p) for p in problems)


def reclaiming(slug: str, entry_id: str, warning_seconds: float) -> MarketAnswer:
    """An on-demand request queued while a spot server is reclaimed for it."""
    return MarketAnswer(
        202,
        f"No {slug} card is free; a spot server is being reclaimed for you (its user has "
        f"a {warning_seconds:.0f} s warning). Your request is queued as "
        f"{entry_id} and your server starts by itself when the card frees. "
        "See GET /hub/api/gpulab/spot/queue.",
        f"No {slug} card is free right now, so one that runs on spot pricing is being freed "
        f"for you (its user has {warning_seconds:.0f} seconds to save). Your server starts by "
        "itself as soon as the card is free; you can leave this page.",
    )


def queued(entry_id: str, problems: Sequence[str], price: Decimal, currency: str) -> MarketAnswer:
    """A spot request that waits (it asked to, or is window-only) for its price or a card."""
    return MarketAnswer(
        202,
        f"Queued as {entry_id}: " + "; ".join(problems) + ". Your server starts by "
        "itself when a card is free and the price is at most your max_price. Current "
        f"spot price: {price} {currency}/card-hour. See or cancel it at "
        "/hub/api/gpulab/spot/queue.",
        "Your spot server is waiting: " + _plain(problems) + ". It starts by itself when a "
        "card is free and the spot price is at most your max price (it is "
        f"{currency} {price} per card-hour now). You can cancel the wait on the Server "
        "Options page.",
    )


def refused(problems: Sequence[str], price: Decimal, currency: str) -> MarketAnswer:
    """A spot request that cannot start now and did not ask to wait."""
    return MarketAnswer(
        409,
        "Spot server not started: " + "; ".join(problems) + f". Current spot price: {price} "
        f"{currency}/card-hour. Raise the max price, or queue the request (the form's queue "
        'option; "wait": true in the API).',
        "Your spot server did not start: " + _plain(problems) + ". The spot price is "
        f"{currency} {price} per card-hour now. Raise your max price, or ask to queue it (on the "
        "Server Options page) so that it starts by itself when it can.",
    )
