"""The hub's metrics over a real pool: cards by state, holds, bookings, offline nodes, names.

A real :class:`GpuPool` (simulated cards, a real allocator and ledger in a temp dir) and spot
market; the collector scraped through prometheus_client's own exposition and parser, on a
registry of its own. Issue 24: "cards free/held/total by type and node ... holds and bookings",
with exactly the contract's family names and labels.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from metrics_helpers import metrics_pool, scrape

from gpulab.hub_config.metrics.sampler import CardSampler
from gpulab.hub_config.metrics.snapshot import snapshot
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node import counters
from gpulab.spawners.node.holds import Hold
from gpulab.spawners.node.telemetry import read_cards

# contract.md, "Hub, on JupyterHub's own /hub/metrics": family -> (type, labels).
DCGM_LABELS = {"gpu", "UUID", "device", "modelName", "Hostname", "type", "user", "server"}
CONTRACT = {
    "gpulab_pool_cards": ("gauge", {"type", "node", "state", "simulated"}),
    "gpulab_pool_allocations": ("gauge", {"type", "node", "pricing"}),
    "gpulab_allocation_age_seconds": ("histogram", {"type"}),
    "gpulab_spawn_duration_seconds": ("histogram", {"spawner", "app", "outcome"}),
    "gpulab_spawn_refusals": ("counter", {"reason"}),
    "gpulab_spot_queue_length": ("gauge", {"type"}),
    "gpulab_spot_queue_oldest_wait_seconds": ("gauge", {"type"}),
    "gpulab_spot_queue_wait_seconds": ("histogram", {"type"}),
    "gpulab_spot_price": ("gauge", {"type", "currency"}),
    "gpulab_preemptions": ("counter", {"type", "reason"}),
    "gpulab_checkpoints": ("counter", {"outcome"}),
    "gpulab_observer_samples": ("counter", set()),
    "gpulab_observer_lag_seconds": ("gauge", set()),
    "gpulab_observer_pass_seconds": ("histogram", set()),
    "gpulab_holds": ("gauge", {"kind", "type", "state"}),
    "gpulab_booking_servers": ("gauge", {"course", "state"}),
    "gpulab_card_idle_seconds": ("gauge", {"UUID", "gpu", "type", "node", "user", "server"}),
    "gpulab_data_disk_bytes": ("gauge", {"kind"}),
    **{
        f"DCGM_FI_DEV_{n}": ("gauge", DCGM_LABELS | {"simulated"})
        for n in ("GPU_UTIL", "FB_USED", "FB_FREE", "POWER_USAGE", "GPU_TEMP")
    },
}


@pytest.fixture
def pool(tmp_path):
    yield from metrics_pool(tmp_path, "A100-80G:2,RTX-4090:3")


def value(families: dict, name: str, sample: str | None = None, **labels: str) -> float:
    _, samples = families[name]
    return sum(
        s.value
        for s in samples
        if (sample is None or s.name == sample)
        and all(s.labels.get(k) == v for k, v in labels.items())
    )


def hold(kind: str, account: str, gpu_type: str, start: float, end: float, cards: int = 1):
    return Hold(
        hold_id=f"{kind[:3]}-{account}-{start}",
        kind=kind,
        account=account,
        gpu_type=gpu_type,
        cards=cards,
        start=start,
        end=end,
        use_from=start - 60,
        reclaim_from=start - 120,
        created=time.time(),
    )


def test_every_contract_family_is_there_with_its_labels(pool) -> None:
    """Issue 24: every hub family of the contract, exactly named and labelled (the DCGM
    exporter's names and labels, so NVIDIA's dashboards work)."""
    pool.allocator.allocate("alice/", "a100-80g", 1)
    SpotMarket.instance().current_price("rtx-4090")
    counters.SPAWN_DURATION.observe(1.5, "local", "", "success")
    counters.SPOT_QUEUE_WAIT.observe(3.0, "rtx-4090")
    counters.PREEMPTIONS.inc("rtx-4090", "price-above-max")
    counters.OBSERVER_PASS.observe(0.01)
    now = time.time()
    pool.allocator.add_hold(hold("booking", "course:ml101", "rtx-4090", now - 30, now + 600))
    CardSampler.instance().update(read_cards(pool.inventory), now)
    families = scrape()
    for name, (kind, labels) in CONTRACT.items():
        assert name in families, name
        got_kind, samples = families[name]
        assert got_kind == kind, name
        assert samples, name
        for s in samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)
    for s in families["DCGM_FI_DEV_GPU_UTIL"][1]:
        assert s.labels["simulated"] == "true"
        assert s.labels["modelName"].endswith("(simulated)")


def test_cards_by_state_add_up_to_the_pool_with_holds_and_reservations(pool) -> None:
    """Issue 24, "cards free/held/total by type and node", "holds and bookings": a server's card
    is held; a switch's reservation and the free cards active holds keep are reserved; what a
    new server could take is free, as the allocator says; holds counted by kind and state."""
    now = time.time()
    allocator = pool.allocator
    allocator.allocate("alice/", "a100-80g", 1)
    allocator.reserve("bob/", "rtx-4090", 1)
    allocator.add_hold(hold("reservation", "user:carol", "rtx-4090", now - 10, now + 3600))
    booking = hold("booking", "course:ml101", "rtx-4090", now - 30, now + 600)
    allocator.add_hold(booking)
    later = now + 30 * 86400
    allocator.add_hold(hold("reservation", "user:dave", "a100-80g", later, later + 3600))
    families = scrape()
    counts = allocator.counts()
    for slug, c in counts.items():
        assert value(families, "gpulab_pool_cards", type=slug) == c["total"]
        assert value(families, "gpulab_pool_cards", type=slug, state="free") == c["free"]
    assert value(families, "gpulab_pool_cards", type="a100-80g", state="held") == 1
    assert value(families, "gpulab_pool_cards", type="rtx-4090", state="reserved") == 3
    assert value(families, "gpulab_pool_cards", type="rtx-4090", state="free") == 0
    assert value(families, "gpulab_pool_allocations") == 1
    assert value(families, "gpulab_pool_allocations", type="a100-80g", pricing="on_demand") == 1
    holds = {
        (s.labels["kind"], s.labels["type"], s.labels["state"]): s.value
        for s in families["gpulab_holds"][1]
    }
    assert holds == {
        ("reservation", "rtx-4090", "active"): 1,
        ("booking", "rtx-4090", "active"): 1,
        ("reservation", "a100-80g", "waiting"): 1,
    }
    # The booked class's window is open and none of its servers is up: not ready.
    assert value(families, "gpulab_booking_servers", course="ml101", state="not_ready") == 1
    assert value(families, "gpulab_booking_servers", course="ml101", state="ready") == 0


def test_a_booked_server_that_is_ready_counts_ready_and_pays_as_a_course(pool) -> None:
    """A student's server on the booking's card: ready once its spawner is (the hub's own
    spawner objects, found in memory), its card paid through the course."""
    now = time.time()
    booking = hold("booking", "course:ml101", "rtx-4090", now - 30, now + 600, cards=2)
    pool.allocator.add_hold(booking)
    pool.allocator.allocate(
        "stu/", "rtx-4090", 1, accounts=["course:ml101"], hold_id=booking.hold_id
    )
    # JupyterHub's app as the snapshot reads it: users in memory, each with its spawners.
    spawner = SimpleNamespace(ready=True, gpulab_options=None)
    app = SimpleNamespace(users={1: SimpleNamespace(name="stu", spawners={"": spawner})})
    snap = snapshot(app)
    (view,) = snap.bookings
    assert (view.course, view.cards, view.ready, view.not_ready) == ("ml101", 2, 1, 1)
    (held,) = [c for c in snap.cards if c.state == "held"]
    assert (held.user, held.server, held.pricing) == ("stu", "", "course")
    spawner.ready = False
    (view,) = snapshot(app).bookings
    assert (view.ready, view.not_ready) == (0, 2)


def test_cards_of_a_node_that_takes_no_servers_are_offline(pool) -> None:
    """Issue 24, "by type and node": a Swarm node that is down keeps its cards out of the pool;
    they are counted offline under its name, apart from this machine's cards."""
    pool.set_cluster(
        [],
        {
            "n1": {
                "name": "gpu-box-2",
                "state": "down",
                "availability": "active",
                "gpu_type": "rtx-4090",
                "gpus": 4,
                "simulated": False,
            }
        },
    )
    families = scrape()
    assert (
        value(
            families,
            "gpulab_pool_cards",
            type="rtx-4090",
            node="gpu-box-2",
            state="offline",
            simulated="false",
        )
        == 4
    )
    assert value(families, "gpulab_pool_cards", node="gpu-box-2", state="free") == 0
    assert value(families, "gpulab_pool_cards", type="rtx-4090", state="free") == 3
