"""Spot never costs more than the bid: every spot second at min(price in force, the bid).

The case from the issue: bid 0.50, the price 0.40 for 15.9 s then 0.60 for 13.9 s (the warning
period before the reclaim). Before, those 13.9 s cost 0.60; now they cost the bid.
"""

from __future__ import annotations

import csv
import io
import time
import uuid
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from pathlib import Path
from typing import Any

from billing.scenario import heartbeat, kernel, server_start, server_stop

from gpulab.billing_service import ledger, statements
from gpulab.billing_service.csv_export import render
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import PriceBook, bid_of
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import load_catalog
from gpulab.catalog.price_history import PRICES_FILE, PriceHistory, market_dir

CATALOG = load_catalog()
T0 = 1_780_000_000.0


def micro(pieces: list[tuple[str, str]]) -> int:
    with localcontext() as ctx:
        ctx.prec = 60
        exact = sum(Decimal(p) * Decimal(s) for p, s in pieces) / 3600
        return int((exact * MICRO).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def spot_store(tmp_path: Path, prefix: str) -> tuple[Any, str, dict]:
    """A fresh billing store, a new user, and their spot server's start (bid 0.5) at T0."""
    engine = make_engine(f"sqlite:///{tmp_path / 'billing.sqlite'}")
    upgrade(engine)
    user = f"{prefix}{uuid.uuid4().hex[:8]}"
    start = server_start(user, T0)
    start["pricing"] = "spot"
    start["options"] = {**start["options"], "pricing": "spot", "max_price": "0.5"}
    return engine, user, start


def test_bid_parsing() -> None:
    assert bid_of({"max_price": "0.5"}) == Decimal("0.5")
    assert bid_of('{"max_price": 0.5}') == Decimal("0.5")
    assert bid_of({"max_price": "0.12345678"}) == Decimal("0.123456")  # rounded down
    for bad in ({}, {"max_price": None}, {"max_price": "x"}, {"max_price": True}, "not json"):
        assert bid_of(bad) is None


def test_price_above_the_bid_is_charged_at_the_bid(tmp_path: Path) -> None:
    hist = PriceHistory(market_dir(tmp_path) / PRICES_FILE)
    assert hist.record("a100-80g", T0 - 10, Decimal("0.40"))
    assert hist.record("a100-80g", T0 + 15.9, Decimal("0.60"))
    prices = PriceBook(CATALOG, tmp_path)
    span = [(round(T0 * MICRO), round((T0 + 29.8) * MICRO))]
    capped = prices.rate("a100-80g", 1, "spot", span, Decimal("0.50"))
    assert capped.amount_micro == micro([("0.40", "15.9"), ("0.50", "13.9")])
    assert capped.capped_us == round(13.9 * MICRO)
    # What it used to cost: the price in force all along.
    assert prices.cost_micro("a100-80g", 1, "spot", span) == micro(
        [("0.40", "15.9"), ("0.60", "13.9")]
    )
    # On-demand sessions have no bid; a bid never raises a price.
    assert prices.rate("a100-80g", 1, "spot", span, Decimal("5")).capped_us == 0

    # Through the store: the session is charged the capped amount and says so.
    engine, user, start = spot_store(tmp_path, "c")
    events = [
        start,
        kernel("kernel_start", user, "k1", T0),
        heartbeat(user, T0 + 10, ["k1"]),
        heartbeat(user, T0 + 20, ["k1"]),
        kernel("kernel_stop", user, "k1", T0 + 29.8),
        server_stop(user, T0 + 30),
    ]
    ingest(engine, parse_batch({"events": events}, time.time()), prices, 10 * MICRO, 0)
    want = micro([("0.40", "15.9"), ("0.50", "13.9")])
    with engine.connect() as conn:
        assert ledger.balance(conn, user) == 10 * MICRO - want
        usage = statements.usage(conn, prices, user, 0, round((T0 + 3600) * MICRO))
    (s,) = usage["servers"]
    assert s["amount"]["micro"] == want
    assert s["spot"]["bid_per_card_hour"] == "0.5" and s["spot"]["capped_seconds"] == 13.9
    (cap,) = s["spot"]["capped"]
    assert (cap["price_in_force"], cap["charged"], cap["seconds"]) == ("0.60", "0.5", 13.9)
    assert cap["from"].startswith("2026-05-28T") and cap["to"] == statements.iso(span[0][1])
    assert [(r["price_per_card_hour"], r["capped"]) for r in s["rates"]] == [
        ("0.40", False),
        ("0.5", True),
    ]
    text = render(usage)
    assert "amount_CNY,bid_per_card_hour,price_in_force,capped_seconds" in text.splitlines()[0]
    rows = list(csv.DictReader(io.StringIO(text)))
    (server_row,) = [r for r in rows if r["row"] == "server"]
    assert (server_row["bid_per_card_hour"], server_row["capped_seconds"]) == ("0.5", "13.9")
    capped_row = [r for r in rows if r["row"] == "rate"][1]
    assert (capped_row["price_per_card_hour"], capped_row["price_in_force"]) == ("0.5", "0.60")
    assert capped_row["capped_seconds"] == capped_row["billed_seconds"] == "13.9"
    engine.dispose()


def test_a_gap_in_billed_time_keeps_one_rate_row_per_spot_price(tmp_path: Path) -> None:
    """Two kernels with idle time between them, all at one spot price: the statement shows that
    price once, with the billed seconds of both (the gap not billed), not once per kernel."""
    hist = PriceHistory(market_dir(tmp_path) / PRICES_FILE)
    assert hist.record("a100-80g", T0 - 10, Decimal("0.40"))
    prices = PriceBook(CATALOG, tmp_path)
    engine, user, start = spot_store(tmp_path, "g")
    events = [
        start,
        kernel("kernel_start", user, "k1", T0),
        kernel("kernel_stop", user, "k1", T0 + 5),
        kernel("kernel_start", user, "k2", T0 + 9),
        heartbeat(user, T0 + 15, ["k2"]),
        kernel("kernel_stop", user, "k2", T0 + 21),
        server_stop(user, T0 + 30),
    ]
    ingest(engine, parse_batch({"events": events}, time.time()), prices, 10 * MICRO, 0)
    with engine.connect() as conn:
        usage = statements.usage(conn, prices, user, 0, round((T0 + 3600) * MICRO))
    (s,) = usage["servers"]
    (rate,) = s["rates"]
    assert (rate["price_per_card_hour"], rate["billed_seconds"]) == ("0.40", 17.0)
    assert rate["from"] == statements.iso(round(T0 * MICRO))
    assert rate["to"] == statements.iso(round((T0 + 21) * MICRO))
    assert s["amount"]["micro"] == micro([("0.40", "17")])
    engine.dispose()
