"""What a server's own reporter may say: bounds on the events billing accepts from it.

Everything inside a user's server (kernels, terminals, the reporter and its token) is the user's
to change, so a reporter's event is a claim, not a fact. The hub's ``server_start`` is the trusted
anchor: it says when the server's current session began. A reporter event is accepted only when

- its ``t`` lies within that server's *current* session: from the session's start minus the
  clock-skew allowance to now (or the session's stop, once reported) plus the allowance;
- it moves no kernel or app backwards: ``t`` is not before the latest time already accepted for
  each kernel/app it names (so a span only grows forward, and a late "stop" dated in 1970 cannot
  move a span out of its session and refund it);
- every kernel/app it names either is new or belongs to the current session (a span once
  assigned to a session stays there);
- it does not introduce more new kernel/app ids than the caps allow (per heartbeat, per batch),
  which keeps one token from filling the span table.

Events that break a bound are rejected one by one (each with the field and the allowed range);
the rest of the batch is accepted. A new kernel reported within the allowance *before* the
session's start counts from the start (``floors``), so it can never land in an earlier session.
Duplicates (ids already stored) are answered before any of this and never re-checked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, select

from gpulab.billing_service.models import MICRO, KernelSpan, ServerSession
from gpulab.billing_service.schemas import APP_PREFIX, AppEvent, Heartbeat, KernelEvent


@dataclass(frozen=True)
class Limits:
    """The bounds applied to a reporter's batch (``BillingService`` traitlets)."""

    skew_us: int
    max_new_per_batch: int
    max_new_per_heartbeat: int


@dataclass(frozen=True)
class Rejection:
    """One event refused, with the field at fault and why (the allowed range where there is one)."""

    index: int
    id: str
    field: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "field": self.field, "message": self.message}


@dataclass
class Checked:
    accepted: list = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    # event id -> the earliest time its spans may start (the session's start)
    floors: dict[str, int] = field(default_factory=dict)


def _iso(t_us: int) -> str:
    return datetime.fromtimestamp(t_us / MICRO, UTC).isoformat().replace("+00:00", "Z")


def _seconds(t_us: int) -> str:
    return f"{t_us / MICRO:.6f}"


def _units(ev, index: int) -> list[tuple[str, str, str]]:
    """(span key, field name, what) for every kernel/app an event names."""
    if isinstance(ev, KernelEvent):
        return [(ev.unit, f"events[{index}].kernel", f"kernel {ev.kernel!r}")]
    if isinstance(ev, AppEvent):
        return [(ev.unit, f"events[{index}].app", f"app {ev.app!r}")]
    if isinstance(ev, Heartbeat):
        out = [
            (k, f"events[{index}].kernels[{j}]", f"kernel {k!r}") for j, k in enumerate(ev.kernels)
        ]
        out += [
            (APP_PREFIX + a, f"events[{index}].apps[{j}]", f"app {a!r}")
            for j, a in enumerate(ev.apps)
        ]
        return out
    return []


def check(conn: Connection, events: list[tuple[int, Any]], limits: Limits, now_us: int) -> Checked:
    """Split a reporter's new (not yet stored) events, given with their batch index, into the
    accepted and the rejected, in batch order; read inside the transaction that stores them."""
    out = Checked()
    by_pair: dict[tuple[str, str], list[tuple[int, Any]]] = defaultdict(list)
    for index, ev in events:
        by_pair[(ev.user, ev.server)].append((index, ev))
    batch_new = 0
    verdicts: dict[int, Rejection | None] = {}
    for (user, server), items in sorted(by_pair.items()):
        sess = conn.execute(
            select(ServerSession.id, ServerSession.started_us, ServerSession.stopped_us)
            .where(ServerSession.user == user, ServerSession.server == server)
            .order_by(ServerSession.started_us.desc(), ServerSession.id.desc())
            .limit(1)
        ).first()
        label = f"{user}/{server}"
        if sess is None:
            for index, ev in items:
                verdicts[index] = Rejection(
                    index,
                    ev.id,
                    f"events[{index}].server",
                    f"no session of server {label} is known: the hub reports a server's start "
                    "before it runs, and only then are its reports accepted",
                )
            continue
        lo = sess.started_us - limits.skew_us
        end = now_us if sess.stopped_us is None else min(now_us, sess.stopped_us)
        hi = end + limits.skew_us
        keys = sorted({k for index, ev in items for k, _, _ in _units(ev, index)})
        # span key -> (session id, latest accepted time)
        known: dict[str, tuple[int | None, int]] = {}
        for i in range(0, len(keys), 500):
            for kernel_id, sid, last in conn.execute(
                select(KernelSpan.kernel_id, KernelSpan.session_id, KernelSpan.last_us).where(
                    KernelSpan.user == user,
                    KernelSpan.server == server,
                    KernelSpan.kernel_id.in_(keys[i : i + 500]),
                )
            ).all():
                known[kernel_id] = (sid, last)
        for index, ev in sorted(items, key=lambda p: p[0]):
            t = ev.t_us
            reason = None
            if not lo <= t <= hi:
                until = "now" if sess.stopped_us is None or now_us < sess.stopped_us else "its stop"
                reason = Rejection(
                    index,
                    ev.id,
                    f"events[{index}].t",
                    f"{ev.t} is outside the current session of server {label}: allowed "
                    f"{_seconds(lo)} to {_seconds(hi)} (its start {_iso(sess.started_us)} to "
                    f"{until}, each +/- {limits.skew_us / MICRO:g} s of clock skew)",
                )
            units = _units(ev, index)
            new = [k for k, _, _ in units if k not in known]
            for key, fname, what in units if reason is None else []:
                if key not in known:
                    continue
                sid, last = known[key]
                if sid != sess.id:
                    reason = Rejection(
                        index,
                        ev.id,
                        fname,
                        f"{what} belongs to another session of server {label}; a kernel or "
                        "app stays in the session it was first reported in",
                    )
                    break
                if t < last:
                    reason = Rejection(
                        index,
                        ev.id,
                        f"events[{index}].t",
                        f"{ev.t} is before {_seconds(last)}, already accepted for {what}: "
                        f"allowed {_seconds(last)} to {_seconds(hi)} (a kernel's or app's "
                        "reports only move forward)",
                    )
                    break
            if reason is None and isinstance(ev, Heartbeat):
                if len(set(new)) > limits.max_new_per_heartbeat:
                    reason = Rejection(
                        index,
                        ev.id,
                        f"events[{index}].kernels",
                        f"names {len(set(new))} kernels/apps not reported before; at most "
                        f"{limits.max_new_per_heartbeat} new ones per heartbeat "
                        "(BillingService.max_new_ids_per_heartbeat)",
                    )
            if reason is None and new and batch_new + len(set(new)) > limits.max_new_per_batch:
                reason = Rejection(
                    index,
                    ev.id,
                    units[0][1] if len(units) == 1 else f"events[{index}].kernels",
                    f"this batch already reported {batch_new} new kernels/apps; at most "
                    f"{limits.max_new_per_batch} new ones per batch "
                    "(BillingService.max_new_ids_per_batch)",
                )
            verdicts[index] = reason
            if reason is not None:
                continue
            batch_new += len(set(new))
            floor = max(t, sess.started_us)
            for key, _, _ in units:
                _, last = known.get(key, (sess.id, floor))
                known[key] = (sess.id, max(last, floor))
            out.floors[ev.id] = sess.started_us
    for index, ev in events:
        verdict = verdicts[index]
        if verdict is None:
            out.accepted.append(ev)
        else:
            out.rejected.append(verdict)
    return out
