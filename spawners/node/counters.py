"""Counters and histograms that the spawners floor updates where things happen.

The hub's Prometheus families (``hub_config/metrics/collector.py``) are computed at scrape time,
mostly from live objects (the pool, the market, the observer). What cannot be computed from live
objects is counted here, where it happens: spawn outcomes and their durations, refusals by
reason, spot queue waits, preemptions, checkpoint outcomes, the observer's passes. This module
sits on the spawners' lowest working floor (``node``) so that the mixin, the market and the hub's
observer can all count into it; the hub's collector reads it. Plain Python (no prometheus_client
here): one lock per family, increments are a dict update, and the collector turns the values
into families at scrape.

The spawn log (:data:`SPAWN_LOG`, re-exported as ``hub_config/metrics/spawns.py: SPAWNS``) keeps
the last 200 spawns with their steps (the spawner's progress events) and durations, for the
admin console's "slowest recent spawns".
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Refusal reasons (gpulab_spawn_refusals_total{reason}).
REFUSAL_REASONS = (
    "balance",
    "pool_exhausted",
    "market",
    "invalid",
    "staff",
    "rate_limited",
    "quota",
    "other",
)
SPAWN_OUTCOMES = ("success", "failure", "refused")
CHECKPOINT_OUTCOMES = ("saved", "failed", "timeout", "skipped")

SPAWN_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
QUEUE_WAIT_BUCKETS = (1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Tally:
    """A counter family: a float per tuple of label values."""

    def __init__(self, labels: Iterable[str] = ()) -> None:
        self.labels = tuple(labels)
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, *values: str, amount: float = 1.0) -> None:
        if len(values) != len(self.labels):
            raise ValueError(f"labels {self.labels} need {len(self.labels)} values: {values}")
        key = tuple(str(v) for v in values)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def items(self) -> list[tuple[tuple[str, ...], float]]:
        with self._lock:
            return list(self._values.items())

    def get(self, *values: str) -> float:
        with self._lock:
            return self._values.get(tuple(values), 0.0)

    def total(self) -> float:
        with self._lock:
            return sum(self._values.values())


@dataclass
class HistValue:
    """One labelled histogram's bucket counts (not cumulative), sum and count."""

    counts: list[int]
    sum: float = 0.0
    count: int = 0


class Hist:
    """A histogram family over fixed ``buckets`` (upper bounds; +Inf is added)."""

    def __init__(self, labels: Iterable[str] = (), buckets: Iterable[float] = ()) -> None:
        self.labels = tuple(labels)
        self.buckets = tuple(sorted(buckets))
        self._values: dict[tuple[str, ...], HistValue] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, *values: str) -> None:
        if len(values) != len(self.labels):
            raise ValueError(f"labels {self.labels} need {len(self.labels)} values: {values}")
        key = tuple(str(v) for v in values)
        slot = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        with self._lock:
            h = self._values.get(key)
            if h is None:
                h = self._values[key] = HistValue([0] * (len(self.buckets) + 1))
            h.counts[slot] += 1
            h.sum += value
            h.count += 1

    def items(self) -> list[tuple[tuple[str, ...], list[tuple[str, int]], float]]:
        """(label values, cumulative [(le, count)...] ending with +Inf, sum) per series."""
        out = []
        with self._lock:
            for key, h in self._values.items():
                out.append((key, cumulative(self.buckets, h.counts), h.sum))
        return out


def cumulative(buckets: tuple[float, ...], counts: list[int]) -> list[tuple[str, int]]:
    """Prometheus' cumulative buckets from per-bucket ``counts`` (the last one is +Inf)."""
    out, running = [], 0
    for bound, n in zip((*buckets, math.inf), counts, strict=True):
        running += n
        out.append(("+Inf" if bound == math.inf else _le(bound), running))
    return out


def _le(bound: float) -> str:
    return repr(float(bound))


