"""A real spot server on a real hub is billed at the spot prices in force while its kernel ran.

The operator pins the price through the admin API while a real kernel runs; the billing service
(its own process) reads the market's price history from the data dir. The expected amount is
computed here from what the APIs show: the price history (spot prices API) and the billed span
(usage API).
"""

from __future__ import annotations

import csv
import io
import time
import uuid
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

import pytest
from billing.client import Billing
from harness import FAST_BILLING_ENV, HB, Hub, wait_for

ENV = {
    **FAST_BILLING_ENV,
    "GPULAB_BILLING_ARGS": f"--BillingService.heartbeat_interval={HB}",
}
ON_DEMAND = Decimal("0.68")  # rtx-4090 in the catalog


@pytest.fixture(scope="module")
def spot_bhub(module_hub_factory):
    h = module_hub_factory(
        "billing-spot",
        simulate="RTX-4090:1",
        env=ENV,
        # The prices applied are checked against the reporter's spans, to the second; what the
        # hub observes is billed on top of them (tests/e2e/test_observed_activity.py).
        extra_args=["--SpotMarket.tick_interval=0.5", "--ActivityObserver.bill_observed=False"],
    )
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


def pin(hub: Hub, price: str | None) -> None:
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": price})
    assert r.status_code == 200, r.text


def ts(iso: str) -> Decimal:
    """An API timestamp as exact seconds (the APIs give microseconds)."""
    dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return Decimal(int(dt.timestamp())) + Decimal(dt.microsecond) / 1_000_000


