"""What a spot server is told before it is reclaimed, and the records of it: :class:`Preemptions`.

A preemption starts with a warning and ends at its deadline (the server is stopped through the
hub's API) or earlier, cancelled, when the price falls back under the bid. During the warning,
concurrently:

- SIGUSR1 to the server's processes that *catch* it (bit 10 of ``SigCgt`` in /proc/PID/status):
  SIGUSR1's default action terminates a process, so a kernel that did not opt in
  (``gpulab_spot.on_preempt``) must never receive it. The spawner does it where its processes
  live (:meth:`GpuSpawnerMixin.gpulab_signal_processes`).
- A JSON POST to the user's webhook, signed with HMAC-SHA256 over the exact body bytes::

      X-Gpulab-Event: preemption-warning | preemption-cancelled | preempted
      X-Gpulab-Delivery: <record id>
      X-Gpulab-Signature: sha256=<hex hmac of the body with the user's webhook secret>

- The user's checkpoint command, run by the spawner with the server's environment in the user's
  home (:meth:`GpuSpawnerMixin.gpulab_run_checkpoint`), its output kept in
  ``~/.gpulab/checkpoints/<UTC time>.log``. Its record says ``state``: ``running`` from the
  moment it starts (recorded at once, so the user sees it during the warning), then ``done``
  (exit 0) or ``failed`` (another exit code, an error, a timeout), with ``started_at`` and
  ``ended_at`` on the market's own clock.

At the deadline the market sends the stop (``stop_sent_at``) and records ``compensation``: due
only when the platform broke its promise, i.e. stopped the server while the checkpoint still ran
before ``min(checkpoint_timeout, warning period)`` had passed since the warning
(:func:`compensation_decision`), or when the hub restarted while the checkpoint ran within
that time (the record's checkpoint gets ``lost_at`` on load). A checkpoint that failed or timed out on its own is the user's
doing (their command, files, processes) and is not compensated; the record says why either way.

Every version of a record is appended to ``DATA_DIR/spot/preemptions.jsonl``; the latest wins on
load, so warnings and their deadlines survive a hub crash.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

# Re-exported: the rule for who gets SIGUSR1, and the checkpoint record's state, are the agent's.
from gpulab.spawners.inside.agent import catches as catches
from gpulab.spawners.inside.agent import checkpoint_state as checkpoint_state
from gpulab.spawners.market import outbound
from gpulab.spawners.market.store import PREEMPTIONS_FILE, append_jsonl, read_jsonl
from gpulab.spawners.node.counters import CHECKPOINTS, PREEMPTIONS

if TYPE_CHECKING:
    from gpulab.spawners.market.core import Order
    from gpulab.spawners.market.hub import SpotMarket
    from gpulab.spawners.node.allocator import Allocation

# The stop at a deadline releases the cards a moment later; how long to wait for that (0.1 s
# steps) before the market looks at the books again.
RELEASE_WAIT_STEPS = 600
# Seconds of slack before a checkpoint counts as cut short (the stop is sent a moment late).
CUT_SHORT_GRACE = 1.0


class Preemption(BaseModel):
    """One preemption, from the warning to its end (stopped, or cancelled)."""

    id: str
    owner: str  # "user/server"
    user: str
    server: str
    gpu_type: str
    reason: str
    status: str  # "warning" | "cancelled" | "stopped"
    price: str  # spot price when the warning went out
    max_price: str | None
    warned_at: float
    deadline: float
    signalled_pids: list[int] = []
    skipped_pids: list[int] = []  # server processes that do not catch SIGUSR1
    webhook: dict[str, Any] | None = None  # url, status code or error
    checkpoint: dict[str, Any] | None = None  # command, exit code, log path
    cancelled_at: float | None = None
    stopped_at: float | None = None
    stop_sent_at: float | None = None  # when the market asked the hub to stop it (its clock)
    # Whether the reclaim is compensated and why (see :func:`compensation_decision`).
    compensation: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        out = self.model_dump()
        out["seconds_left"] = (
            max(0.0, round(self.deadline - time.time(), 1)) if self.status == "warning" else None
        )
        return out


log = logging.getLogger("gpulab.spot")


# ---- webhook ---------------------------------------------------------------------------------


def sign(body: bytes, secret: str) -> str:
    """The ``X-Gpulab-Signature`` of ``body``: HMAC-SHA256 with the user's webhook secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def send_webhook(
    url: str,
    secret: str,
    event: str,
    delivery: str,
    payload: dict[str, Any],
    allowed: list[outbound.Network],
    limit: float = 5,
) -> dict[str, Any]:
    """POST the signed event (see :mod:`.outbound` for what may be called and how); never
    raises. The result the user sees says only whether it was delivered."""
    body = json.dumps({"event": event, **payload}, sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpulab-spot-market",
        "X-Gpulab-Event": event,
        "X-Gpulab-Delivery": delivery,
        "X-Gpulab-Signature": sign(body, secret),
    }
    outcome = await outbound.post(url, body, headers, allowed=allowed, timeout=limit)
    log.info("Webhook %s %s to %s: %s", event, delivery, url, outcome.detail)
    return {"url": url, "event": event, "sent_at": time.time(), **outcome.public()}


