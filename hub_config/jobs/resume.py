"""Why a job's attempt ended, and what happens next: requeue after a preemption, lost work,
automatic checkpoints, the time to resume.

Issue 26's promise is that a spot reclaim or a failed node does not lose the run: the job goes
back to the queue by itself and its next attempt starts with ``GPULAB_RESUME`` naming its newest
checkpoint. The scheduler (:mod:`gpulab.hub_config.jobs.scheduler`) owns the loop and the
servers; it calls the plain functions of this module at the points where a decision is needed:

- :func:`classify_end` when an attempt's server(s) stopped: preempted (the spot market's own
  preemption record of one of its servers, made during this attempt, with the stop sent by the
  market), cancelled (the owner), balance (billing's enforcer), exited (the runner's exit code,
  as the hub observed it), start failed, or node failed (gone without an exit code). Only what
  the hub and the market observed decides; nothing the job's server says.
- :func:`after_attempt` then sets the job's state: preempted / node failed / lost attempts are
  requeued (``queued``, with the reason the user reads in ``gpulab jobs list``) until
  ``max_attempts`` of them happened; records ``lost_seconds`` (work since the last checkpoint
  the platform asked for and gave its time, or since the attempt ran) and a note with the
  market's preemption record: the reason, the processes signalled, the checkpoint and the
  compensation: the market's existing rule
  (:func:`gpulab.spawners.market.preemption.compensation_decision`) for a user's checkpoint
  command; for a job without one, the checkpoint the platform asked for is the warning's
  SIGUSR1 with ``checkpoint_seconds`` to act on it, credited (through the market's own
  ``compensation_hook``, keyed by the preemption) when the stop came before that time.
- :func:`on_running` when the next attempt runs: ``card_free_at`` (when a card within the bid
  was free again: the later of the previous attempt's end and the spot price's return under the
  bid, from the durable price history) so that the attempt's ``resume_seconds`` is the platform's
  time to resume; notes whose compensation was not decided yet are completed.
- :func:`checkpoint_due` / :func:`signal_checkpoint`: every ``spec.checkpoint_interval`` seconds
  of running, SIGUSR1 to the job servers' processes that catch it (the spawner's own
  :meth:`GpuSpawnerMixin.gpulab_signal_processes`, the same rule as the preemption warning), the
  time recorded in ``job.checkpoints``.

Every function tolerates a missing market (a hub without spot) and never raises on odd records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
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

log = logging.getLogger("gpulab.jobs")

# Ends that are the platform's doing: the job goes back to the queue (bounded by max_attempts).
REQUEUED_ENDS = frozenset({PREEMPTED, NODE_FAILED, LOST})
# Seconds a job gets after a checkpoint signal when no market says otherwise.
DEFAULT_CHECKPOINT_SECONDS = 60.0
# Slack when matching a preemption record's times to an attempt's (clocks are the hub's own).
SLACK = 1.0
PENDING = "compensation: not decided yet"
# Seconds of slack before a checkpoint signal counts as cut short (the market's own).
CUT_SHORT_GRACE = 1.0
_TASKS: set[asyncio.Task] = set()  # compensation posts in flight (kept from the collector)


# ---- the market, if any ----------------------------------------------------------------------


def _market(market: Any = None) -> Any:
    """The hub's spot market (or ``market`` when given), or None on a hub without one."""
    if market is not None:
        return market
    try:
        from gpulab.spawners.market.hub import SpotMarket

        return SpotMarket.instance() if SpotMarket.initialized() else None
    except Exception:
        return None


def checkpoint_seconds(market: Any = None) -> float:
    """Seconds a job gets after a checkpoint signal (``GPULAB_CHECKPOINT_SECONDS``): the
    market's warning period (``SpotMarket.warning_seconds``), the time between a preemption's
    SIGUSR1 and its stop; the same number bounds what counts as an acknowledged automatic
    checkpoint. :data:`DEFAULT_CHECKPOINT_SECONDS` without a market."""
    m = _market(market)
    try:
        return max(1.0, float(m.warning_seconds)) if m is not None else DEFAULT_CHECKPOINT_SECONDS
    except Exception:
        return DEFAULT_CHECKPOINT_SECONDS


def _records(job: Job, attempt: Attempt, market: Any, owner_keys: list[str] | None = None):
    """The market's preemption records of this attempt's servers warned during the attempt,
    oldest first (cancelled ones, where the price fell back, are not preemptions)."""
    m = _market(market)
    if m is None:
        return []
    keys = owner_keys or [f"{job.owner}/{name}" for name in (attempt.servers or job.server_names())]
    end = attempt.ended_at if attempt.ended_at is not None else float("inf")
    found = []
    try:
        for key in keys:
            for p in m.preemptions.of_owner(key):
                if p.status == "cancelled":
                    continue
                if attempt.started_at - SLACK <= p.warned_at <= end + SLACK:
                    found.append(p)
    except Exception:
        log.exception("Reading the preemption records of job %s failed", job.id)
        return []
    return sorted(found, key=lambda p: p.warned_at)


