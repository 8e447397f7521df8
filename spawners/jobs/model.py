"""A training job and its attempts: states, why an attempt ended, and the names of its servers.

A job (:class:`Job`) is queued, then started as one attempt (:class:`Attempt`) after another
until one ends for good: each attempt runs as the owner's named server(s) ``job-<id>`` (one node)
or ``job-<id>-<rank>`` (a gang of nodes, rank 0..nodes-1); a preempted or failed node's attempt
sends the job back to the queue, to resume from its last checkpoint. The store
(:mod:`gpulab.spawners.jobs.store`) keeps each version of a job; :meth:`Job.to_api` is what the
REST API, the CLI and the pages show.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpulab.spawners.jobs.spec import JobSpec

# Job states.
QUEUED = "queued"
STARTING = "starting"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
STATES = (QUEUED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED)
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
# Holding (or about to hold) cards: what the per-user and per-course limits count.
ACTIVE = frozenset({STARTING, RUNNING})

# Why an attempt ended (Attempt.end).
EXITED = "exited"  # the command exited (its exit code says how)
PREEMPTED = "preempted"  # the spot market reclaimed a card
NODE_FAILED = "node_failed"  # a node (or its engine) went away under the attempt
CANCELLED_END = "cancelled"  # the owner (or an admin) cancelled the job
BALANCE = "balance"  # billing stopped it: the money ran out
START_FAILED = "start_failed"  # a server of the attempt could not be started
LOST = "lost"  # the hub lost track of it (e.g. restarted without its servers)
ENDS = (EXITED, PREEMPTED, NODE_FAILED, CANCELLED_END, BALANCE, START_FAILED, LOST)

JOB_SERVER_PREFIX = "job-"
_SERVER_RE = re.compile(r"job-([1-9][0-9]{0,17})(?:-(0|[1-9][0-9]{0,3}))?")


def job_server_name(job_id: int, rank: int | None) -> str:
    """``job-17`` for a one-node job (rank None), ``job-17-1`` for rank 1 of a gang."""
    if job_id < 1 or (rank is not None and rank < 0):
        raise ValueError(f"no job server for job {job_id} rank {rank}")
    return f"{JOB_SERVER_PREFIX}{job_id}" if rank is None else f"{JOB_SERVER_PREFIX}{job_id}-{rank}"


def parse_server_name(name: str) -> tuple[int, int | None] | None:
    """``"job-17"`` -> (17, None), ``"job-17-1"`` -> (17, 1); anything else (``"job-"``,
    ``"job-017"``, ``"job-x"``, ``"lab"``) -> None. Exactly the names :func:`job_server_name`
    makes."""
    m = _SERVER_RE.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        return None
    return int(m.group(1)), None if m.group(2) is None else int(m.group(2))


def iso(t: float | None) -> str | None:
    """A time as the API shows it: ISO-8601 in UTC to the second, ``2026-12-03T12:00:00Z``."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(kw_only=True)
class Attempt:
    """One run of a job: started (servers asked for), running (the command runs), ended."""

    n: int  # 1, 2, ...
    started_at: float
    running_at: float | None = None
    ended_at: float | None = None
    end: str | None = None  # one of ENDS once ended
    exit_code: int | None = None
    servers: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # the node each rank ran on
    # The checkpoint GPULAB_RESUME named (the runner's report; the user's own path, shown only).
    resumed_from: str | None = None
    # When the capacity this attempt started on became free (for the time to resume).
    card_free_at: float | None = None
    # Work done since the last checkpoint the platform saw acknowledged, lost by this end.
    lost_seconds: float | None = None
    note: str = ""

    def resume_seconds(self) -> float | None:
        """From the card being free to the command running again (None until both are known)."""
        if self.card_free_at is None or self.running_at is None:
            return None
        return max(0.0, self.running_at - self.card_free_at)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def to_api(self) -> dict[str, Any]:
        out = self.to_json()
        for key in ("started_at", "running_at", "ended_at", "card_free_at"):
            out[key] = iso(getattr(self, key))
        out["resume_seconds"] = self.resume_seconds()
        return out


