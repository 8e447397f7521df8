"""The hub's card sampler: every card read every few seconds, off the event loop, and kept.

Who reads the cards: the Prometheus scrape (``collector.py``), the admin console and each
user's GPU view. None of them may call NVML on a request (it blocks, and a scrape must stay
cheap), so :class:`CardSampler` reads every card every ``interval`` seconds (jittered) in a
thread (:func:`gpulab.spawners.node.telemetry.read_cards`) and keeps:

- the latest reading of each card (:meth:`CardSampler.latest`);
- for each held card, when it was last seen busy (utilisation at ``busy_threshold`` % or more),
  so :meth:`CardSampler.idle_seconds` says how long a held card has done nothing;
- per GPU type, the mean utilisation of its cards in 1-minute buckets for 24 hours
  (:meth:`CardSampler.history`), in memory.

Simulated cards' utilisation follows the CPU their holding server uses, as the activity observer
measures it (``cpu_by_card``): what the hub itself saw, never what a server reports.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from traitlets import Float, TraitError, validate
from traitlets.config import SingletonConfigurable

from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.node.telemetry import CardReading, read_cards

BUCKET_SECONDS = 60
HISTORY_SECONDS = 24 * 3600

CpuSource = Callable[[], Mapping[str, float | None]]


def cpu_by_card(pool: GpuPool, trackers: Mapping[str, Any]) -> dict[str, float | None]:
    """Per held card's UUID, the CPU use (% of one core) of the server holding it, from the
    activity observer's ``trackers`` (owner -> ActivityTracker of its current session)."""
    out: dict[str, float | None] = {}
    for owner, tracker in list(trackers.items()):
        alloc = pool.allocator.get(owner)
        if alloc is None or alloc.alloc_id != tracker.session:
            continue
        for uuid in alloc.uuids:
            out[uuid] = tracker.cpu_percent
    return out


class CardSampler(SingletonConfigurable):
    """Reads every card periodically and keeps the readings; see the module docstring."""

    interval = Float(
        10.0,
        config=True,
        help="""Seconds between readings of every card (a random jitter of up to 10% is added).
        The metrics, the admin console and users' GPU views show the latest reading, so a
        figure is at most this old; each reading is one NVML call per card, in a thread.""",
    )

    busy_threshold = Float(
        5.0,
        config=True,
        help="""Utilisation (%) from which a card counts as busy. A held card below it is idle:
        the metrics' gpulab_card_idle_seconds and users' idle nudge count from its last busy
        reading.""",
    )

    @validate("interval")
    def _check_interval(self, proposal: dict) -> float:
        if not proposal["value"] > 0:
            raise TraitError(f"CardSampler.interval: {proposal['value']}; allowed: above 0")
        return proposal["value"]

    @validate("busy_threshold")
    def _check_busy(self, proposal: dict) -> float:
        if not 0 < proposal["value"] <= 100:
            raise TraitError(
                f"CardSampler.busy_threshold: {proposal['value']}; allowed: above 0, up to 100"
            )
        return proposal["value"]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool: GpuPool | None = None
        self.cpu_source: CpuSource = dict
        self._latest: dict[str, CardReading] = {}  # replaced per pass, never mutated
        self._sampled_at: float | None = None
        self._last_busy: dict[str, float] = {}  # uuid -> last time seen busy (held cards)
        self._held_since: dict[str, tuple[str, float]] = {}  # uuid -> (alloc id, created)
        # type -> deque of [bucket start, sum of per-sample means, samples]
        self._history: dict[str, deque] = {}
        self.last_pass_seconds: float | None = None  # the last pass's wall time (benchmarks)
        self._task: asyncio.Task | None = None

    # ---- running -------------------------------------------------------------------------------

    def start(self, pool: GpuPool, cpu_source: CpuSource | None = None) -> None:
        """Start sampling ``pool``'s cards (idempotent; needs a running event loop).
        ``cpu_source`` gives the simulated cards' CPU figures (:func:`cpu_by_card`)."""
        self.pool = pool
        if cpu_source is not None:
            self.cpu_source = cpu_source
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:
                self.log.exception("Reading the cards failed")
            await asyncio.sleep(self.interval * (1 + random.uniform(0, 0.1)))

    async def sample(self) -> None:
        """One pass: read every card in a thread, then keep the readings (on the loop)."""
        if self.pool is None:
            return
        t0 = time.perf_counter()
        cpu = dict(self.cpu_source())
        readings = await asyncio.to_thread(read_cards, self.pool.inventory, cpu)
        self.update(readings, time.time())
        self.last_pass_seconds = time.perf_counter() - t0

    def update(self, readings: list[CardReading], now: float) -> None:
        """Keep one pass's ``readings`` taken at ``now`` (on the event loop)."""
        self._latest = {r.uuid: r for r in readings}
        self._sampled_at = now
        held = self.pool.allocator.held_uuids() if self.pool is not None else {}
        for uuid in list(self._held_since):
            if uuid not in held or self._held_since[uuid][0] != held[uuid].alloc_id:
                self._held_since.pop(uuid, None)
                self._last_busy.pop(uuid, None)
        for uuid, alloc in held.items():
            self._held_since.setdefault(uuid, (alloc.alloc_id, alloc.created))
            reading = self._latest.get(uuid)
            if reading is not None and self._busy(reading):
                self._last_busy[uuid] = now
        self._add_history(readings, now)

    def _busy(self, reading: CardReading) -> bool:
        return reading.util_pct is not None and reading.util_pct >= self.busy_threshold

    def _add_history(self, readings: list[CardReading], now: float) -> None:
        if self.pool is None:
            return
        by_type: dict[str, list[float]] = {}
        for r in readings:
            device = self.pool.inventory.by_uuid(r.uuid)
            if device is None or device.gpu_type is None or r.util_pct is None:
                continue
            by_type.setdefault(device.gpu_type, []).append(r.util_pct)
        bucket = now - now % BUCKET_SECONDS
        for slug, utils in by_type.items():
            series = self._history.setdefault(slug, deque())
            mean = sum(utils) / len(utils)
            if series and series[-1][0] == bucket:
                series[-1][1] += mean
                series[-1][2] += 1
            else:
                series.append([bucket, mean, 1])
            while series and series[0][0] < now - HISTORY_SECONDS:
                series.popleft()

    # ---- reading -------------------------------------------------------------------------------

    def latest(self) -> dict[str, CardReading]:
        """The latest reading of each card that can be read here, by UUID."""
        return self._latest

    @property
    def sampled_at(self) -> float | None:
        """When the latest readings were taken (None before the first pass)."""
        return self._sampled_at

    def idle_seconds(self, uuid: str, now: float | None = None) -> float | None:
        """Seconds a held card has been idle: 0 while its latest reading is busy, else since its
        last busy reading or, if never seen busy, since its server took it. None for a card
        nobody holds, one not read yet, or one whose utilisation NVML does not give (unknown is
        not idle: no idle alert, console badge or nudge rests on a figure nobody has)."""
        since = self._held_since.get(uuid)
        reading = self._latest.get(uuid)
        if since is None or reading is None or reading.util_pct is None:
            return None
        if self._busy(reading):
            return 0.0
        now = time.time() if now is None else now
        return max(0.0, now - max(since[1], self._last_busy.get(uuid, since[1])))

    def history(self, gpu_type: str, since: float) -> list[tuple[float, float]]:
        """(bucket start, mean utilisation %) per minute of ``gpu_type``'s cards from ``since``."""
        return [(b, s / n) for b, s, n in self._history.get(gpu_type, ()) if b >= since]
