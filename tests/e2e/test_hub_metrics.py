"""The hub's Prometheus metrics (issue 24), scraped from a real hub as Prometheus scrapes them.

One hub for the module: a simulated pool of 1 A100 and 2 RTX 4090, the scrape token set
(``GPULAB_PROMETHEUS_TOKEN``), a fast card sampler, observer and spot market, and at most 3 active
servers (so JupyterHub's own 429 can be provoked). Real servers and kernels run on it; every value
scraped is checked against what the hub's own APIs (pool, spot prices, queue, preemptions) and the
users' servers (their ``CUDA_VISIBLE_DEVICES``) say.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
import requests
from billing.client import Billing
from harness import Hub, wait_for
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "prom-" + uuid.uuid4().hex
WARNING = 2


@pytest.fixture(scope="module")
def metrics_hub(module_hub_factory) -> Hub:
    hub = module_hub_factory(
        "metrics",
        simulate="A100-80G:1,RTX-4090:2",
        env={"GPULAB_PROMETHEUS_TOKEN": TOKEN},
        extra_args=[
            "--CardSampler.interval=0.3",
            "--ActivityObserver.interval=0.5",
            "--JupyterHub.active_server_limit=3",
            f"--SpotMarket.warning_seconds={WARNING}",
            "--SpotMarket.tick_interval=0.3",
        ],
    )
    wait_for(Billing(hub).up, 60, 0.2, "the billing service")
    return hub


@pytest.fixture
def hub(metrics_hub: Hub) -> Iterator[Hub]:
    """The module's hub; after each test, prices unpinned, queue emptied, every server stopped."""
    yield metrics_hub
    for slug in ("rtx-4090", "a100-80g"):
        metrics_hub.api("PUT", f"/gpulab/spot/prices/{slug}", json={"price": None})
    for entry in metrics_hub.api("GET", "/gpulab/spot/queue").json()["queue"]:
        metrics_hub.api("DELETE", f"/gpulab/spot/queue/{entry['user']}")
    for u in metrics_hub.api("GET", "/users").json():
        if u["servers"]:
            metrics_hub.stop_server(u["name"])