# ---- spawns ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpawnRecord:
    """One finished spawn (or refusal) as the console shows it."""

    owner: str  # "user/server"
    spawner: str
    app: str  # "" for a plain server
    gpu: str
    outcome: str  # success | failure | refused
    reason: str  # a refusal's reason, "" otherwise
    status: int | None  # the HTTP status of a refusal or failure
    message: str
    started: float  # Unix time the spawn began
    duration_seconds: float
    steps: tuple[tuple[float, str], ...] = ()  # (seconds since the start, message)

    @property
    def user(self) -> str:
        return self.owner.split("/", 1)[0]

    @property
    def server(self) -> str:
        return self.owner.partition("/")[2]

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "user": self.user,
            "server": self.server,
            "spawner": self.spawner,
            "app": self.app,
            "gpu": self.gpu,
            "outcome": self.outcome,
            "reason": self.reason,
            "status": self.status,
            "message": self.message,
            "started": self.started,
            "duration_seconds": round(self.duration_seconds, 3),
            "steps": [{"at": round(t, 3), "message": m} for t, m in self.steps],
        }


@dataclass
class SpawnLog:
    """The last ``size`` spawns, newest last."""

    size: int = 200
    _ring: deque = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: SpawnRecord) -> None:
        with self._lock:
            self._ring.append(record)
            while len(self._ring) > self.size:
                self._ring.popleft()

    def records(self) -> list[SpawnRecord]:
        with self._lock:
            return list(self._ring)

    def slowest(self, n: int = 20) -> list[SpawnRecord]:
        return sorted(self.records(), key=lambda r: r.duration_seconds, reverse=True)[:n]

    def clear(self) -> None:
        with self._lock:
            self._ring.clear()


SPAWN_DURATION = Hist(("spawner", "app", "outcome"), SPAWN_BUCKETS)
SPAWN_REFUSALS = Tally(("reason",))
SPAWN_LOG = SpawnLog()
SPOT_QUEUE_WAIT = Hist(("type",), QUEUE_WAIT_BUCKETS)
PREEMPTIONS = Tally(("type", "reason"))
CHECKPOINTS = Tally(("outcome",))
OBSERVER_SAMPLES = Tally(())
OBSERVER_PASS = Hist((), PASS_BUCKETS)


class ObserverClock:
    """When the activity observer last finished a pass over every running server."""

    last_pass: float | None = None


OBSERVER_CLOCK = ObserverClock()


def refusal_reason(status: int | None, message: str = "", where: str = "") -> str:
    """The refusal reason (one of :data:`REFUSAL_REASONS`) of a start refused with ``status``.

    ``where`` says who refused when the status alone cannot: ``"allocator"`` (no free card: a
    409 from the pool), ``"market"`` (the spot market's answer), ``"options"`` (a bad option,
    400, or a course's limits, 403: ``quota``), ``"staff"`` (the course staff rule). ``message``
    is kept for the spawn log only."""
    if where == "staff":
        return "staff"
    if status == 429:
        return "rate_limited"
    if status == 402:
        return "balance"
    if where == "allocator":
        return "pool_exhausted"
    if where == "market":
        return "market"
    if where == "options" and status == 403:
        return "quota"  # a course's limits (CourseRuleError): not what the course allows
    if where == "options" or status == 400:
        return "invalid"
    return "other"


def count_refusal(reason: str) -> None:
    SPAWN_REFUSALS.inc(reason if reason in REFUSAL_REASONS else "other")


def record_spawn(
    *,
    owner: str,
    spawner: str,
    app: str,
    gpu: str,
    outcome: str,
    started: float,
    duration: float,
    steps: Iterable[tuple[float, str]] = (),
    reason: str = "",
    status: int | None = None,
    message: str = "",
) -> SpawnRecord:
    """A spawn ended: its duration into the histogram, a refusal into the refusals, the record
    into the spawn log."""
    if outcome == "refused":
        count_refusal(reason or "other")
    SPAWN_DURATION.observe(duration, spawner, app, outcome)
    record = SpawnRecord(
        owner=owner,
        spawner=spawner,
        app=app,
        gpu=gpu,
        outcome=outcome,
        reason=reason if outcome == "refused" else "",
        status=status,
        message=message[:300],
        started=started,
        duration_seconds=duration,
        steps=tuple(steps),
    )
    SPAWN_LOG.add(record)
    return record
