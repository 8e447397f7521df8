"""The hub watches every server itself: observed activity for billing, JupyterHub's activity
record, and GPUs that nobody uses going back to the pool.

Every ``interval`` seconds (jittered) each running gpulab server is sampled where the user
cannot hide anything (``GpuSpawnerMixin.observe_activity``: its cgroup, its container, NVML's
processes on its cards): its processes other than the single-user server itself, and the CPU
time everything in it consumed, the server's own process included. From those samples
(:mod:`gpulab.spawners.activity`):

- **billing** gets ``activity`` spans (a hub-only event kind): a GPU server's for every second
  it holds its cards, whatever runs in it (as a cloud bills an instance: work in rare bursts
  cannot keep a card for the price of the bursts); a no-GPU server's while it has a process
  besides itself or does work, so a server is billed whatever its own reporter says or doesn't
  say; billing also enforces money from these spans, so a server whose reports stopped is still
  checked against its balance;
- **JupyterHub's ``last_activity``** moves only while a server *works* (CPU at ``cpu_threshold``
  or more, or a GPU process), through the REST API at most every ``activity_update_interval``,
  so jupyterhub-idle-culler and the admin page see the truth: a kernel busy in a silent loop is
  activity; an open notebook whose kernel sits idle is not, nor is a forged heartbeat;
- **idle GPUs go back**: a GPU server that did no work for ``gpu_idle_timeout`` is moved to
  no-GPU mode through the switch endpoint (same home), and a no-GPU server idle for
  ``idle_timeout`` is stopped. The user is told why (:mod:`.notices`). A training job's server
  (``job-*``, :mod:`gpulab.hub_config.jobs`) is exempt: a job waiting on I/O or a data loader is
  not idle, and it ends when its command does; it is observed and billed all the same.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from traitlets import Any as AnyTrait
from traitlets import Bool, Float, Integer, TraitError, validate
from traitlets.config import SingletonConfigurable

from gpulab.catalog import NO_GPU
from gpulab.hub_config.billing.notices import Notices
from gpulab.spawners.activity import ActivityTracker, Span
from gpulab.spawners.jobs.launch import is_job_server
from gpulab.spawners.market.hub_client import server_path
from gpulab.spawners.node.counters import OBSERVER_CLOCK, OBSERVER_PASS, OBSERVER_SAMPLES

# (method, path under the hub API, JSON body) -> (status, text)
HubAPI = Callable[[str, str, Any], Awaitable[tuple[int, str]]]


class ActivityObserver(SingletonConfigurable):
    """Samples every running server's processes; see the module docstring."""

    interval = Float(
        2.0,
        config=True,
        help="""Seconds between samples of each server's processes (a random jitter of up to
        10% is added). Observed spans end at the last sample that saw a process, so billing never
        charges more than was seen; shorter intervals miss less of very short processes.""",
    )

    activity_update_interval = Float(
        30.0,
        config=True,
        help="""At most this often (seconds) an active server's JupyterHub last_activity is
        moved to now (what jupyterhub-idle-culler and the admin page read).""",
    )

    gpu_idle_timeout = Float(
        600.0,
        config=True,
        help="""A GPU server that did no work (CPU below `cpu_threshold`, no GPU process) for
        this many seconds is moved to no-GPU mode, giving its cards back; an open notebook whose
        kernel sits idle does no work. 0 turns this off.""",
    )

    idle_timeout = Float(
        900.0,
        config=True,
        help="""A no-GPU server that did no work for this many seconds is stopped.
        0 turns this off.""",
    )

    cpu_threshold = Float(
        0.05,
        config=True,
        help="""CPU seconds per second (0.05: 5% of one core), summed over everything a server
        runs (the single-user server itself included), from which a sample counts as work. An
        idle Jupyter server with an open, idle kernel uses well under 1%; a busy loop uses 100%.
        Measured by the hub (per cgroup, container or process), never reported by the server.""",
    )

    @validate("cpu_threshold")
    def _check_cpu_threshold(self, proposal: dict) -> float:
        if not 0 < proposal["value"] <= 1:
            raise TraitError(f"cpu_threshold: {proposal['value']}; allowed: more than 0, up to 1")
        return proposal["value"]

    report_interval = Float(
        15.0,
        config=True,
        help="""At most this often (seconds) billing hears that an open span grew; a span that
        opens or closes is reported at once. Nothing is lost in between if the hub dies: spans
        reopen from the processes' own start times.""",
    )

    bill_observed = Bool(
        True,
        config=True,
        help="""Whether observed activity is billed (reported to billing). Turning it off leaves
        billing to the servers' own reports, which any user can stop sending: only for tests of
        the reporter alone.""",
    )

    report_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""An async callable(events) that delivers ``activity`` events to billing (set by
        gpulab's billing wiring). None: activity is observed (last_activity, idle GPUs) but not
        billed.""",
    )

    max_concurrent = Integer(
        16,
        config=True,
        help="How many servers are sampled at the same time (each sample may be a Docker call).",
    )

    def __init__(self, *, hub_api: HubAPI, notices: Notices, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hub_api = hub_api
        self.notices = notices
        self._reported: dict[str, float] = {}  # span id -> its last reported ``last``
        self.trackers: dict[str, ActivityTracker] = {}  # owner -> its current session's tracker
        self._activity_sent: dict[str, float] = {}
        self._acting: set[str] = set()
        self._task: asyncio.Task | None = None

    def start(self, spawners: Callable[[], list[Any]], after: Awaitable[Any] | None) -> None:
        """Start sampling (idempotent). ``spawners`` lists the hub's running gpulab spawners."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop(spawners, after))

    async def _loop(self, spawners: Callable[[], list[Any]], after: Awaitable[Any] | None) -> None:
        if after is not None:
            await after
        while True:
            try:
                await self.tick(spawners())
            except Exception:
                self.log.exception("Activity observation failed")
            await asyncio.sleep(self.interval * (1 + random.uniform(0, 0.1)))

    async def tick(self, running: list[Any]) -> None:
        """One round over the running servers (also called directly by tests)."""
        gate = asyncio.Semaphore(self.max_concurrent)
        events: list[dict[str, Any]] = []
        t0 = time.perf_counter()

        async def one(spawner: Any) -> None:
            async with gate:
                try:
                    events.extend(await self._observe(spawner))
                except Exception:
                    # One server's failure must not cost every other server its observation,
                    # or billing their events.
                    self.log.exception("Observation of %s failed", getattr(spawner, "owner", "?"))

        seen = {s.owner for s in running}
        await asyncio.gather(*(one(s) for s in running))
        for owner in list(self.trackers):
            if owner not in seen:
                events.extend(self._end(owner))
        # The pass's own cost and lag, for the hub's metrics (billing's delivery not included).
        OBSERVER_PASS.observe(time.perf_counter() - t0)
        OBSERVER_CLOCK.last_pass = time.time()
        if events and self.report_hook is not None and self.bill_observed:
            await self.report_hook(events)

    def _due(self, span: Span, now: float) -> bool:
        last = self._reported.get(span.id)
        if span.closed:
            self._reported.pop(span.id, None)
            return last != span.last
        if last is None or now - last >= self.report_interval:
            self._reported[span.id] = span.last
            return True
        return False

    def _end(self, owner: str) -> list[dict[str, Any]]:
        tracker = self.trackers.pop(owner, None)
        self._activity_sent.pop(owner, None)
        span = tracker.close() if tracker is not None else None
        user, _, server = owner.partition("/")
        if span is None or not self._due(span, span.last):
            return []
        return [span.to_event(user, server)]

    async def _observe(self, spawner: Any) -> list[dict[str, Any]]:
        alloc = spawner.allocation
        if alloc is None:
            return []
        owner = spawner.owner
        tracker = self.trackers.get(owner)
        if tracker is None or tracker.session != alloc.alloc_id:
            ended = self._end(owner) if tracker is not None else []
            started = _started(spawner)
            tracker = self.trackers[owner] = ActivityTracker(
                session=alloc.alloc_id,
                session_start=_session_start(alloc, started),
                cpu_threshold=self.cpu_threshold,
                holds_cards=bool(alloc.uuids),
                cards_since=_cards_since(alloc, started),
            )
        else:
            ended = []
        try:
            obs = await spawner.observe_activity()
        except Exception:
            # Whatever the server did to itself (a process name that is no UTF-8, ...): this
            # sample is lost, not the pass, and a previous session's end still reaches billing.
            self.log.exception("Could not observe %s", owner)
            return ended
        if obs is None:
            return ended
        OBSERVER_SAMPLES.inc()
        span: Span | None = tracker.update(obs)
        user, _, server = owner.partition("/")
        events = list(ended)
        if span is not None and self._due(span, obs.t):
            events.append(span.to_event(user, server))
        if tracker.working:
            await self._note_activity(owner, obs.t)
        elif owner not in self._acting:
            await self._maybe_reclaim(spawner, tracker, obs.t)
        return events

    async def _note_activity(self, owner: str, t: float) -> None:
        if t - self._activity_sent.get(owner, 0.0) < self.activity_update_interval:
            return
        self._activity_sent[owner] = t
        user, _, server = owner.partition("/")
        stamp = datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
        body = {"last_activity": stamp, "servers": {server: {"last_activity": stamp}}}
        code, text = await self.hub_api("POST", f"/users/{quote(user)}/activity", body)
        if code >= 300:
            self.log.warning("Could not record activity of %s: %s %s", owner, code, text[:200])

    async def _maybe_reclaim(self, spawner: Any, tracker: ActivityTracker, now: float) -> None:
        idle = tracker.idle_for(now)
        gpu = spawner.allocation.gpu_type is not None  # holds cards
        limit = self.gpu_idle_timeout if gpu else self.idle_timeout
        if limit <= 0 or idle < limit:
            return
        owner = spawner.owner
        if is_job_server(owner.partition("/")[2]):
            return  # a job's server is never switched or stopped as idle (billed all the same)
        self._acting.add(owner)
        task = asyncio.ensure_future(self._reclaim(owner, gpu, idle))
        task.add_done_callback(lambda _: self._acting.discard(owner))

    async def _reclaim(self, owner: str, gpu: bool, idle: float) -> None:
        user, _, server = owner.partition("/")
        minutes = f"{idle / 60:.0f} minutes"
        if gpu:
            message = (
                f"No activity on your GPU server for {minutes}: it was moved to no-GPU mode, "
                "same home, so its cards go back to the pool. Switch back to a GPU when you need one."
            )
            path = f"/gpulab/users/{quote(user)}/switch"
            code, text = await self.hub_api("POST", path, {"gpu": NO_GPU})
            kind = "gpu-idle"
            if code == 402:
                # Not even no-GPU mode can be paid: the cards go back all the same.
                message = f"No activity on your GPU server for {minutes}: it was stopped."
                code, text = await self.hub_api("DELETE", server_path(user, server), None)
        else:
            message = f"No activity on your server for {minutes}: it was stopped."
            path = (
                f"/users/{quote(user)}/servers/{quote(server)}"
                if server
                else f"/users/{quote(user)}/server"
            )
            code, text = await self.hub_api("DELETE", path, None)
            kind = "idle-stop"
        if code >= 300:
            self.log.warning("Could not reclaim idle %s (%s): %s %s", owner, kind, code, text[:200])
            return
        self.log.info("Reclaimed idle %s after %.0fs: %s", owner, idle, kind)
        self.notices.add(user, kind, message, at=time.time())


def _cards_since(alloc: Any, started: float) -> float | None:
    """When the server took its cards, if that is known to fall inside its billed session: cards
    taken at the spawn (after billing heard ``server_start``, which comes before the allocation)
    are billed from then. Cards reserved before the spawn (a switch) were taken before billing's
    session began, so those are billed from the first sample instead (None): a span reaching
    back before its session would be billed to the one before."""
    if not alloc.uuids:
        return None
    return alloc.created if alloc.created >= started else None


def _session_start(alloc: Any, started: float) -> float:
    """The earliest second a span of this session may claim: a time inside billing's session.

    JupyterHub's ``started`` comes before billing hears ``server_start`` (the spawner's
    ``pre_allocate_hook``); an allocation made by the spawn comes after it. A job runner starts
    its command at once, and the kernel's process table (boot time in whole seconds plus ticks)
    can date that child a little before both: bounded by the allocation's creation, its span
    never reaches back before its session (issue 26, F6). An allocation made before the spawn
    (a switch) bounds nothing; billing places observed spans by their latest sample anyway."""
    created = getattr(alloc, "created", None)
    return created if created is not None and created >= started else started


def _started(spawner: Any) -> float:
    orm = getattr(spawner, "orm_spawner", None)
    started = getattr(orm, "started", None)
    if started is not None:
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        return started.timestamp()
    return time.time()
