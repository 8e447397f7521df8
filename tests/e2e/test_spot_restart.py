"""The spot market after a hub SIGKILL: warnings, deadlines, bids, the queue and prices survive."""

from __future__ import annotations

import time
from decimal import Decimal

from harness import wait_for

from gpulab.catalog.price_history import price_at

WARNING = 12


def test_sigkill_during_a_warning_keeps_the_deadline_bids_queue_and_prices(
    hub_factory,
) -> None:
    hub = hub_factory(
        simulate="RTX-4090:2",
        extra_args=[f"--SpotMarket.warning_seconds={WARNING}", "--SpotMarket.tick_interval=0.5"],
    )
    bidder, keeper, waiter = (hub.create_user() for _ in range(3))
    hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.30"})
    t_low = time.time()
    spot = {"gpu": "rtx-4090", "pricing": "spot"}
    hub.spawn_ready(bidder, {**spot, "max_price": "0.40"})
    hub.spawn_ready(keeper, {**spot, "max_price": "0.65"})
    r = hub.spawn(waiter, {**spot, "max_price": "0.35", "wait": True})
    assert r.status_code == 202, r.text  # no card is free: queued
    time.sleep(0.2)
    hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.60"})
    t_high = time.time()
    status = hub.api("GET", f"/gpulab/spot/status/{bidder}").json()
    deadline = status["preemption"]["deadline"]
    keeper_pid = hub.server(keeper)["state"]["pid"]

    hub.kill()
    hub.start()

    # The warning is still on, with the same deadline; the keeper's bid (0.65) is known.
    status = hub.api("GET", f"/gpulab/spot/status/{bidder}").json()
    assert status["preemption"]["deadline"] == deadline
    if time.time() < deadline - 0.5:  # the restart took less than the warning period
        assert status["preemption"]["status"] == "warning"
        assert hub.server(bidder)["ready"]
    assert hub.api("GET", f"/gpulab/spot/status/{keeper}").json()["max_price"] == "0.65"
    queue = hub.api("GET", "/gpulab/spot/queue").json()["queue"]
    assert [(q["user"], q["max_price"]) for q in queue] == [(waiter, "0.35")]

    wait_for(lambda: hub.server(bidder) is None, timeout=WARNING + 20, what="the stop")
    assert time.time() >= deadline - 0.5
    record = hub.api("GET", "/gpulab/spot/preemptions").json()["preemptions"][-1]
    assert record["user"] == bidder and record["status"] == "stopped"
    assert record["stopped_at"] >= deadline
    s = hub.server(keeper)
    assert s["ready"] and s["state"]["pid"] == keeper_pid

    # Prices from before the crash are still what billing reads.
    assert price_at("rtx-4090", t_low + 0.05, hub.data_dir) == Decimal("0.30")
    assert price_at("rtx-4090", t_high + 0.05, hub.data_dir) == Decimal("0.60")

    # The freed card goes to the queued request once the price is within its bid.
    hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.30"})
    hub.wait_ready(waiter, timeout=30)
    assert hub.free("rtx-4090") == 0
    for u in (keeper, waiter):
        hub.stop_server(u)
    assert hub.free("rtx-4090") == 2
