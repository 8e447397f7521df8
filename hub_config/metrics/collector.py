"""gpulab's Prometheus families on JupyterHub's own ``/hub/metrics``: one custom collector.

JupyterHub serves prometheus_client's default ``REGISTRY`` at ``/hub/metrics`` (scope
``read:metrics``, ``authenticate_prometheus`` left on). :func:`install` (called by
``plugin.attach``) registers :class:`GpulabCollector` there once. Every scrape builds one
:func:`~gpulab.hub_config.metrics.snapshot.snapshot` (the value the admin console reads too) and
turns it, with the counters the spawners count where things happen
(:mod:`gpulab.spawners.node.counters`), into the families docs/metrics.md lists. Nothing on the
scrape path does I/O besides one ``statvfs`` of the data dir: card readings come from the card
sampler's cache, never from NVML.

Per card, the DCGM exporter's names (``DCGM_FI_DEV_GPU_UTIL`` ...) with its labels (``gpu``,
``UUID``, ``device``, ``modelName``, ``Hostname``) plus gpulab's (``type``, ``user``, ``server``,
``simulated``), so NVIDIA's own dashboards work on a gpulab hub.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpulab.hub_config.metrics import snapshot as snapshots
from gpulab.hub_config.metrics.snapshot import CARD_STATES, Snapshot
from gpulab.spawners.node import counters
from gpulab.spawners.node.counters import cumulative
from gpulab.spawners.node.pool import GpuPool

log = logging.getLogger("gpulab.metrics")

AGE_BUCKETS = (60.0, 600.0, 3600.0, 21600.0, 86400.0, 604800.0)
DCGM = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_pct"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "mem_used_mib"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "mem_free_mib"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temp_c"),
)
DCGM_LABELS = [
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "type",
    "user",
    "server",
    "simulated",
]


def _bool(value: bool) -> str:
    return "true" if value else "false"


class GpulabCollector:
    """The ``gpulab_*`` and ``DCGM_FI_DEV_*`` families, computed at each scrape."""

    def __init__(self) -> None:
        self.started = time.time()

    def describe(self) -> list[Metric]:
        """The families' names (no samples): what the registry checks for clashes."""
        return [m for m in self._families(None, time.time()) if m is not None]

    def collect(self) -> Iterator[Metric]:
        now = time.time()
        try:
            snap = snapshots.snapshot(now=now)
        except Exception:
            # A broken part must not take JupyterHub's own metrics down with it.
            log.exception("Building the metrics' snapshot failed")
            snap = None
        yield from self._families(snap, now)

    # ---- the families ----------------------------------------------------------------------

    def _families(self, snap: Snapshot | None, now: float) -> Iterator[Metric]:
        yield from self._pool(snap, now)
        yield from self._spawns()
        yield from self._market(snap, now)
        yield from self._observer(now)
        yield from self._holds(snap)
        yield from self._cards(snap)
        yield self._disk()

    def _pool(self, snap: Snapshot | None, now: float) -> Iterator[Metric]:
        cards = GaugeMetricFamily(
            "gpulab_pool_cards",
            "Cards of the pool by GPU type, node and state (free, held by a server, reserved "
            "for a hold or a switch, offline: on a node that takes no servers).",
            labels=["type", "node", "state", "simulated"],
        )
        allocs = GaugeMetricFamily(
            "gpulab_pool_allocations",
            "Servers holding cards, by GPU type, node and how they pay.",
            labels=["type", "node", "pricing"],
        )
        age = HistogramMetricFamily(
            "gpulab_allocation_age_seconds",
            "How long the servers holding cards have held them (computed at scrape).",
            labels=["type"],
        )
        if snap is not None:
            tally: dict[tuple[str, str, str, str], int] = {}
            for c in snap.cards:
                sim = _bool(c.simulated)
                for state in CARD_STATES:
                    tally.setdefault((c.type, c.node, state, sim), 0)
                tally[(c.type, c.node, c.state, sim)] += 1
            for o in snap.offline:
                sim = _bool(o.simulated)
                for state in CARD_STATES:
                    tally.setdefault((o.type, o.node, state, sim), 0)
                tally[(o.type, o.node, "offline", sim)] += o.count
            for key, n in sorted(tally.items()):
                cards.add_metric(list(key), n)
            by_alloc: dict[tuple[str, str, str], int] = {}
            ages: dict[str, list[float]] = {t: [] for t in snap.types}
            for a in snap.allocations:
                key = (a.type, a.node, a.pricing)
                by_alloc[key] = by_alloc.get(key, 0) + 1
                ages.setdefault(a.type, []).append(max(0.0, now - a.since))
            for key, n in sorted(by_alloc.items()):
                allocs.add_metric(list(key), n)
            for slug, values in sorted(ages.items()):
                counts = [0] * (len(AGE_BUCKETS) + 1)
                for v in values:
                    counts[next((i for i, b in enumerate(AGE_BUCKETS) if v <= b), -1)] += 1
                age.add_metric([slug], cumulative(AGE_BUCKETS, counts), sum(values))
        yield cards
        yield allocs
        yield age

    def _spawns(self) -> Iterator[Metric]:
        duration = HistogramMetricFamily(
            "gpulab_spawn_duration_seconds",
            "gpulab spawns from the start to the server answering (success), to the refusal "
            "(refused: money, options, no free card, the market) or to the failure.",
            labels=["spawner", "app", "outcome"],
        )
        yield _filled(duration, counters.SPAWN_DURATION)
        refusals = CounterMetricFamily(
            "gpulab_spawn_refusals",
            "Starts refused, by reason (balance, pool_exhausted, market, invalid, staff, "
            "rate_limited: JupyterHub's 429, quota, other).",
            labels=["reason"],
        )
        yield _zero_filled(refusals, counters.SPAWN_REFUSALS, counters.REFUSAL_REASONS)

    def _market(self, snap: Snapshot | None, now: float) -> Iterator[Metric]:
        length = GaugeMetricFamily(
            "gpulab_spot_queue_length",
            "Requests waiting in the spot market's queue, by GPU type.",
            labels=["type"],
        )
        oldest = GaugeMetricFamily(
            "gpulab_spot_queue_oldest_wait_seconds",
            "How long the oldest request in the spot queue of a GPU type has waited (0: none).",
            labels=["type"],
        )
        price = GaugeMetricFamily(
            "gpulab_spot_price",
            "The spot price in force per card-hour, by GPU type.",
            labels=["type", "currency"],
        )
        if snap is not None:
            waits: dict[str, list[float]] = {t: [] for t in snap.types}
            for q in snap.queues:
                waits.setdefault(q.gpu_type, []).append(max(0.0, now - q.queued_at))
            for slug, values in sorted(waits.items()):
                length.add_metric([slug], len(values))
                oldest.add_metric([slug], max(values, default=0.0))
            for slug, value in sorted(snap.spot_prices.items()):
                price.add_metric([slug, snap.currency], float(value))
        yield length
        yield oldest
        yield price
        wait = HistogramMetricFamily(
            "gpulab_spot_queue_wait_seconds",
            "How long queued requests waited before the market started them, by GPU type.",
            labels=["type"],
        )
        yield _filled(wait, counters.SPOT_QUEUE_WAIT)
        preemptions = CounterMetricFamily(
            "gpulab_preemptions",
            "Spot servers warned of their preemption, by GPU type and reason.",
            labels=["type", "reason"],
        )
        for key, value in sorted(counters.PREEMPTIONS.items()):
            preemptions.add_metric(list(key), value)
        yield preemptions
        checkpoints = CounterMetricFamily(
            "gpulab_checkpoints",
            "Checkpoint commands run at a preemption warning, by outcome (saved: exit 0; "
            "failed; timeout; skipped: the user set none).",
            labels=["outcome"],
        )
        yield _zero_filled(checkpoints, counters.CHECKPOINTS, counters.CHECKPOINT_OUTCOMES)

    def _observer(self, now: float) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "gpulab_observer_samples",
            "Samples of running servers taken by the hub's activity observer.",
            value=counters.OBSERVER_SAMPLES.total(),
        )
        last = counters.OBSERVER_CLOCK.last_pass
        yield GaugeMetricFamily(
            "gpulab_observer_lag_seconds",
            "Seconds since the activity observer last finished a pass over every running "
            "server (since the hub started, before its first pass).",
            value=max(0.0, now - (last if last is not None else self.started)),
        )
        passes = HistogramMetricFamily(
            "gpulab_observer_pass_seconds", "How long the activity observer's passes took."
        )
        yield _filled(passes, counters.OBSERVER_PASS)

    def _holds(self, snap: Snapshot | None) -> Iterator[Metric]:
        holds = GaugeMetricFamily(
            "gpulab_holds",
            "Reservations and lab-session bookings not over yet, by kind, GPU type and state "
            "(waiting: before they keep cards; active: keeping them).",
            labels=["kind", "type", "state"],
        )
        booking = GaugeMetricFamily(
            "gpulab_booking_servers",
            "Cards of lab sessions whose window is open, by course: with a ready server "
            "(ready) or without (not_ready).",
            labels=["course", "state"],
        )
        if snap is not None:
            tally: dict[tuple[str, str, str], int] = {}
            for h in snap.holds:
                key = (h.kind, h.type, h.state)
                tally[key] = tally.get(key, 0) + 1
            for key, n in sorted(tally.items()):
                holds.add_metric(list(key), n)
            per_course: dict[str, list[int]] = {}
            for b in snap.bookings:
                c = per_course.setdefault(b.course, [0, 0])
                c[0] += b.ready
                c[1] += b.not_ready
            for course, (ready, not_ready) in sorted(per_course.items()):
                booking.add_metric([course, "ready"], ready)
                booking.add_metric([course, "not_ready"], not_ready)
        yield holds
        yield booking

    def _cards(self, snap: Snapshot | None) -> Iterator[Metric]:
        idle = GaugeMetricFamily(
            "gpulab_card_idle_seconds",
            "Held cards: seconds since the card was last seen busy (or since its server took it).",
            labels=["UUID", "gpu", "type", "node", "user", "server"],
        )
        dcgm = {
            name: GaugeMetricFamily(name, help_text, labels=DCGM_LABELS)
            for name, help_text, _ in DCGM
        }
        if snap is not None:
            for c in snap.cards:
                if c.state == "held" and c.idle_seconds is not None:
                    idle.add_metric(
                        [c.uuid, str(c.index), c.type, c.node, c.user or "", c.server or ""],
                        c.idle_seconds,
                    )
                r = c.reading
                if r is None:
                    continue
                held = c.state == "held"
                labels = [
                    str(c.index),
                    c.uuid,
                    f"nvidia{c.minor if c.minor is not None else c.index}",
                    c.model,
                    c.node,
                    c.type,
                    (c.user or "") if held else "",
                    (c.server or "") if held else "",
                    _bool(c.simulated),
                ]
                free = None
                if r.mem_total_mib is not None and r.mem_used_mib is not None:
                    free = max(0.0, r.mem_total_mib - r.mem_used_mib)
                values: dict[str, Any] = {
                    "util_pct": r.util_pct,
                    "mem_used_mib": r.mem_used_mib,
                    "mem_free_mib": free,
                    "power_w": r.power_w,
                    "temp_c": r.temp_c,
                }
                for name, _, field in DCGM:
                    if values[field] is not None:
                        dcgm[name].add_metric(labels, float(values[field]))
        yield idle
        yield from dcgm.values()

    def _disk(self) -> Metric:
        disk = GaugeMetricFamily(
            "gpulab_data_disk_bytes",
            "The filesystem of the hub's data dir: its size and the bytes free to the hub.",
            labels=["kind"],
        )
        try:
            st = os.statvfs(GpuPool.instance().data_dir)
        except OSError:
            return disk
        disk.add_metric(["size"], st.f_blocks * st.f_frsize)
        disk.add_metric(["free"], st.f_bavail * st.f_frsize)
        return disk


def _filled(family: HistogramMetricFamily, table: Any) -> HistogramMetricFamily:
    """``family`` with every labelled histogram of a counters table (its cumulative buckets)."""
    for key, buckets, total in table.items():
        family.add_metric(list(key), buckets, total)
    return family


def _zero_filled(family: CounterMetricFamily, table: Any, values: Any) -> CounterMetricFamily:
    """``family`` with one sample per value of its one fixed label, 0 for those never counted
    (an alert rule reads a series that exists from the hub's start)."""
    seen = dict(table.items())
    for value in values:
        family.add_metric([value], seen.get((value,), 0.0))
    return family


_INSTALLED: list[GpulabCollector] = []


def install(app: Any) -> GpulabCollector:
    """Keep ``app`` for the snapshots and register the collector on JupyterHub's registry
    (once per process)."""
    snapshots.install(app)
    if not _INSTALLED:
        collector = GpulabCollector()
        REGISTRY.register(collector)
        _INSTALLED.append(collector)
    return _INSTALLED[0]
