"""A spot holder is never preempted by a price that only its own cards raise (issue 26, F5).

Utilisation pricing counts held cards, so the spot server (or job) that takes the last free card
of a type moves that type's price to the on-demand price by itself. The market measured it
against that price and warned it at once, though nobody else wanted the card: it could never run
past the warning period. The market's rule now measures each holder against the price less its
own cards; other holders' cards and queued demand still out-bid it, as before.
"""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpulab.catalog import load_catalog
from gpulab.spawners.market.core import (
    REASON_ON_DEMAND,
    REASON_PRICE,
    Order,
    TypeBook,
    decide,
    spot_price,
    utilization,
)
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.pool import GpuPool

CATALOG = load_catalog()
H100 = CATALOG.gpu_types["h100-80g"]  # floor 2.00, on demand 3.80


def price_of(total: int, held: int, queued: int) -> Decimal:
    """The published price of the H100 type with ``held`` of ``total`` cards held."""
    u = utilization(total, total - held, queued)
    return spot_price(H100.spot_floor_price, H100.on_demand_price, u, False)


def tick(total: int, spot: dict[str, tuple[str, int]], on_demand_held: int = 0, queued=()):
    """One tick as the hub runs it: ``spot`` owner -> (bid, cards) running; ``on_demand_held``
    cards held by on-demand servers; ``queued`` orders waiting."""
    book = TypeBook()
    for i, (owner, (bid, cards)) in enumerate(spot.items()):
        book.add_running(Order(owner, "h100-80g", cards, "spot", Decimal(bid), False, i))
    for o in queued:
        book.add_queued(o)
    held = on_demand_held + book.running_cards
    free = total - held
    price = price_of(total, held, book.queued_cards)
    d = decide(
        book,
        free,
        price,
        False,
        price_without=lambda cards: price_of(total, held - cards, book.queued_cards),
    )
    return book, price, d


CASES = [
    # (case, total cards, spot holders {owner: (bid, cards)}, on-demand held, expected preempted)
    ("the only card of a one-card type, bid at the floor", 1, {"a/": ("2.00", 1)}, 0, []),
    ("the last card of a full node (3.01 without it)", 4, {"a/": ("3.10", 1)}, 3, []),
    ("all four cards of a type, one holder", 4, {"a/": ("2.00", 4)}, 0, []),
    # Two holders of a 2-card type: with both held the price is 3.80; without one's own card it
    # is 2.45. The low bid is still out-bid by the other's card; the higher one keeps running.
    ("two holders: the other's card out-bids the low bid", 2, {"a/": ("2.20", 1), "b/": ("2.50", 1)}, 0, ["a/"]),
    ("two holders: both bids cover the price without their own card", 2, {"a/": ("2.45", 1), "b/": ("2.50", 1)}, 0, []),
    ("on-demand cards still out-bid a spot holder", 4, {"a/": ("2.50", 1)}, 3, ["a/"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "total", "spot", "on_demand", "expected"), CASES)
def test_a_holder_is_measured_against_the_price_without_its_own_cards(
    case: str, total: int, spot: dict, on_demand: int, expected: list[str]
) -> None:
    book, price, d = tick(total, spot, on_demand)
    assert [o for o, _ in d.preempt] == expected, (case, price)
    assert all(reason == REASON_PRICE for _, reason in d.preempt)
    # The published price still counts every held card (billing's price in force is unchanged).
    assert price == price_of(total, on_demand + book.running_cards, 0)


def test_before_the_fix_the_only_holder_was_out_bid_by_its_own_card() -> None:
    """The price the old rule used: the holder's own card takes the price to on-demand."""
    book, price, _ = tick(1, {"a/": ("2.00", 1)})
    assert price == H100.on_demand_price
    assert decide(book, 0, price, False).preempt == [("a/", REASON_PRICE)]


def test_other_demand_still_out_bids_the_holder() -> None:
    """Another user's queued spot request for the one card raises the price without the
    holder's card too: the holder is out-bid as before."""
    waiting = Order("w/", "h100-80g", 1, "spot", Decimal("3.00"), False, 5)
    _, price, d = tick(1, {"a/": ("2.00", 1)}, queued=[waiting])
    assert price == H100.on_demand_price
    assert d.preempt == [("a/", REASON_PRICE)]


def test_on_demand_request_still_reclaims_the_holder() -> None:
    waiting = Order("od/", "h100-80g", 1, "on-demand", None, False, 5)
    _, _, d = tick(1, {"a/": ("3.80", 1)}, queued=[waiting])
    assert d.preempt == [("a/", REASON_ON_DEMAND)]


def test_a_warning_its_own_card_caused_is_called_off() -> None:
    """A holder warned for price (e.g. by the old rule, before a restart) keeps running once the
    price without its own cards is within its bid."""
    book, price, _ = tick(1, {"a/": ("2.00", 1)})
    book.preempting["a/"] = REASON_PRICE
    d = decide(book, 0, price, False, price_without=lambda cards: price_of(1, 1 - cards, 0))
    assert d.cancel == ["a/"] and d.preempt == []


@pytest.fixture
def h100_market(tmp_path):
    SpotMarket.clear_instance()
    GpuPool.clear_instance()
    config = Config()
    config.GpuPool.data_dir = str(tmp_path)
    config.GpuInventory.simulate_gpus = "H100-80G:1"
    # No low-price window: the prices below are the day's, whatever the hour the suite runs at
    # (18:00-09:00 and weekends are low by default; CI may run at night).
    config.SpotMarket.low_price_windows = []
    config.SpotMarket.weekends_low = False
    pool = GpuPool.instance(config=config)
    market = SpotMarket.instance(config=config, pool=pool)
    warned: list[tuple[str, str]] = []
    market.preemptions.warn = lambda alloc, order, reason, price: warned.append(
        (alloc.owner, reason)
    )
    market.warned = warned
    yield market
    SpotMarket.clear_instance()
    GpuPool.clear_instance()


def test_the_hub_market_lets_the_only_h100_holder_run(h100_market: SpotMarket) -> None:
    """The hub's tick on a one-card type: the spot holder at the floor is not warned, while the
    published price (what billing caps by the bid) is the on-demand price."""
    market = h100_market
    assert market.compute_price("h100-80g", 0) == H100.spot_floor_price
    market.bids["u/"] = Order("u/", "h100-80g", 1, "spot", Decimal("2.00"), False, 1)
    market.pool.allocator.allocate("u/", "h100-80g", 1, "spot")
    market.tick()
    assert market.current_price("h100-80g") == H100.on_demand_price
    assert market.compute_price("h100-80g", 0, without=1) == H100.spot_floor_price
    assert market.warned == []
    # Another user's spot request waiting for the card is demand: now the holder is out-bid.
    spawner = SimpleNamespace(owner="v/", user=SimpleNamespace(name="v"))
    market._spawners["v/"] = spawner
    market._enqueue(
        Order("v/", "h100-80g", 1, "spot", Decimal("3.80"), False, 2),
        SimpleNamespace(to_json=lambda: {}),
    )
    market.tick()
    assert market.warned == [("u/", REASON_PRICE)]