# ---- the end of an attempt ---------------------------------------------------------------------


def classify_end(job: Job, attempt: Attempt, info: dict[str, Any], *, market: Any = None) -> str:
    """Why ``attempt`` ended: one of the :class:`Attempt` ``end`` values.

    ``info`` is what the scheduler observed (see J3's notes): ``exit_code`` (the runner's, from
    the spawner), ``stopped_by`` (who DELETEd a server: "user", "billing", "market",
    "scheduler", None), ``owner_keys``, ``start_error``, ``server_gone``, ``lost``. In order: a cancel
    asked by the owner; billing's stop; the market's preemption (its record of one of the
    servers, warned during this attempt, whose stop the market sent before the attempt ended
    on its own); an attempt the hub lost track of; a start that failed; the command's own exit;
    else a node that failed.
    """
    stopped_by = info.get("stopped_by")
    if job.cancel_requested or stopped_by == "user":
        return CANCELLED_END
    if stopped_by == "billing":
        return BALANCE
    ended = attempt.ended_at if attempt.ended_at is not None else time.time()
    for p in _records(job, attempt, market, info.get("owner_keys")):
        # The market sent the stop (at the deadline) before the attempt was seen ending: a
        # command that finished on its own during the warning simply exited.
        if p.stop_sent_at is not None and p.stop_sent_at <= ended + SLACK:
            return PREEMPTED
    if stopped_by == "market":
        return PREEMPTED
    if info.get("lost"):
        return LOST
    if info.get("start_error"):
        return START_FAILED
    if info.get("exit_code") is not None:
        return EXITED
    return NODE_FAILED


