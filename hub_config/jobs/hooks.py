"""The scheduler's calls into the parts that decide how an attempt ended and what comes next
(``resume.py``: preemption, requeue, checkpoints) and that start jobs over many nodes
(``gang.py``), each with the safe default used when that module or function is absent.

Kept apart so that the scheduler's call sites stay small and the hooks' contract (the notes of
issue 26) is read in one place.
"""

from __future__ import annotations

import importlib
from typing import Any

from gpulab.spawners.jobs.model import (
    BALANCE,
    CANCELLED,
    CANCELLED_END,
    EXITED,
    FAILED,
    LOST,
    NODE_FAILED,
    PREEMPTED,
    QUEUED,
    START_FAILED,
    SUCCEEDED,
    Attempt,
    Job,
)


def _hook(module: str, name: str) -> Any:
    try:
        mod = importlib.import_module(f"gpulab.hub_config.jobs.{module}")
    except ImportError:
        return None
    return getattr(mod, name, None)


def default_classify_end(job: Job, attempt: Attempt, info: dict[str, Any]) -> str:
    """Why an attempt ended, from who stopped its servers and what the runner said."""
    stopped_by = info.get("stopped_by")
    if stopped_by == "user" or job.cancel_requested:
        return CANCELLED_END
    if stopped_by == "billing":
        return BALANCE
    if stopped_by == "market":
        return PREEMPTED
    if info.get("start_error"):
        return START_FAILED
    if info.get("lost"):
        return LOST
    if info.get("exit_code") is not None:
        return EXITED
    return NODE_FAILED


def default_after_attempt(job: Job, attempt: Attempt) -> None:
    """The job's next state once ``attempt`` ended: done, failed, cancelled or queued again."""
    end = attempt.end
    if end == EXITED:
        job.exit_code = attempt.exit_code
        if attempt.exit_code == 0:
            job.state, job.reason = SUCCEEDED, "the command exited with 0"
        else:
            job.state = FAILED
            job.reason = f"the command exited with {attempt.exit_code}"
    elif end == CANCELLED_END:
        job.state, job.reason = CANCELLED, "cancelled"
    elif end == BALANCE:
        job.state, job.reason = FAILED, "balance ran out"
    elif end in (PREEMPTED, NODE_FAILED, LOST) and len(job.attempts) < job.spec.max_attempts:
        job.state = QUEUED
        job.reason = f"attempt {attempt.n} ended ({end}); waiting to run again"
    elif end in (PREEMPTED, NODE_FAILED, LOST):
        job.state = FAILED
        job.reason = f"attempt {attempt.n} ended ({end}) and the job used all its attempts"
    else:
        job.state = FAILED
        job.reason = attempt.note or "its server could not be started"


def classify_end(job: Job, attempt: Attempt, info: dict[str, Any]) -> str:
    hook = _hook("resume", "classify_end")
    return (hook or default_classify_end)(job, attempt, info)


def after_attempt(job: Job, attempt: Attempt) -> None:
    hook = _hook("resume", "after_attempt")
    (hook or default_after_attempt)(job, attempt)


def checkpoint_due(job: Job, now: float) -> bool:
    hook = _hook("resume", "checkpoint_due")
    return bool(hook(job, now)) if hook is not None else False


async def signal_checkpoint(job: Job, spawners: list[Any], now: float) -> None:
    hook = _hook("resume", "signal_checkpoint")
    if hook is not None:
        await hook(job, spawners, now)


def on_running(job: Job, attempt: Attempt) -> None:
    hook = _hook("resume", "on_running")
    if hook is not None:
        hook(job, attempt)


def gang_hooks() -> tuple[Any, Any, Any]:
    """(start_gang, end_gang, GangNotStarted) of ``gang.py``, or Nones when it is absent."""
    return (
        _hook("gang", "start_gang"),
        _hook("gang", "end_gang"),
        _hook("gang", "GangNotStarted"),
    )


def waiting_reason(job: Job, plan_reason: str) -> str:
    """Why a queued job waits: the plan's reason, led by why it waits again (preempted...)."""
    hook = _hook("resume", "waiting_reason")
    return hook(job, plan_reason) if hook is not None else plan_reason


def checkpoint_seconds(market: Any) -> float:
    """The time a job gets after its checkpoint signal (GPULAB_CHECKPOINT_SECONDS)."""
    hook = _hook("resume", "checkpoint_seconds")
    if hook is not None:
        return float(hook(market))
    return float(getattr(market, "warning_seconds", 60.0) or 60.0)