# ---- the records and the warning period --------------------------------------------------------


class Preemptions:
    """The market's preemption records, and each warning carried out until its end.

    Owned by :class:`SpotMarket`, which decides who is preempted or spared (its books); this
    class warns the server, stops it at the deadline and keeps the records.
    """

    def __init__(self, market: SpotMarket) -> None:
        self.market = market
        self.log = market.log
        self.path = market.dir / PREEMPTIONS_FILE
        self.records: dict[str, Preemption] = {}
        self.active: dict[str, str] = {}  # owner -> id of its preemption in its warning period
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Preemption id -> set once its warning webhook went out (or there was none to send).
        self._warnings: dict[str, asyncio.Event] = {}
        for rec in read_jsonl(self.path):
            p = Preemption(**rec)
            self.records[p.id] = p
        now = time.time()
        for p in list(self.records.values()):
            if p.status == "warning":
                self.active[p.owner] = p.id
                ck = p.checkpoint or {}
                if ck.get("state") == "running" and "lost_at" not in ck:
                    # The hub restarted while the checkpoint ran: it lost the command and its
                    # outcome (the platform's doing; see :func:`compensation_decision`).
                    self._save(
                        p.model_copy(update={"checkpoint": {**p.checkpoint, "lost_at": now}})
                    )

    def _save(self, p: Preemption) -> None:
        self.records[p.id] = p
        append_jsonl(self.path, p.model_dump())

    def reason(self, owner: str) -> str | None:
        """Why ``owner`` is being preempted, while its warning runs."""
        pid = self.active.get(owner)
        return self.records[pid].reason if pid is not None else None

    def of_owner(self, owner: str) -> list[Preemption]:
        """``owner``'s preemptions, oldest first."""
        return sorted(
            (p for p in self.records.values() if p.owner == owner), key=lambda p: p.warned_at
        )

    def public(self, user: str | None = None) -> list[dict[str, Any]]:
        """All records (or ``user``'s), oldest first, as the API shows them."""
        return [
            p.public()
            for p in sorted(self.records.values(), key=lambda p: p.warned_at)
            if user is None or p.user == user
        ]

    def resume(self) -> None:
        """After a restart: the deadlines of warnings still running count down again."""
        for p in list(self.records.values()):
            if p.status == "warning":
                self._schedule_deadline(p)

    # ---- the warning ---------------------------------------------------------------------------

    def warn(self, alloc: Allocation, order: Order, reason: str, price: Decimal) -> Preemption:
        """Start the warning period of ``alloc``'s server (needs a running event loop)."""
        now = time.time()
        name, _, server = alloc.owner.partition("/")
        p = Preemption(
            id="p-" + uuid.uuid4().hex[:12],
            owner=alloc.owner,
            user=name,
            server=server,
            gpu_type=alloc.gpu_type,
            reason=reason,
            status="warning",
            price=str(price),
            max_price=None if order.max_price is None else str(order.max_price),
            warned_at=now,
            deadline=now + self.market.warning_seconds,
        )
        self.active[alloc.owner] = p.id
        self._save(p)
        PREEMPTIONS.inc(p.gpu_type, reason)
        self.log.warning(
            "Preempting %s (%s): stops at %s unless cancelled",
            alloc.owner,
            reason,
            time.strftime("%H:%M:%S", time.localtime(p.deadline)),
        )
        self._schedule_deadline(p)
        self._warnings[p.id] = asyncio.Event()
        asyncio.get_running_loop().create_task(self._warn(p))
        return p

    async def _warn(self, p: Preemption) -> None:
        """Signal, run the checkpoint command and send the webhook, concurrently."""
        checkpoint = None
        try:
            signalled, skipped = await self._signal(p)
            p = p.model_copy(update={"signalled_pids": signalled, "skipped_pids": skipped})
            self._update(p)
            settings = self.market.settings.get(p.user)
            if settings.get("checkpoint_command"):
                checkpoint = asyncio.get_running_loop().create_task(
                    self._checkpoint(p, settings["checkpoint_command"])
                )
            else:
                CHECKPOINTS.inc("skipped")
            if settings.get("webhook_url"):
                await self._webhook(p, "preemption-warning", settings)
        finally:
            # A cancellation webhook waits for this one, never for the checkpoint.
            sent = self._warnings.pop(p.id, None)
            if sent is not None:
                sent.set()
        if checkpoint is not None:
            await checkpoint

    async def _signal(self, p: Preemption) -> tuple[list[int], list[int]]:
        """SIGUSR1 to the server's opted-in processes: (signalled, skipped) pids, as the server
        sees them. A failure must not hold back the webhook or the checkpoint."""
        spawner = self.market.spawner(p.owner)
        if spawner is None:
            self.log.warning("Not signalling %s: its spawner is not known", p.owner)
            return [], []
        try:
            return await spawner.gpulab_signal_processes()
        except Exception:
            self.log.exception("Signalling the processes of %s failed", p.owner)
            return [], []

    def _update(self, p: Preemption) -> None:
        """Save a changed record unless a newer state (cancelled, stopped) was saved meanwhile."""
        latest = self.records.get(p.id)
        if latest is not None and latest.status != p.status:
            p = p.model_copy(
                update={
                    "status": latest.status,
                    "cancelled_at": latest.cancelled_at,
                    "stopped_at": latest.stopped_at,
                }
            )
        self._save(p)

    async def _webhook(self, p: Preemption, event: str, settings: dict[str, Any]) -> None:
        payload = {
            "server": p.owner,
            "user": p.user,
            "server_name": p.server,
            "gpu_type": p.gpu_type,
            "reason": p.reason,
            "price": p.price,
            "max_price": p.max_price,
            "warned_at": p.warned_at,
            "deadline": p.deadline,
            "status": "cancelled" if event == "preemption-cancelled" else "warning",
        }
        result = await send_webhook(
            settings["webhook_url"],
            settings["webhook_secret"],
            event,
            p.id,
            payload,
            self.market.webhook_networks,
        )
        latest = self.records[p.id]
        if event == "preemption-warning":
            self._save(latest.model_copy(update={"webhook": result}))

    def _checkpoint_progress(self, pid: str, result: dict[str, Any]) -> None:
        """Record the checkpoint's state as it goes (running, then its result) on the latest
        version of the record, so a stop or cancellation saved meanwhile is kept."""
        latest = self.records[pid]
        state = result.get("state") or checkpoint_state(result)
        # The market's own clock, never a time the server reports: the compensation rule
        # compares these with the stop it sent.
        before = latest.checkpoint or {}
        now = time.time()
        result = {
            **result,
            "state": state,
            "started_at": before.get("started_at") or now,
            "ended_at": before.get("ended_at") or (None if state == "running" else now),
        }
        if latest.checkpoint != result:  # the result may come twice (on_result, then returned)
            self._save(latest.model_copy(update={"checkpoint": result}))

    async def _checkpoint(self, p: Preemption, command: str) -> None:
        spawner = self.market.spawner(p.owner)
        try:
            if spawner is None:
                result = {"command": command, "error": "server not found"}
            else:
                # Where the server lives (a local process, a container), with its environment
                # plus these; "running" is recorded as soon as the command runs.
                result = await spawner.gpulab_run_checkpoint(
                    command,
                    self.market.checkpoint_timeout,
                    env={
                        "GPULAB_PREEMPTION_DEADLINE": str(p.deadline),
                        "GPULAB_PREEMPTION_REASON": p.reason,
                    },
                    on_start=lambda r: self._checkpoint_progress(p.id, r),
                    on_result=lambda r: self._checkpoint_progress(p.id, r),
                )
        except Exception as e:
            self.log.exception("Checkpoint command of %s failed", p.owner)
            result = {"command": command, "error": f"{type(e).__name__}: {e}"}
        self._checkpoint_progress(p.id, result)
        state = checkpoint_state(result)
        timed_out = "timed out" in str(result.get("error") or "")
        CHECKPOINTS.inc("saved" if state == "done" else "timeout" if timed_out else "failed")

    # ---- the end: deadline, stop, cancellation ---------------------------------------------------

    def _schedule_deadline(self, p: Preemption) -> None:
        delay = max(0.0, p.deadline - time.time())
        loop = asyncio.get_running_loop()
        self._timers[p.id] = loop.call_later(delay, lambda: loop.create_task(self._deadline(p.id)))

    def _cancel_timer(self, pid: str) -> None:
        timer = self._timers.pop(pid, None)
        if timer is not None:
            timer.cancel()

    async def _deadline(self, pid: str) -> None:
        self._timers.pop(pid, None)
        p = self.records.get(pid)
        if p is None or p.status != "warning":
            return
        self.log.warning("Preemption deadline of %s: stopping it", p.owner)
        p = p.model_copy(update={"stop_sent_at": time.time()})
        self._save(p)
        code, body = await self.market.hub_client.stop_server(p.owner)
        if code not in (202, 204, 400, 404):
            self.log.error("Stopping preempted %s failed: %s %s", p.owner, code, body)
        # The stop releases the cards; the record is closed when the allocation is gone.
        allocator = self.market.pool.allocator
        for _ in range(RELEASE_WAIT_STEPS):
            if allocator.get(p.owner) is None:
                break
            await asyncio.sleep(0.1)
        self.market.preempted(p)
        await self._compensate(self.records.get(pid, p))

    async def _compensate(self, p: Preemption) -> None:
        """Record whether the reclaim is compensated and why; post the credit when it is (once
        per preemption, billing keys it by the preemption's id)."""
        due, why = compensation_decision(
            p, self.market.checkpoint_timeout, p.stop_sent_at or time.time()
        )
        latest = self.records.get(p.id, p)
        self._save(latest.model_copy(update={"compensation": {"due": due, "reason": why}}))
        self.log.info("Preemption %s of %s: %s", p.id, p.owner, why)
        if not due or self.market.compensation_hook is None:
            return
        try:
            await self.market.compensation_hook(
                user=p.user,
                server=p.server,
                at=p.deadline,
                reason="spot-preemption",
                checkpoint="cut-short",
                key=f"preemption-{p.id}",
            )
        except Exception:
            self.log.exception("Could not compensate %s for preemption %s", p.owner, p.id)

    def server_gone(self, owner: str) -> None:
        """``owner``'s server stopped: close its warning as stopped, if one runs."""
        pid = self.active.pop(owner, None)
        if pid is None:
            return
        p = self.records[pid]
        if p.status == "warning":
            self._save(p.model_copy(update={"status": "stopped", "stopped_at": time.time()}))
            self._cancel_timer(pid)

    def cancel(self, owner: str, price: Decimal) -> None:
        """The price fell back under ``owner``'s bid: end its warning; the server keeps running."""
        pid = self.active.pop(owner, None)
        if pid is None:
            return
        self._cancel_timer(pid)
        p = self.records[pid].model_copy(
            update={"status": "cancelled", "cancelled_at": time.time()}
        )
        self._save(p)
        self.log.info("Preemption of %s cancelled (spot price now %s)", owner, price)
        settings = self.market.settings.get(p.user)
        if settings.get("webhook_url"):
            asyncio.get_running_loop().create_task(self._cancelled_webhook(p, settings))

    async def _cancelled_webhook(self, p: Preemption, settings: dict[str, Any]) -> None:
        # The receiver must never see "cancelled" before the warning it cancels.
        sent = self._warnings.get(p.id)
        if sent is not None:
            await sent.wait()
        await self._webhook(p, "preemption-cancelled", settings)


