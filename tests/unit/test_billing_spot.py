"""Spot seconds rated at the spot price in force, read from the market's own price history.

The history is written through the market's store (``PriceHistory.record``, the same call the
hub's market makes), into a real file; billing reads that file, as the separate billing process
does. Expected amounts are computed here independently, with Decimal arithmetic.
"""

from __future__ import annotations

import time
import uuid
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from pathlib import Path

import pytest
from billing.scenario import heartbeat, kernel, server_start, server_stop

from gpulab.billing_service import ledger, statements
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import PriceBook
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import load_catalog
from gpulab.catalog.price_history import PRICES_FILE, PriceHistory, market_dir

CATALOG = load_catalog()
T0 = 1_780_000_000.0
A100_ON_DEMAND = Decimal("2.10")


def us(t: float) -> int:
    return round(t * MICRO)


def expected_micro(pieces: list[tuple[Decimal, float]], cards: int = 1) -> int:
    """sum(price per card-hour x seconds x cards) / 3600, rounded half-even once, in micro."""
    with localcontext() as ctx:
        ctx.prec = 60
        exact = sum(p * Decimal(str(s)) * cards for p, s in pieces) / 3600
        return int((exact * MICRO).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


@pytest.fixture
def market(tmp_path: Path):
    """A data dir whose spot price history is written the way the hub writes it."""
    hist = PriceHistory(market_dir(tmp_path) / PRICES_FILE)

    def record(gpu_type: str, t: float, price: str) -> None:
        assert hist.record(gpu_type, t, Decimal(price))

    return tmp_path, record


def test_price_changes_mid_interval_split_the_rating(market) -> None:
    data, record = market
    record("a100-80g", T0, "0.40")
    record("a100-80g", T0 + 100, "0.55")
    record("a100-80g", T0 + 250.5, "0.35")
    record("a100-80g", T0 + 1000, "0.90")  # after the interval: no effect
    record("rtx-4090", T0 + 200, "0.31")  # another type: no effect
    prices = PriceBook(CATALOG, data)
    interval = (us(T0 + 50), us(T0 + 400))
    rated = prices.rate("a100-80g", 1, "spot", [interval])
    want = expected_micro(
        [(Decimal("0.40"), 50), (Decimal("0.55"), 150.5), (Decimal("0.35"), 149.5)]
    )
    assert rated.amount_micro == want == prices.cost_micro("a100-80g", 1, "spot", [interval])
    assert rated.price_changes == 2 and rated.unpriced_us == 0
    assert rated.billed_us == 350 * MICRO
    assert prices.change_points("a100-80g", "spot", *interval) == [
        us(T0 + 100),
        us(T0 + 250.5),
    ]
    assert prices.price_at("a100-80g", "spot", us(T0 + 100)) == Decimal("0.55")
    assert prices.price_at("a100-80g", "spot", us(T0 + 100) - 1) == Decimal("0.40")
    # On-demand seconds of the same type ignore the market.
    assert prices.cost_micro("a100-80g", 1, "on-demand", [interval]) == expected_micro(
        [(A100_ON_DEMAND, 350)]
    )


def test_multi_card_several_intervals_and_a_change_on_a_boundary(market) -> None:
    data, record = market
    record("rtx-4090", T0, "0.30")
    record("rtx-4090", T0 + 60, "0.45")  # exactly where the second interval starts
    record("rtx-4090", T0 + 90.25, "0.68")
    record("rtx-4090", T0 + 95, "0.31")
    prices = PriceBook(CATALOG, data)
    intervals = [(us(T0 + 10), us(T0 + 40)), (us(T0 + 60), us(T0 + 120))]
    rated = prices.rate("rtx-4090", 4, "spot", intervals)
    want = expected_micro(
        [
            (Decimal("0.30"), 30),
            (Decimal("0.45"), 30.25),
            (Decimal("0.68"), 4.75),
            (Decimal("0.31"), 25),
        ],
        cards=4,
    )
    assert rated.amount_micro == want
    assert rated.price_changes == 2  # the change at 60 s is not inside a billed interval
    # Four cards cost exactly four times one card, before the single rounding.
    one = prices.rate("rtx-4090", 1, "spot", intervals)
    assert rated.exact == 4 * one.exact


def test_rounded_once_over_the_session_not_per_piece(market) -> None:
    data, record = market
    # Three 1 s pieces at 0.01, 0.02, 0.01 per hour: 2.78 + 5.56 + 2.78 micro = 11.11 micro.
    record("rtx-4090", T0, "0.01")
    record("rtx-4090", T0 + 1, "0.02")
    record("rtx-4090", T0 + 2, "0.01")
    prices = PriceBook(CATALOG, data)
    amount = prices.cost_micro("rtx-4090", 1, "spot", [(us(T0), us(T0 + 3))])
    assert amount == 11  # rounding each piece (3 + 6 + 3) would give 12


def test_no_recorded_price_falls_back_to_on_demand(market, tmp_path: Path) -> None:
    data, record = market
    # No history file at all, and no market dir: on-demand, and nothing crashes.
    for prices in (PriceBook(CATALOG, tmp_path / "nothing-here"), PriceBook(CATALOG)):
        rated = prices.rate("a100-80g", 2, "spot", [(us(T0), us(T0 + 30))])
        assert rated.amount_micro == expected_micro([(A100_ON_DEMAND, 30)], cards=2)
        assert rated.unpriced_us == 30 * MICRO and rated.price_changes == 0
        assert prices.price_at("a100-80g", "spot", us(T0)) == A100_ON_DEMAND
    # Time before the first recorded price is on-demand; from then on, the spot price.
    record("a100-80g", T0 + 20, "0.80")
    rated = PriceBook(CATALOG, data).rate("a100-80g", 1, "spot", [(us(T0), us(T0 + 30))])
    assert rated.amount_micro == expected_micro([(A100_ON_DEMAND, 20), (Decimal("0.80"), 10)])
    assert rated.unpriced_us == 20 * MICRO


def test_prices_written_later_by_another_process_are_read(market) -> None:
    data, record = market
    record("rtx-4090", T0, "0.50")
    prices = PriceBook(CATALOG, data)
    interval = [(us(T0), us(T0 + 60))]
    assert prices.cost_micro("rtx-4090", 1, "spot", interval) == expected_micro(
        [(Decimal("0.50"), 60)]
    )
    # The hub (its own PriceHistory on the same file) records a change billing has not seen yet.
    PriceHistory(market_dir(data) / PRICES_FILE).record("rtx-4090", T0 + 30, Decimal("0.40"))
    assert prices.cost_micro("rtx-4090", 1, "spot", interval) == expected_micro(
        [(Decimal("0.50"), 30), (Decimal("0.40"), 30)]
    )


def test_spot_session_charged_and_shown_at_spot_prices(market) -> None:
    """Through the store: events in, the ledger charged exactly, the statement says spot."""
    data, record = market
    record("rtx-4090", T0 - 5, "0.35")
    record("rtx-4090", T0 + 12.5, "0.60")
    record("rtx-4090", T0 + 20, "0.42")
    prices = PriceBook(CATALOG, data)
    engine = make_engine(f"sqlite:///{data / 'billing.sqlite'}")
    upgrade(engine)
    user = f"s{uuid.uuid4().hex[:8]}"
    start = server_start(user, T0, gpu="rtx-4090", gpus=2)
    start["pricing"] = "spot"
    events = [
        start,
        kernel("kernel_start", user, "k1", T0 + 2),
        heartbeat(user, T0 + 10, ["k1"]),
        heartbeat(user, T0 + 20, ["k1"]),
        kernel("kernel_stop", user, "k1", T0 + 27),
        server_stop(user, T0 + 30),
    ]
    trial = 10 * MICRO
    ingest(engine, parse_batch({"events": events}, time.time()), prices, trial, 0)
    want = expected_micro(
        [(Decimal("0.35"), 10.5), (Decimal("0.60"), 7.5), (Decimal("0.42"), 7)], cards=2
    )
    with engine.connect() as conn:
        assert ledger.balance(conn, user) == trial - want
        usage = statements.usage(conn, prices, user, 0, us(T0 + 3600))
    (server,) = usage["servers"]
    assert server["pricing"] == "spot" and server["amount"]["micro"] == want
    assert server["billed_seconds"] == 25
    assert server["price_per_hour"] == "0.7"  # 2 cards x 0.35 in force at the start
    # Average per card-hour = amount / card-hours, to the micro-unit.
    pieces = [("0.35", "10.5"), ("0.60", "7.5"), ("0.42", "7")]
    avg = sum(Decimal(p) * Decimal(s) for p, s in pieces) / 25
    spot = server["spot"]
    assert Decimal(spot["average_price_per_card_hour"]) == avg.quantize(Decimal("0.000001"))
    assert spot["price_changes"] == 2 and spot["seconds_without_spot_price"] == 0
    # The rates applied, each with the billed seconds it priced: they add up to the amount.
    assert [(r["price_per_card_hour"], r["billed_seconds"]) for r in server["rates"]] == [
        ("0.35", 10.5),
        ("0.60", 7.5),
        ("0.42", 7),
    ]
    assert all(r["spot_price_recorded"] for r in server["rates"])
    engine.dispose()
