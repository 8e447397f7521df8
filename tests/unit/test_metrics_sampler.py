"""The card sampler and card telemetry (issue 24: "per card: utilisation, memory used, power,
temperature ... labelled simulated on simulated pools"; the console's "busy or idle" and users'
idle nudge rest on :meth:`CardSampler.idle_seconds`).

A real pool of simulated cards and real activity trackers fed real-shaped observations: a
simulated card's utilisation is its holder's CPU use as the observer measured it, capped at 100.
"""

from __future__ import annotations

import asyncio

import pytest
from metrics_helpers import metrics_pool
from traitlets import TraitError

from gpulab.hub_config.metrics.sampler import BUCKET_SECONDS, CardSampler, cpu_by_card
from gpulab.spawners.activity import ActivityTracker, Observation
from gpulab.spawners.node.telemetry import CardReading, read_cards, simulated_reading

T0 = 1_800_000_000.0  # a minute boundary


@pytest.fixture
def pool(tmp_path):
    yield from metrics_pool(tmp_path, "A100-80G:2", market=False)


def reading(uuid: str, util: float) -> CardReading:
    return CardReading(uuid, 0, "A100", util, 0.0, 81920.0, 50.0, 40.0, True)


def tracker_at(session: str, cpu_seconds: list[float]) -> ActivityTracker:
    """A tracker that took one sample per second with these cumulative CPU seconds."""
    tracker = ActivityTracker(session=session, session_start=T0 - 100)
    for i, cpu in enumerate(cpu_seconds):
        tracker.update(Observation(t=T0 + i, procs=(), cpu=(("cgroup", cpu),)))
    return tracker


def test_a_simulated_card_follows_its_holders_cpu_capped_at_100(pool) -> None:
    """The holder's CPU use between the observer's last two samples (50 % of a core: the card
    reads 50 %; 2.5 cores: 100 %), the other card idle; derived power and temperature rise with
    it; no memory, no processes, always simulated."""
    a, b = (d.uuid for d in pool.inventory.devices)
    alloc = pool.allocator.allocate("alice/", "a100-80g", 1)
    trackers = {"alice/": tracker_at(alloc.alloc_id, [10.0, 10.5])}
    cpu = cpu_by_card(pool, trackers)
    held = alloc.uuids[0]
    assert cpu == {held: pytest.approx(50.0)}
    readings = {r.uuid: r for r in read_cards(pool.inventory, cpu)}
    assert set(readings) == {a, b}
    busy, idle = readings[held], readings[b if held == a else a]
    assert busy.util_pct == 50.0 and idle.util_pct == 0.0
    assert busy.power_w > idle.power_w and busy.temp_c > idle.temp_c
    for r in (busy, idle):
        assert r.simulated and r.mem_used_mib == 0.0 and r.processes == ()
        assert r.mem_total_mib == 80 * 1024
    device = pool.inventory.by_uuid(held)
    assert simulated_reading(device, 250.0).util_pct == 100.0
    # A tracker of an earlier session of the same server says nothing about this one.
    assert cpu_by_card(pool, {"alice/": tracker_at("old-session", [1.0, 2.0])}) == {}


def test_idle_seconds_count_from_the_last_busy_reading_of_a_held_card(pool) -> None:
    sampler = CardSampler.instance()
    alloc = pool.allocator.allocate("alice/", "a100-80g", 1)
    held = alloc.uuids[0]
    free = next(d.uuid for d in pool.inventory.devices if d.uuid != held)
    sampler.update([reading(held, 80.0), reading(free, 0.0)], T0)
    assert sampler.idle_seconds(held, T0) == 0.0
    assert sampler.idle_seconds(free, T0) is None  # nobody holds it
    sampler.update([reading(held, 1.0), reading(free, 0.0)], T0 + 10)
    assert sampler.idle_seconds(held, T0 + 25) == 25.0
    sampler.update([reading(held, 60.0), reading(free, 0.0)], T0 + 30)
    assert sampler.idle_seconds(held, T0 + 31) == 0.0
    # Released and taken again by someone else: idle from the new holder's start, not before.
    pool.allocator.release("alice/")
    sampler.update([reading(held, 0.0), reading(free, 0.0)], T0 + 40)
    assert sampler.idle_seconds(held, T0 + 40) is None
    again = pool.allocator.allocate("bob/", "a100-80g", 2)
    sampler.update([reading(u, 0.0) for u in again.uuids], T0 + 50)
    assert sampler.idle_seconds(held, again.created + 7) == pytest.approx(7.0)


def test_history_keeps_a_mean_per_type_and_minute_for_a_day(pool) -> None:
    sampler = CardSampler.instance()
    a, b = (d.uuid for d in pool.inventory.devices)
    sampler.update([reading(a, 100.0), reading(b, 0.0)], T0)  # mean 50
    sampler.update([reading(a, 100.0), reading(b, 100.0)], T0 + 20)  # mean 100, same minute
    sampler.update([reading(a, 0.0), reading(b, 20.0)], T0 + BUCKET_SECONDS)  # next minute
    assert sampler.history("a100-80g", T0) == [(T0, 75.0), (T0 + BUCKET_SECONDS, 10.0)]
    assert sampler.history("a100-80g", T0 + 1) == [(T0 + BUCKET_SECONDS, 10.0)]
    assert sampler.history("rtx-4090", T0) == []
    sampler.update([reading(a, 0.0), reading(b, 0.0)], T0 + 24 * 3600 + 120)
    assert [t for t, _ in sampler.history("a100-80g", 0)] == [T0 + 24 * 3600 + 120]


def test_a_pass_reads_in_a_thread_and_keeps_the_readings(pool) -> None:
    sampler = CardSampler.instance()
    alloc = pool.allocator.allocate("alice/", "a100-80g", 1)
    sampler.cpu_source = lambda: {alloc.uuids[0]: 42.0}
    asyncio.run(sampler.sample())
    assert sampler.latest()[alloc.uuids[0]].util_pct == 42.0
    assert sampler.sampled_at is not None and sampler.last_pass_seconds is not None


@pytest.mark.parametrize(
    ("trait", "bad"), [("interval", 0), ("busy_threshold", 0), ("busy_threshold", 101)]
)
def test_bad_settings_name_the_trait(trait: str, bad: float) -> None:
    with pytest.raises(TraitError, match=f"CardSampler.{trait}"):
        CardSampler(**{trait: bad})