def test_spot_server_is_billed_at_the_prices_in_force(spot_bhub: Hub) -> None:
    hub, billing = spot_bhub, Billing(spot_bhub)
    user = hub.create_user(f"sb{uuid.uuid4().hex[:6]}")
    before = billing.balance(user)["balance"]["micro"]
    pin(hub, "0.35")
    hub.spawn_ready(user, {"gpu": "rtx-4090", "pricing": "spot", "max_price": 1})
    k = hub.kernel(user)
    assert k.execute("print(6 * 7)").strip() == "42"
    time.sleep(4)
    pin(hub, "0.65")  # still within the bid: the server keeps running
    time.sleep(4)
    pin(hub, "0.45")
    time.sleep(3)
    closed = time.time()
    k.close()
    hub.stop_server(user)

    def settled():
        usage = billing.usage(user)
        (s,) = usage["servers"]
        (kern,) = s["kernels"]
        done = s["stopped"] and float(ts(kern["last_seen"])) >= closed - 0.01
        return usage if done else None

    usage = wait_for(settled, 30, 0.5, "the kernel's stop in the statement")
    (s,) = usage["servers"]
    (kern,) = s["kernels"]
    assert s["pricing"] == "spot"
    start = max(ts(kern["first_seen"]), ts(s["started"]))
    end = min(ts(kern["last_seen"]), ts(s["stopped"]))
    assert Decimal(str(s["billed_seconds"])) == end - start
    assert 10 < end - start < 20

    # The price history as the market shows it; cut the billed span at each change.
    (prices,) = [
        t
        for t in hub.api("GET", "/gpulab/spot/prices?hours=1").json()["gpu_types"]
        if t["slug"] == "rtx-4090"
    ]
    history = [(Decimal(str(c["t"])), Decimal(c["price"])) for c in prices["history"]]
    with localcontext() as ctx:
        ctx.prec = 60
        exact = Decimal(0)
        changes = 0
        for i, (t, price) in enumerate(history):
            nxt = history[i + 1][0] if i + 1 < len(history) else end
            a, b = max(t, start), min(nxt, end)
            if b > a:
                exact += price * (b - a)
                changes += a > start
        exact_micro = exact / 3600 * 1_000_000
    amount = s["amount"]["micro"]
    assert abs(Decimal(amount) - exact_micro) <= Decimal("0.5"), (amount, exact_micro, history)
    assert amount == int(exact_micro.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    assert changes == 2 and s["spot"]["price_changes"] == 2, (history, s["spot"])
    avg = Decimal(s["spot"]["average_price_per_card_hour"])
    assert Decimal("0.35") < avg < Decimal("0.65")
    assert s["spot"]["seconds_without_spot_price"] == 0
    # Not the on-demand price: 0.68 (the ceiling of spot prices) over the same time would be a different amount.
    assert abs(Decimal(amount) - ON_DEMAND * (end - start) / 3600 * 1_000_000) > 100

    # The balance dropped by exactly that amount.
    wait_for(
        lambda: billing.balance(user)["balance"]["micro"] == before - amount,
        10,
        0.5,
        f"the balance to drop by {amount} micro",
    )
    assert usage["total"]["amount"]["micro"] == amount
    # The statement page says the same to the user.
    page = billing.get("", params={"user": user})
    assert page.status_code == 200, page.text
    assert f"spot: average {avg}/card-h, 2 price changes" in page.text

    # The CSV export says the same: spot pricing, the average price and each spot price applied
    # with the seconds it priced, which add up to the statement's amount.
    r = billing.get("statement.csv", params={"user": user})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    (server_row,) = [row for row in rows if row["row"] == "server"]
    assert server_row["pricing"] == "spot" and server_row["mode"] == s["mode"]
    assert Decimal(server_row["amount_CNY"]) == Decimal(s["amount"]["exact"])
    assert Decimal(server_row["price_per_card_hour"]) == avg
    rates = [row for row in rows if row["row"] == "rate"]
    assert [Decimal(row["price_per_card_hour"]) for row in rates] == [
        Decimal("0.35"),
        Decimal("0.65"),
        Decimal("0.45"),
    ]
    assert all(row["pricing"] == "spot" for row in rates)
    assert sum(Decimal(row["billed_seconds"]) for row in rates) == Decimal(str(s["billed_seconds"]))
    with localcontext() as ctx:
        ctx.prec = 60
        rated = sum(
            Decimal(row["price_per_card_hour"]) * Decimal(row["billed_seconds"]) for row in rates
        )
        assert abs(rated / 3600 * 1_000_000 - amount) <= Decimal("0.5")
    (kernel_row,) = [row for row in rows if row["row"] == "kernel"]
    assert kernel_row["kernel_id"] == kern["kernel_id"]
    pin(hub, None)


def test_start_check_uses_the_spot_price_for_a_spot_server(spot_bhub: Hub) -> None:
    """1 minute (this hub's minimum) of an RTX 4090 costs 0.011333 on demand but 0.005833 at a
    spot price of 0.35: a balance of 0.008 starts the spot server and not the on-demand one."""
    hub, billing = spot_bhub, Billing(spot_bhub)
    user = hub.create_user(f"sc{uuid.uuid4().hex[:6]}")
    billing.credit(user, "-9.992")
    pin(hub, "0.35")
    try:
        free = hub.free("rtx-4090")
        r = hub.spawn(user, {"gpu": "rtx-4090"})
        assert r.status_code == 402, r.text
        assert "cannot pay for 1 minutes of RTX 4090 x1 (CNY 0.68/h" in r.json()["message"]
        assert hub.server(user) is None and hub.free("rtx-4090") == free

        spot = {"gpu": "rtx-4090", "pricing": "spot", "max_price": 1}
        hub.spawn_ready(user, spot)
        assert hub.free("rtx-4090") == free - 1
        hub.stop_server(user)
        wait_for(lambda: hub.free("rtx-4090") == free, 30, 0.2, "the GPU to return")

        # Below even a minute at the spot price: refused, and the message quotes that price.
        bal = Decimal(billing.balance(user)["balance"]["exact"])
        billing.credit(user, str(Decimal("0.004") - bal))
        r = hub.spawn(user, spot)
        assert r.status_code == 402, r.text
        message = r.json()["message"]
        assert "1 minutes of RTX 4090 x1 (spot price CNY 0.35/h, CNY 0.01 for 1" in message
        assert hub.server(user) is None and hub.free("rtx-4090") == free
    finally:
        pin(hub, None)