class Scrape:
    """One scrape of /hub/metrics, parsed with prometheus_client's own parser."""

    def __init__(self, hub: Hub, token: str = TOKEN) -> None:
        r = requests.get(
            f"{hub.url}/hub/metrics", headers={"Authorization": f"token {token}"}, timeout=30
        )
        assert r.status_code == 200, r.text[:300]
        self.samples = [
            s for family in text_string_to_metric_families(r.text) for s in family.samples
        ]

    def series(self, name: str, **labels: str) -> list:
        return [
            s
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the series of ``name`` matching ``labels`` (0 when there is none)."""
        return sum(s.value for s in self.series(name, **labels))


def pin(hub: Hub, slug: str, price: str | None) -> None:
    r = hub.api("PUT", f"/gpulab/spot/prices/{slug}", json={"price": price})
    assert r.status_code == 200, r.text


def user_token(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 600})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def test_only_the_prometheus_token_scrapes_and_it_reads_nothing_else(hub: Hub) -> None:
    """Issue 24, "scope-protected as JupyterHub does": GPULAB_PROMETHEUS_TOKEN is a service
    holding read:metrics only. It scrapes gpulab's families; a user's token is refused (403), and
    the scrape token reads no user, server or pool data. Fails before: the setting registered no
    token, so the scrape was refused."""
    scrape = Scrape(hub)
    assert scrape.series("gpulab_pool_cards") and scrape.series("DCGM_FI_DEV_GPU_UTIL")
    user = hub.create_user()
    r = requests.get(
        f"{hub.url}/hub/metrics",
        headers={"Authorization": f"token {user_token(hub, user)}"},
        timeout=30,
    )
    assert r.status_code == 403
    assert requests.get(f"{hub.url}/hub/metrics", timeout=30).status_code == 403
    for path in ("/users", f"/users/{user}", "/gpulab/spot/queue"):
        assert hub.api("GET", path, token=TOKEN).status_code == 403, path


def test_cards_and_servers_are_the_pools_and_cards_follow_their_holders_work(hub: Hub) -> None:
    """Issue 24: cards free/held by type and node, allocations and their age, spawn durations,
    observer samples and lag, the data disk, and per card the DCGM exporter's families labelled
    with the user and server holding it and simulated="true". Every figure is the pool API's,
    the holder's server's own CUDA_VISIBLE_DEVICES, and a simulated card's utilisation follows
    its holder's CPU (a kernel burning a core), then idles. Fails before: no gpulab family."""
    before = Scrape(hub)
    successes = before.value("gpulab_spawn_duration_seconds_count", outcome="success")
    alice, bob = hub.create_user(), hub.create_user()
    hub.spawn_ready(alice, {"gpu": "a100-80g"})
    hub.spawn_ready(bob, {"gpu": "rtx-4090"})
    pool = hub.pool()
    scrape = Scrape(hub)

    held = {g["uuid"]: g["holder"] for g in pool["gpus"] if g["held"]}
    assert len(held) == 2
    for t in pool["gpu_types"]:
        slug = t["slug"]
        assert scrape.value("gpulab_pool_cards", type=slug, state="free") == t["free"]
        assert scrape.value("gpulab_pool_cards", type=slug) == t["total"]
        assert scrape.value("gpulab_pool_cards", type=slug, state="held") == sum(
            1 for g in pool["gpus"] if g["held"] and g["gpu_type"] == slug
        )
        assert not scrape.series("gpulab_pool_cards", type=slug, simulated="false")
    assert scrape.value("gpulab_pool_allocations") == 2
    assert scrape.value("gpulab_pool_allocations", type="a100-80g", pricing="on_demand") == 1
    assert scrape.value("gpulab_allocation_age_seconds_count") == 2
    assert (
        scrape.value("gpulab_spawn_duration_seconds_count", outcome="success", spawner="local")
        == successes + 2
    )

    # The DCGM families: one series per card, the holder's labels on held cards only.
    util = {s.labels["UUID"]: s for s in scrape.series("DCGM_FI_DEV_GPU_UTIL")}
    assert set(util) == {g["uuid"] for g in pool["gpus"]}
    for dev_uuid, s in util.items():
        assert s.labels["simulated"] == "true"
        holder = held.get(dev_uuid, "/")
        assert (s.labels["user"], s.labels["server"]) == tuple(holder.split("/", 1))
    with hub.kernel(alice) as kernel:
        (mine,) = kernel.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").split()
        assert util[mine].labels["user"] == alice and held[mine] == f"{alice}/"
        assert scrape.series("gpulab_card_idle_seconds", UUID=mine, user=alice)
        total = scrape.value("DCGM_FI_DEV_FB_FREE", UUID=mine) + scrape.value(
            "DCGM_FI_DEV_FB_USED", UUID=mine
        )
        assert total == 80 * 1024

        kernel.execute(
            "import threading\nburning = True\n"
            "def burn():\n    while burning: pass\n"
            "threading.Thread(target=burn, daemon=True).start()"
        )
        wait_for(
            lambda: Scrape(hub).value("DCGM_FI_DEV_GPU_UTIL", UUID=mine) >= 30,
            60,
            0.3,
            "the busy kernel's card to show utilisation",
        )
        assert Scrape(hub).value("gpulab_card_idle_seconds", UUID=mine) < 5
        kernel.execute("burning = False")
        wait_for(
            lambda: Scrape(hub).value("DCGM_FI_DEV_GPU_UTIL", UUID=mine) < 5,
            60,
            0.3,
            "the idle kernel's card to idle",
        )
    bobs = next(u for u, h in held.items() if h == f"{bob}/")
    assert Scrape(hub).value("gpulab_card_idle_seconds", UUID=bobs, user=bob) > 0

    # The observer sampled the running servers, lately.
    samples = scrape.value("gpulab_observer_samples_total")
    wait_for(
        lambda: Scrape(hub).value("gpulab_observer_samples_total") > samples, 30, 0.3, "samples"
    )
    assert Scrape(hub).value("gpulab_observer_lag_seconds") < 15
    st = os.statvfs(hub.data_dir)
    assert scrape.value("gpulab_data_disk_bytes", kind="size") == st.f_blocks * st.f_frsize
    free = scrape.value("gpulab_data_disk_bytes", kind="free")
    assert abs(free - st.f_bavail * st.f_frsize) < 2**30


def test_refusals_are_counted_by_reason(hub: Hub) -> None:
    """Issue 24, "refusals by reason" and "429s that never showed in metrics": a bad option
    (invalid), no free card (pool_exhausted), a bid below the spot price (market), a balance
    that cannot pay (balance), a switch of a running server to a full type (pool_exhausted),
    JupyterHub's own 429 at its active-server limit (rate_limited):
    each is counted once under its reason, with the refused spawns' outcome. Fails before: no
    gpulab_spawn_refusals_total."""
    billing = Billing(hub)
    holder, other, poor, third, late = (hub.create_user() for _ in range(5))
    hub.spawn_ready(holder, {"gpu": "a100-80g"})

    def refused(user: str, options: dict, status: int, reason: str, switch: bool = False) -> None:
        before = Scrape(hub)
        if switch:  # a running server moved to other options (the JupyterLab toggle)
            r = hub.api("POST", f"/gpulab/users/{user}/switch", json=options)
        else:
            r = hub.spawn(user, options)
        assert r.status_code == status, r.text
        after = Scrape(hub)
        for why in ("invalid", "pool_exhausted", "market", "balance", "rate_limited"):
            delta = after.value("gpulab_spawn_refusals_total", reason=why) - before.value(
                "gpulab_spawn_refusals_total", reason=why
            )
            assert delta == (1 if why == reason else 0), (why, reason, r.text)
        assert switch or hub.server(user) is None

    refused(other, {"gpu": "no-such-card"}, 400, "invalid")
    refused(other, {"gpu": "a100-80g"}, 409, "pool_exhausted")
    pin(hub, "rtx-4090", "0.60")
    refused(other, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.40"}, 409, "market")
    balance = billing.balance(poor)["balance"]["exact"]
    billing.credit(poor, f"-{balance}")
    refused(poor, {"gpu": "a100-80g"}, 402, "balance")
    refused_spawns = Scrape(hub).value("gpulab_spawn_duration_seconds_count", outcome="refused")
    assert refused_spawns >= 3

    hub.spawn_ready(other, {"gpu": "rtx-4090"})
    refused(other, {"gpu": "a100-80g"}, 409, "pool_exhausted", switch=True)
    assert hub.server(other)["ready"]
    hub.spawn_ready(third, {"gpu": "none"})
    refused(late, {"gpu": "none"}, 429, "rate_limited")


def test_spot_queue_price_and_preemptions_are_the_markets(hub: Hub) -> None:
    """Issue 24: queue length and wait, spot price by type, preemptions by reason and checkpoint
    outcomes, as the spot API shows them: a running spot server, a bid queued below the price,
    the price raised past the running bid (preempted after its warning; no checkpoint command:
    skipped), then lowered under the queued bid (it starts: one queue wait observed). Fails
    before: no gpulab spot family."""
    runner, waiter = hub.create_user(), hub.create_user()
    pin(hub, "rtx-4090", "0.40")
    hub.spawn_ready(runner, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.50"})
    r = hub.spawn(waiter, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.35", "wait": True})
    assert r.status_code == 202, r.text
    queued_at = r.json()["queued"]["queued_at"]

    scrape = Scrape(hub)
    queue = hub.api("GET", "/gpulab/spot/queue").json()["queue"]
    assert scrape.value("gpulab_spot_queue_length", type="rtx-4090") == len(queue) == 1
    assert (
        0
        <= scrape.value("gpulab_spot_queue_oldest_wait_seconds", type="rtx-4090")
        <= (time.time() - queued_at + 1)
    )
    prices = hub.api("GET", "/gpulab/spot/prices").json()
    for t in prices["gpu_types"]:
        assert scrape.value(
            "gpulab_spot_price", type=t["slug"], currency=prices["currency"]
        ) == float(t["price"])
    assert scrape.value("gpulab_pool_allocations", type="rtx-4090", pricing="spot") == 1

    preempted = scrape.value("gpulab_preemptions_total", type="rtx-4090", reason="price-above-max")
    skipped = scrape.value("gpulab_checkpoints_total", outcome="skipped")
    waits = scrape.value("gpulab_spot_queue_wait_seconds_count", type="rtx-4090")
    pin(hub, "rtx-4090", "0.60")
    wait_for(lambda: hub.server(runner) is None, WARNING + 30, 0.2, "the preempted server's stop")
    records = [
        p
        for p in hub.api("GET", "/gpulab/spot/preemptions").json()["preemptions"]
        if p["user"] == runner
    ]
    assert [p["reason"] for p in records] == ["price-above-max"]
    scrape = Scrape(hub)
    assert (
        scrape.value("gpulab_preemptions_total", type="rtx-4090", reason="price-above-max")
        == preempted + 1
    )
    assert scrape.value("gpulab_checkpoints_total", outcome="skipped") == skipped + 1
    assert scrape.value("gpulab_spot_price", type="rtx-4090") == 0.60

    pin(hub, "rtx-4090", "0.30")
    hub.wait_ready(waiter, timeout=60)
    scrape = Scrape(hub)
    assert scrape.value("gpulab_spot_queue_length", type="rtx-4090") == 0
    assert scrape.value("gpulab_spot_queue_wait_seconds_count", type="rtx-4090") == waits + 1