@dataclass(kw_only=True)
class Job:
    """A submitted job and everything that happened to it. Mutable: the scheduler changes it and
    saves a new version (:meth:`gpulab.spawners.jobs.store.JobStore.save`)."""

    id: int
    owner: str
    spec: JobSpec
    state: str = QUEUED
    reason: str = ""  # why it waits, or how it ended, in plain words
    submitted_at: float
    updated_at: float
    attempts: list[Attempt] = field(default_factory=list)
    exit_code: int | None = None
    cancel_requested: bool = False
    # Who stopped a server of its current attempt: "user" | "billing" | "market" | "platform".
    stopped_by: str | None = None
    checkpoints: list[float] = field(default_factory=list)  # when the platform signalled one
    last_checkpoint_at: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def attempt(self) -> Attempt | None:
        """The latest attempt, or None before the first start."""
        return self.attempts[-1] if self.attempts else None

    def copy(self) -> Job:
        """An independent copy (the store hands these out: a change is made by saving it)."""
        return replace(
            self,
            attempts=[
                replace(a, servers=list(a.servers), nodes=list(a.nodes)) for a in self.attempts
            ],
            checkpoints=list(self.checkpoints),
        )

    def server_names(self) -> list[str]:
        """Its servers' names: ``[job-ID]`` on one node, ``[job-ID-0, ..., job-ID-(N-1)]``."""
        if self.spec.nodes == 1:
            return [job_server_name(self.id, None)]
        return [job_server_name(self.id, r) for r in range(self.spec.nodes)]

    def to_json(self) -> dict[str, Any]:
        """As stored (times as epoch seconds)."""
        return {
            "id": self.id,
            "owner": self.owner,
            "spec": self.spec.to_json(),
            "submitted_at": self.submitted_at,
            "updated_at": self.updated_at,
            "state": self.state,
            "reason": self.reason,
            "attempts": [a.to_json() for a in self.attempts],
            "exit_code": self.exit_code,
            "cancel_requested": self.cancel_requested,
            "stopped_by": self.stopped_by,
            "checkpoints": list(self.checkpoints),
            "last_checkpoint_at": self.last_checkpoint_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Job:
        return cls(
            id=int(data["id"]),
            owner=str(data["owner"]),
            spec=JobSpec.from_json(data["spec"]),
            submitted_at=float(data["submitted_at"]),
            updated_at=float(data["updated_at"]),
            state=data.get("state", QUEUED),
            reason=data.get("reason", ""),
            attempts=[Attempt.from_json(a) for a in data.get("attempts", [])],
            exit_code=data.get("exit_code"),
            cancel_requested=bool(data.get("cancel_requested", False)),
            stopped_by=data.get("stopped_by"),
            checkpoints=[float(t) for t in data.get("checkpoints", [])],
            last_checkpoint_at=data.get("last_checkpoint_at"),
        )

    def to_api(self) -> dict[str, Any]:
        """The job as the REST API answers it (times ISO-8601 UTC): the spec's fields at the top
        level, then its state, why it waits or ended, attempts with their timings and totals."""
        first = self.attempts[0] if self.attempts else None
        last = self.attempt
        lost = [a.lost_seconds for a in self.attempts if a.lost_seconds is not None]
        return {
            "id": self.id,
            "owner": self.owner,
            **self.spec.to_json(),
            "cards": self.spec.cards(),
            "state": self.state,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "submitted_at": iso(self.submitted_at),
            "updated_at": iso(self.updated_at),
            "started_at": iso(first.started_at) if first else None,
            "ended_at": iso(last.ended_at) if last and self.terminal else None,
            "servers": self.server_names(),
            "cancel_requested": self.cancel_requested,
            "stopped_by": self.stopped_by,
            "attempts": [a.to_api() for a in self.attempts],
            "attempt_count": len(self.attempts),
            "lost_seconds": sum(lost) if lost else 0.0,
            "checkpoints": [iso(t) for t in self.checkpoints],
            "last_checkpoint_at": iso(self.last_checkpoint_at),
        }