# ---- compensation ------------------------------------------------------------------------------


def compensation_decision(
    p: Preemption, checkpoint_timeout: float, stop_sent_at: float
) -> tuple[bool, str]:
    """Whether a reclaimed server's user is owed a compensation, and the reason they are shown.

    The platform promises the checkpoint command ``checkpoint_timeout`` seconds from the
    warning, within the warning period it announced (``GPULAB_PREEMPTION_DEADLINE``). Only a broken
    promise is compensated: the server was stopped while the checkpoint still ran, before it had
    that time (a late start, a stop before the deadline). What the command itself does (its exit
    code, running past its limit, no command at all) is the user's and is never compensated:
    a user can make their own checkpoint fail at will. Decided from the market's own clock
    only (``warned_at``, ``deadline``, the checkpoint's ``ended_at`` as the market recorded it,
    the time it sent the stop), never from what the server reports.
    """
    checkpoint = p.checkpoint
    if not checkpoint:
        return False, "no compensation: no checkpoint command was set"
    state = checkpoint.get("state")
    if state == "done":
        return False, "no compensation: your checkpoint command saved the work (exit 0)"
    ended = checkpoint.get("ended_at")
    promised = min(checkpoint_timeout, p.deadline - p.warned_at)
    if ended is not None and float(ended) < stop_sent_at:
        # It ended on its own before the platform stopped anything: the user's outcome.
        error = str(checkpoint.get("error") or "")
        if "timed out" in error:
            what = f"ran past its {checkpoint_timeout:g} s limit"
        elif error:
            what = f"failed ({error})"
        else:
            what = f"exited {checkpoint.get('exit_code')}"
        return False, f"no compensation: your checkpoint command {what}"
    # Counted from the warning, not from the command's start: how long the start took may
    # depend on the user's processes (signalling them), the warning time is the platform's.
    given = stop_sent_at - p.warned_at
    lost = checkpoint.get("lost_at")
    if state == "running" and lost is not None and float(lost) - p.warned_at < promised:
        return True, (
            f"compensated: the hub restarted {max(0.0, float(lost) - p.warned_at):.0f} s after "
            f"the warning while your checkpoint ran; it was promised {promised:.0f} s"
        )
    if given + CUT_SHORT_GRACE < promised:
        return True, (
            f"compensated: the server was stopped {max(0.0, given):.0f} s after the warning, "
            f"while your checkpoint ran; it was promised {promised:.0f} s"
        )
    return False, (
        f"no compensation: your checkpoint command still ran after the {promised:.0f} s "
        "it was promised"
    )