def _hhmm(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M UTC")


def acknowledged_checkpoint(job: Job, attempt: Attempt, *, market: Any = None) -> float | None:
    """The last checkpoint signal of ``attempt`` that the job was given its time for (it kept
    running ``checkpoint_seconds`` after it), automatic or a preemption warning's; None."""
    cs = checkpoint_seconds(market)
    start = attempt.running_at or attempt.started_at
    end = attempt.ended_at if attempt.ended_at is not None else time.time()
    signals = [t for t in job.checkpoints if start <= t <= end]
    signals += [
        p.warned_at
        for p in _records(job, attempt, market)
        if p.signalled_pids and p.warned_at >= start
    ]
    acked = [t for t in signals if t + cs <= end]
    return max(acked) if acked else None


def lost_seconds(job: Job, attempt: Attempt, *, market: Any = None) -> float:
    """Work lost by the attempt's end: from the last acknowledged checkpoint, else from when the
    attempt ran (or was started), to its end."""
    end = attempt.ended_at if attempt.ended_at is not None else time.time()
    base = acknowledged_checkpoint(job, attempt, market=market)
    if base is None:
        base = attempt.running_at or attempt.started_at
    return round(max(0.0, end - base), 1)


def _preemption_note(job: Job, attempt: Attempt, market: Any) -> str:
    records = [p for p in _records(job, attempt, market) if p.stop_sent_at is not None]
    if not records:
        return ""
    p = records[-1]
    cur = ""
    m = _market(market)
    try:
        cur = m.pool.catalog.currency + " " if m is not None else ""
    except Exception:
        cur = ""
    why = p.reason
    if p.max_price is not None:
        why += f", spot {cur}{p.price}/h, your bid {cur}{p.max_price}/h"
    parts = [
        f"preempted at {_hhmm(p.stop_sent_at or p.warned_at)} ({why})",
        f"warned {max(0.0, (p.stop_sent_at or p.deadline) - p.warned_at):.0f} s before the stop",
        f"checkpoint signal to {len(p.signalled_pids)} process(es)",
    ]
    ck = p.checkpoint or {}
    if ck:
        parts.append(f"checkpoint command {ck.get('state', 'ran')}")
        comp = p.compensation  # the user's command: the market's own rule decides
        parts.append(comp["reason"] if comp else PENDING)
    else:
        parts.append(signal_compensation(p, market)[1])
    return "; ".join(parts)


def signal_compensation(p: Any, market: Any = None) -> tuple[bool, str]:
    """For a preempted job with no checkpoint command of its own, the checkpoint the platform
    asked for is the warning's SIGUSR1 with ``checkpoint_seconds`` to act on it (what
    ``GPULAB_CHECKPOINT_SECONDS`` promised). Owed only when the market's stop came before that
    time, by the market's own clock; a job none of whose processes handle the signal did not
    take part (the user's doing)."""
    promised = checkpoint_seconds(market)
    given = (p.stop_sent_at or p.deadline) - p.warned_at
    if not p.signalled_pids:
        return False, "no compensation: no process of the job handles the checkpoint signal"
    if given + CUT_SHORT_GRACE < promised:
        return True, (
            f"compensated: the job was stopped {max(0.0, given):.0f} s after its checkpoint "
            f"signal; it was promised {promised:.0f} s"
        )
    return False, f"no compensation: the job had its {promised:.0f} s after the checkpoint signal"


def _compensate_cut_short(job: Job, attempt: Attempt, market: Any) -> None:
    """Post the credit for a checkpoint signal not given its time (once: billing keys it by the
    preemption's id, the key the market itself would use)."""
    m = _market(market)
    hook = getattr(m, "compensation_hook", None) if m is not None else None
    records = [p for p in _records(job, attempt, market) if p.stop_sent_at is not None]
    if hook is None or not records or records[-1].checkpoint:
        return
    p = records[-1]
    due, _ = signal_compensation(p, market)
    if not due:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(
        hook(
            user=p.user,
            server=p.server,
            at=p.deadline,
            reason="spot-preemption",
            checkpoint="cut-short",
            key=f"preemption-{p.id}",
        )
    )
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


def after_attempt(job: Job, attempt: Attempt, *, market: Any = None) -> None:
    """Set the job's state after ``attempt`` ended (``end``, ``ended_at``, ``exit_code`` set by
    the scheduler, which saves the job after): requeue it after a preemption, a node failure
    or a lost attempt while fewer than ``spec.max_attempts`` ended so; else its final state."""
    end = attempt.end
    now = attempt.ended_at if attempt.ended_at is not None else time.time()
    if end in REQUEUED_ENDS:
        attempt.lost_seconds = lost_seconds(job, attempt, market=market)
    if end == PREEMPTED:
        note = _preemption_note(job, attempt, market)
        if note:
            attempt.note = note
        _compensate_cut_short(job, attempt, market)
    elif end == NODE_FAILED and not attempt.note:
        attempt.note = f"a node failed at {_hhmm(now)} (the server went away without an exit code)"
    elif end == LOST and not attempt.note:
        attempt.note = f"the hub lost track of the attempt at {_hhmm(now)}"

    if end == EXITED:
        job.exit_code = attempt.exit_code
        if attempt.exit_code == 0:
            job.state, job.reason = SUCCEEDED, "exited with code 0"
        else:
            job.state, job.reason = FAILED, f"exited with code {attempt.exit_code}"
    elif end == CANCELLED_END:
        job.state, job.reason = CANCELLED, "cancelled by its owner"
    elif end == BALANCE:
        job.state, job.reason = FAILED, "balance ran out"
    elif end == START_FAILED:
        job.state = FAILED
        job.reason = "could not start" + (f": {attempt.note}" if attempt.note else "")
    elif end in REQUEUED_ENDS:
        ended_so = sum(1 for a in job.attempts if a.end in REQUEUED_ENDS)
        if ended_so >= job.spec.max_attempts:
            job.state = FAILED
            job.reason = (
                f"gave up after {ended_so} attempt(s) ended by preemption or node failure "
                f"(max_attempts {job.spec.max_attempts})"
            )
        else:
            job.state = QUEUED
            job.exit_code = None
            job.reason = requeue_reason(job, attempt)
    else:  # an end this module does not know: never leave the job running with no server
        job.state, job.reason = FAILED, f"attempt ended: {end}"
    refresh_notes(job, market=market)


def requeue_reason(job: Job, attempt: Attempt) -> str:
    """What a requeued job says while it waits (``gpulab jobs list``), until the scheduler's
    next pass replaces it with what it waits for now."""
    at = _hhmm(attempt.ended_at or time.time())
    if attempt.end == PREEMPTED:
        if job.spec.pricing == "spot":
            return f"preempted at {at}; waiting for a card within your bid"
        return f"preempted at {at}; waiting for a card"
    if attempt.end == NODE_FAILED:
        return f"node failed at {at}; waiting for capacity"
    return f"lost at {at}; waiting for capacity"


def waiting_reason(job: Job, plan_reason: str) -> str:
    """Why a queued job waits, as the queue's plan says (``plan_reason``), led by why it is
    waiting again when its last attempt was preempted or lost a node: "preempted at 14:05 UTC;
    spot price CNY 0.60/h is above your bid CNY 0.40/h"."""
    a = job.attempt
    if a is None or a.end not in REQUEUED_ENDS or not plan_reason:
        return plan_reason
    return requeue_reason(job, a).split(";")[0] + "; " + plan_reason


def requeue_event(job: Job) -> str | None:
    """``job-requeued`` when the last attempt's end sent the job back to the queue, else None
    (for the scheduler's webhook)."""
    a = job.attempt
    return "job-requeued" if job.state == QUEUED and a and a.end in REQUEUED_ENDS else None


def refresh_notes(job: Job, *, market: Any = None) -> bool:
    """Complete the notes of preempted attempts whose compensation the market had not decided
    when they were written (it decides once the cards are released). True when one changed."""
    changed = False
    for a in job.attempts:
        if a.end == PREEMPTED and (not a.note or a.note.endswith(PENDING)):
            note = _preemption_note(job, a, market)
            if note and note != a.note:
                a.note = note
                changed = True
    return changed


# ---- the next attempt ---------------------------------------------------------------------------


def _bid_ok_since(job: Job, before: float, market: Any) -> float | None:
    """For a spot job: when the spot price last came back within its bid before ``before``
    (from the durable price history); None when it never left it or nothing is known."""
    if job.spec.pricing != "spot" or job.spec.max_price is None:
        return None
    m = _market(market)
    if m is None:
        return None
    try:
        bid = Decimal(str(job.spec.max_price))
        changes = m.history.changes(job.spec.gpu, 0.0)
    except (InvalidOperation, Exception):
        return None
    since = None
    above = False
    for c in changes:
        if c["t"] > before:
            break
        if Decimal(c["price"]) > bid:
            above = True
        elif above:
            since, above = c["t"], False
    return since


def on_running(job: Job, attempt: Attempt, *, market: Any = None) -> None:
    """``attempt`` just became running: set when its capacity became free, if the scheduler did
    not (a resumed attempt: the later of the previous attempt's end and the spot price's return
    within the bid), and complete earlier notes."""
    i = job.attempts.index(attempt) if attempt in job.attempts else len(job.attempts) - 1
    prev = job.attempts[i - 1] if i >= 1 else None
    if attempt.card_free_at is None and prev is not None and prev.ended_at is not None:
        free = prev.ended_at
        back = _bid_ok_since(job, attempt.started_at, market)
        if back is not None and back > free:
            free = back
        attempt.card_free_at = min(free, attempt.started_at)
    refresh_notes(job, market=market)


# ---- automatic checkpoints ------------------------------------------------------------------------


def checkpoint_due(job: Job, now: float) -> bool:
    """Whether a running job should be asked for a checkpoint now: ``spec.checkpoint_interval``
    seconds (0: never) after its attempt ran or its last checkpoint signal of this attempt."""
    interval = job.spec.checkpoint_interval
    attempt = job.attempt
    if not interval or attempt is None or attempt.running_at is None or attempt.ended_at:
        return False
    last = max([attempt.running_at, *(t for t in job.checkpoints if t >= attempt.running_at)])
    return now - last >= interval


async def signal_checkpoint(job: Job, spawners: list[Any], now: float | None = None) -> dict:
    """SIGUSR1 to the processes of the job's servers that catch it (the runner forwards it to the
    command's), and record the time. Returns ``{"signalled": [...], "skipped": [...]}``; a
    spawner that fails is logged and skipped (the interval restarts either way, so a job that
    cannot be signalled is not signalled every pass)."""
    now = time.time() if now is None else now
    signalled: list[int] = []
    skipped: list[int] = []
    for spawner in spawners:
        if spawner is None:
            continue
        try:
            s, k = await spawner.gpulab_signal_processes()
        except Exception:
            log.exception("Checkpoint signal to job %s failed", job.id)
            continue
        signalled += list(s)
        skipped += list(k)
    job.checkpoints.append(now)
    job.last_checkpoint_at = now
    log.info("Job %s: checkpoint signal to %d process(es)", job.id, len(signalled))
    return {"signalled": signalled, "skipped": skipped}


def attempt_summary(job: Job) -> dict[str, Any]:
    """Totals the pages show: attempts, preemptions, lost work, the last time to resume."""
    resumed = [a.resume_seconds() for a in job.attempts if a.resume_seconds() is not None]
    return {
        "attempts": len(job.attempts),
        "preemptions": sum(1 for a in job.attempts if a.end == PREEMPTED),
        "node_failures": sum(1 for a in job.attempts if a.end == NODE_FAILED),
        "lost_seconds": round(sum(a.lost_seconds or 0.0 for a in job.attempts), 1),
        "last_resume_seconds": resumed[-1] if resumed else None,
    }
