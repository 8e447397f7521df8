"""The counters the spawners floor updates where things happen (issue 24: "spawn duration
histograms by spawner, app and outcome (refusals by reason)"; the console's "slowest recent
spawns with their steps")."""

from __future__ import annotations

import pytest

from gpulab.spawners.node import counters
from gpulab.spawners.node.counters import Hist, SpawnLog, Tally, record_spawn, refusal_reason


@pytest.mark.parametrize(
    ("status", "message", "where", "reason"),
    [
        (402, "cannot pay for 1 minutes of A100", "balance", "balance"),
        (402, "cannot pay", "billing", "balance"),
        (409, "only 0 a100-80g free", "allocator", "pool_exhausted"),
        (409, "spot price of rtx-4090 is 0.60", "market", "market"),
        (400, "Invalid spawn option gpu: unknown", "options", "invalid"),
        (403, "course ml101 does not allow gpu type 'a100-80g'", "options", "quota"),
        (400, "Invalid spawn option gpus: must be at most 8", "options", "invalid"),
        (403, "not staff of ml101", "staff", "staff"),
        (429, "Active user limit exceeded", "", "rate_limited"),
        (418, "teapot", "", "other"),
    ],
)
def test_each_refusal_has_its_reason(status, message, where, reason) -> None:
    assert refusal_reason(status, message, where) == reason
    assert reason in counters.REFUSAL_REASONS


def test_histograms_are_cumulative_with_inf_and_counters_add_up() -> None:
    h = Hist(("type",), (1.0, 10.0))
    for v in (0.5, 1.0, 5.0, 50.0):
        h.observe(v, "a100")
    ((key, buckets, total),) = h.items()
    assert key == ("a100",) and total == 56.5
    assert buckets == [("1.0", 2), ("10.0", 3), ("+Inf", 4)]
    t = Tally(("reason",))
    t.inc("market")
    t.inc("market")
    assert t.get("market") == 2 and t.total() == 2
    with pytest.raises(ValueError, match="labels"):
        t.inc("market", "extra")


def test_the_spawn_log_keeps_the_last_200_with_their_steps() -> None:
    log = SpawnLog()
    for i in range(250):
        log.add(
            counters.SpawnRecord(
                owner=f"u{i}/",
                spawner="local",
                app="",
                gpu="none",
                outcome="success",
                reason="",
                status=None,
                message="",
                started=float(i),
                duration_seconds=float(i % 7),
                steps=((0.1, "Allocating GPUs"),),
            )
        )
    records = log.records()
    assert len(records) == 200 and records[0].owner == "u50/" and records[-1].owner == "u249/"
    slowest = log.slowest(3)
    assert [r.duration_seconds for r in slowest] == [6.0, 6.0, 6.0]
    assert slowest[0].to_json()["steps"] == [{"at": 0.1, "message": "Allocating GPUs"}]


def test_a_refused_spawn_counts_its_reason_and_its_outcome() -> None:
    before = counters.SPAWN_REFUSALS.get("market")
    record = record_spawn(
        owner="bob/gpu",
        spawner="docker",
        app="comfyui",
        gpu="rtx-4090",
        outcome="refused",
        started=1.0,
        duration=0.25,
        reason="market",
        status=409,
        message="spot price above the bid",
    )
    assert counters.SPAWN_REFUSALS.get("market") == before + 1
    assert (record.user, record.server, record.reason) == ("bob", "gpu", "market")
    series = {k: n for k, b, _ in counters.SPAWN_DURATION.items() for le, n in b if le == "+Inf"}
    assert series[("docker", "comfyui", "refused")] >= 1
    assert counters.SPAWN_LOG.records()[-1] == record
