"""What a server is doing, as the hub sees it: observed activity spans, and whether it works.

Billing must not rest on what a user's server says about itself. So the hub looks for itself,
where the user cannot hide anything (the server's cgroup or container; each spawner class
samples it in ``GpuSpawnerMixin.observe_activity``), and this module turns the samples into two
verdicts:

- **present** (billed): the server holds GPU cards (``holds_cards``: a GPU server is billed for
  every second it holds them, whatever runs in it, as a cloud bills an instance; an idle one
  gives them back after the observer's ``gpu_idle_timeout``, so an unused card costs at most
  that long), or it has a process besides the single-user server itself (a kernel, a terminal,
  a proxied app, anything they started, however detached), or did work in the last interval
  (CPU consumed by anything in it, the single-user server's own process and its extensions
  included), or has a GPU process on its cards;
- **working** (not idle): the server consumed CPU at ``cpu_threshold`` or more since the last
  sample, as the hub measures it (the kernel's own CPU accounting per process or per cgroup), or
  has a GPU process on its cards (NVML). A kernel open but idle uses no CPU, so it is idle
  whatever its execution state claims; a busy loop that prints nothing works. Nothing the server
  says about itself enters this verdict: it drives JupyterHub's ``last_activity`` (so
  jupyterhub-idle-culler culls idle servers) and the observer's ``gpu_idle_timeout``.

A server with cards has one span from when it took them (``cards_since``) to its last sample
before it stopped: bursts of work cannot keep a card for the price of the bursts. A span of a
server without cards never claims more than was seen: it starts at the earliest start time of
the processes that opened it (read from the kernel, so a sample that comes late, or a hub
restart in the middle, loses nothing) and ends at the last sample in which a process was still
there. Reported kernel and app spans add precision on top; billing bills the union.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Proc:
    """One process of a server other than the single-user server itself."""

    pid: int
    started: float  # Unix time
    command: str = ""


@dataclass(frozen=True)
class Observation:
    t: float
    procs: tuple[Proc, ...]
    # GPU compute processes NVML sees on the server's cards (pids in the host's namespace).
    gpu_pids: tuple[int, ...] = ()
    # Cumulative CPU seconds per counter, for everything the server runs, the single-user server
    # itself included: one counter per process (keyed by pid and start time, so a reused pid is
    # a new counter) or one for the whole cgroup/container. None: the spawner cannot measure CPU;
    # then any process counts as work (the verdict before CPU was measured).
    cpu: tuple[tuple[str, float], ...] | None = None

    @property
    def active(self) -> bool:
        """Processes present or GPU in use (what this sample alone shows)."""
        return bool(self.procs or self.gpu_pids)


def cpu_used(before: dict[str, float] | None, now: dict[str, float]) -> float:
    """CPU seconds consumed between two samples of counters. A counter not in ``before`` is
    new since then (a process that started in between) and counts whole; a counter that went
    away (a process that exited) counts nothing more; a counter never goes backwards."""
    used = 0.0
    for key, value in now.items():
        prev = (before or {}).get(key)
        used += value if prev is None else max(0.0, value - prev)
    return used


@dataclass
class Span:
    id: str
    first: float
    last: float
    closed: bool = False

    def to_event(self, user: str, server: str) -> dict:
        """The billing event for this span (a hub kind: only the hub's own service may post it;
        the id makes each extension idempotent)."""
        return {
            "id": f"activity-{user}-{server}-{self.id}-{self.last:.3f}",
            "kind": "activity",
            "user": user,
            "server": server,
            "span": self.id,
            "first": self.first,
            "t": self.last,
        }


@dataclass
class ActivityTracker:
    """The observed spans of one server session."""

    session: str  # the server session's id: span ids are unique per session
    session_start: float
    # CPU seconds per second of wall time (0.05: 5% of one core) from which a server works.
    cpu_threshold: float = 0.05
    # The session holds GPU cards: it is billed for every second it holds them, as a cloud bills
    # an instance, whatever runs in it (the span is open from ``cards_since`` until ``close``).
    holds_cards: bool = False
    # When the cards were taken, if that is known to fall inside the billed session; None: from
    # this tracker's first sample.
    cards_since: float | None = None
    spans: list[Span] = field(default_factory=list)
    last_active: float | None = None  # the last sample in which the server worked
    working: bool = False  # the verdict of the last sample
    # CPU use between the last two samples, in % of one core (None until two samples); what a
    # simulated card's utilisation follows (spawners/node/telemetry.py).
    cpu_percent: float | None = None
    _prev: tuple[float, dict[str, float]] | None = None  # (t, CPU counters) of the last sample
    _first: float | None = None  # this tracker's first sample

    @property
    def open(self) -> Span | None:
        return self.spans[-1] if self.spans and not self.spans[-1].closed else None

    def _cpu_work(self, obs: Observation) -> tuple[bool, float | None]:
        """(whether CPU could be judged, when the work seen began: the previous sample's time,
        or None for no work). The first sample of a tracker has nothing to compare with: its
        processes' whole past CPU is not this interval's work."""
        if obs.cpu is None:
            return False, None
        counters = dict(obs.cpu)
        prev, self._prev = self._prev, (obs.t, counters)
        if prev is None or obs.t <= prev[0]:
            return False, None
        used = cpu_used(prev[1], counters)
        self.cpu_percent = 100.0 * used / (obs.t - prev[0])
        return True, prev[0] if used >= self.cpu_threshold * (obs.t - prev[0]) else None

    def update(self, obs: Observation) -> Span | None:
        """Take one sample; return the span it opened, extended or closed (else None)."""
        span = self.open
        if self._first is None:
            self._first = obs.t
        judged, cpu_since = self._cpu_work(obs)
        if judged:
            self.working = bool(obs.gpu_pids) or cpu_since is not None
        else:
            # No CPU measure (or no baseline yet, e.g. the first sample after a hub restart):
            # any process counts as work, so a busy server is never reclaimed for want of one.
            self.working = obs.active
        if self.working:
            self.last_active = obs.t
        if obs.active or self.working or self.holds_cards:
            if span is None:
                started = min((p.started for p in obs.procs), default=obs.t)
                if cpu_since is not None:
                    # Work with no process besides the server itself: since the last sample.
                    started = min(started, cpu_since)
                if self.holds_cards:
                    started = obs.t if self.cards_since is None else self.cards_since
                first = min(max(started, self.session_start), obs.t)
                if self.spans:
                    # Never reach back into a span already closed (the process was not there).
                    first = max(first, self.spans[-1].last)
                span = Span(id=f"{self.session}-{len(self.spans) + 1}", first=first, last=obs.t)
                self.spans.append(span)
                return span
            span.last = obs.t
            return span
        if span is not None:
            span.closed = True
            return span
        return None

    def close(self) -> Span | None:
        """The server stopped: close the open span at its last sample."""
        span = self.open
        if span is not None:
            span.closed = True
        return span

    def observed_seconds(self) -> float:
        return sum(s.last - s.first for s in self.spans)

    def idle_for(self, now: float) -> float:
        """Seconds since the server was last seen working; if never, since its start or, for a
        tracker that began mid-session (a hub restart), since its first sample: what it did
        before is not known, so it is not counted as idle."""
        if self.last_active is not None:
            return now - self.last_active
        return now - max(self.session_start, self._first or self.session_start)
