"""What a server is doing, as the hub sees it: observed activity spans.

Billing must not rest on what a user's server says about itself. So the hub looks for itself:
a server is *active* while it has any process besides the single-user server itself (a kernel, a
terminal, a proxied app, anything they started, however detached), found where the user cannot
hide it (the server's cgroup or container). Each spawner class lists those processes
(``GpuSpawnerMixin.observe_activity``); this module turns the samples into spans.

A span never claims more than was seen: it starts at the earliest start time of the processes
that opened it (read from the kernel, so a sample that comes late, or a hub restart in the middle,
loses nothing) and ends at the last sample in which a process was still there. Reported kernel
and app spans add precision on top; billing bills the union.
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

    @property
    def active(self) -> bool:
        return bool(self.procs or self.gpu_pids)


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
    spans: list[Span] = field(default_factory=list)
    last_active: float | None = None

    @property
    def open(self) -> Span | None:
        return self.spans[-1] if self.spans and not self.spans[-1].closed else None

    def update(self, obs: Observation) -> Span | None:
        """Take one sample; return the span it opened, extended or closed (else None)."""
        span = self.open
        if obs.active:
            self.last_active = obs.t
            if span is None:
                started = min((p.started for p in obs.procs), default=obs.t)
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
        """Seconds since the server was last seen active (since its start if never)."""
        return now - (self.last_active if self.last_active is not None else self.session_start)
