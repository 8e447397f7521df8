"""What the hub's job scheduler tells a job server at its start: the job's :class:`JobLaunch`.

A job attempt runs as a named server ``job-<id>`` (``job-<id>-<rank>`` for a gang) of its owner,
started through the hub's REST API like any server. What makes it a job server (the command, the
attempt, the rank and rendezvous of a gang, an allocation made ahead for a gang) cannot travel in
the spawn options, which a user can set: the scheduler files it here, in the hub's memory, under
the server's owner key before it asks for the start, and the spawner takes it at its start
(:func:`launch_for`) and keeps it in its state. Nothing a user sends reaches this registry.

The way back is here too: whenever a spawner sees a job runner's process or container end (its
poll, its stop, Popen's wait, Docker's ExitCode) it files the exit code under the same owner key
and attempt (:func:`note_exit`). JupyterHub drops the spawner of a server its own poll found
stopped, so the scheduler, which may look later, reads the code here (:func:`exit_for`) rather
than from a spawner that may no longer exist. Only the hub's own observations are filed here.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

from gpulab.spawners.jobs.model import JOB_SERVER_PREFIX


def is_job_server(name: str) -> bool:
    """Whether a server name is a job server's (``job-17``, ``job-17-0``): any name with the
    prefix, which only the platform may start."""
    return bool(name) and name.startswith(JOB_SERVER_PREFIX)


@dataclass(frozen=True)
class JobLaunch:
    """One rank of one attempt of a job, as its server runs it (see the module docstring).

    ``checkpoint_seconds``: the time the job gets after the checkpoint signal (SIGUSR1) before
    the platform stops it. ``env``: the rendezvous the scheduler chose (``MASTER_ADDR``,
    ``MASTER_PORT`` for a gang; empty for one node: the runner picks 127.0.0.1 and a free port).
    ``alloc_id``: cards the scheduler allocated ahead (a gang): the spawner adopts them instead
    of allocating. ``network``: a Swarm job's own overlay network."""

    job_id: int
    attempt: int
    rank: int
    nodes: int
    gpus: int
    command: str
    cwd: str = ""
    checkpoint_seconds: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    alloc_id: str | None = None
    network: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any] | str) -> JobLaunch:
        data = json.loads(raw) if isinstance(raw, str) else dict(raw)
        return cls(
            job_id=int(data["job_id"]),
            attempt=int(data["attempt"]),
            rank=int(data.get("rank", 0)),
            nodes=int(data.get("nodes", 1)),
            gpus=int(data.get("gpus", 0)),
            command=str(data["command"]),
            cwd=str(data.get("cwd") or ""),
            checkpoint_seconds=float(data.get("checkpoint_seconds", 60.0)),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            alloc_id=data.get("alloc_id") or None,
            network=data.get("network") or None,
        )


_OFFERED: dict[str, JobLaunch] = {}
_LOCK = threading.Lock()


def offer(owner_key: str, launch: JobLaunch) -> None:
    """The scheduler files ``launch`` for the start of ``owner_key``'s server (``alice/job-17``),
    before it asks the hub to start it (replaces an earlier attempt's)."""
    with _LOCK:
        _OFFERED[owner_key] = launch
        _EXITS.pop(owner_key, None)


def launch_for(owner_key: str) -> JobLaunch | None:
    """The launch filed for ``owner_key``'s server, or None (kept until :func:`withdraw`)."""
    with _LOCK:
        return _OFFERED.get(owner_key)


def withdraw(owner_key: str) -> None:
    """The attempt is over: nothing is filed for ``owner_key`` any more."""
    with _LOCK:
        _OFFERED.pop(owner_key, None)


# Exit codes the hub saw: owner key -> (attempt, code); the oldest go first past EXITS_KEPT.
EXITS_KEPT = 4096
_EXITS: OrderedDict[str, tuple[int, int]] = OrderedDict()


def note_exit(owner_key: str, attempt: int, code: int) -> None:
    """A spawner saw attempt ``attempt`` of ``owner_key``'s job runner end with ``code`` (the
    first code seen for that attempt stays: a later stop of the ended server changes nothing)."""
    with _LOCK:
        kept = _EXITS.get(owner_key)
        if kept is not None and kept[0] == attempt:
            return
        _EXITS.pop(owner_key, None)
        _EXITS[owner_key] = (attempt, int(code))
        while len(_EXITS) > EXITS_KEPT:
            _EXITS.popitem(last=False)


def exit_for(owner_key: str, attempt: int) -> int | None:
    """The exit code a spawner saw for attempt ``attempt`` of ``owner_key``'s runner, or None."""
    with _LOCK:
        kept = _EXITS.get(owner_key)
    return kept[1] if kept is not None and kept[0] == attempt else None


def forget_exit(owner_key: str) -> None:
    """A new start of ``owner_key``'s server: the exit code of an earlier one goes."""
    with _LOCK:
        _EXITS.pop(owner_key, None)
