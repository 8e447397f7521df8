"""Compensation: a credit for work lost because the platform broke its promise at a reclaim.

When the platform takes a server away (spot preemption, the zero-balance move to no-GPU, a node
failure) it promises the user's checkpoint command its time (the warning period, the checkpoint
timeout). Only when the platform did not keep that promise (the server was stopped while the
checkpoint still ran, before its time: a node failure, a forced early stop) is the lost work the
platform's doing. A checkpoint command that fails or runs past its limit on its own is the
user's (their command, files, processes: a user can make it fail at will) and is never
compensated; the hub decides this from its own timestamps
(``gpulab.spawners.market.preemption.compensation_decision``) and records the reason in the
preemption record either way. When it is owed, the hub posts a compensation for that server
session (``POST api/v1/users/NAME/compensations``, admins and the hub's services only; the
``checkpoint`` field says how the promise was broken: ``cut-short`` or ``not-run``); billing credits the amount
its rule gives (``BillingService.compensation_rule``), once per idempotency key.

The credit goes back to whoever paid for the compensated time, in proportion: for a course
session, the course pool's share of what the session was charged (``course_charges``) is credited
to the pool's ledger (kind ``compensation``), and only the student's own share to the student's
balance (a ``compensation`` ledger entry tied to the session, possibly 0, which also holds the
idempotency key). A personal session credits its user in full.

Rules (one string, so that an operator sets one traitlet):

- ``last-minutes:N``: what the session was charged for its last N minutes of billed time (before
  its stop, or before the reclaim time the hub gives while the stop is not in yet), at the prices
  it was rated at (spot capped at the bid); nothing billed then, nothing credited;
- ``fixed:AMOUNT``: a fixed amount in the catalog currency, e.g. ``fixed:1.00``.

A failed launch (reason ``launch-failed``: the hub stopped a server whose app could not become
ready) is credited the session's whole charge whatever the rule, so that it costs nothing,
unless notebooks ran on its server meanwhile (then nothing: the server was used).

The amount is computed when the compensation is posted and never re-computed: a replay of the
same key answers the entry already made.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from sqlalchemy import Connection, select

from gpulab.billing_service import courses, ledger, reservations
from gpulab.billing_service.metering import session_intervals
from gpulab.billing_service.models import MICRO, KernelSpan, ServerSession
from gpulab.billing_service.rating import (
    PriceBook,
    bid_of,
    format_money,
    merge,
    rated_pricing,
    to_micro,
)
from gpulab.billing_service.schemas import APP_PREFIX, OBSERVED_PREFIX

KIND = "compensation"
# A launch the hub ended because its app could not become ready (no model, the app died, it
# never answered in time): the platform promised an app it could not give, so the whole
# session's charge is credited back, whatever the operator's rule (``WHOLE_SESSION``).
LAUNCH_FAILED = "launch-failed"
REASONS = ("spot-preemption", "zero-balance", "node-failure", LAUNCH_FAILED)
# How the platform broke its promise to the checkpoint: stopped the server while it ran before its
# time, or never ran it (e.g. the node failed). A checkpoint that failed or timed out on its own
# is the user's and has no outcome here.
CHECKPOINT_OUTCOMES = ("cut-short", "not-run")


@dataclass(frozen=True)
class Rule:
    """A parsed ``BillingService.compensation_rule``."""

    minutes: float | None = None
    fixed_micro: int | None = None
    whole: bool = False  # the session's whole charge (a failed launch)

    @classmethod
    def parse(cls, text: str) -> Rule:
        kind, _, value = text.partition(":")
        try:
            if kind == "last-minutes":
                minutes = float(value)
                if not 0 < minutes <= 24 * 60:
                    raise ValueError
                return cls(minutes=minutes)
            if kind == "fixed":
                micro = to_micro(Decimal(value))
                if micro <= 0:
                    raise ValueError
                return cls(fixed_micro=micro)
        except (ValueError, InvalidOperation):
            pass
        raise ValueError(
            f"compensation_rule: {text!r}; expected 'last-minutes:N' (0 < N <= 1440) or "
            "'fixed:AMOUNT' (a positive amount with at most 6 decimals, e.g. 'fixed:1.00')"
        )

    def describe(self, currency: str) -> str:
        if self.whole:
            return "the session's whole charge"
        if self.minutes is not None:
            return f"the charge of the session's last {self.minutes:g} minutes"
        return f"a fixed {currency} {format_money(self.fixed_micro or 0)}"

    def amount(self, conn: Connection, prices: PriceBook, sess, until_us: int) -> int:
        """The credit for ``sess`` under this rule; ``until_us`` ends the window of an open
        session (the reclaim time, else now)."""
        if self.fixed_micro is not None:
            return self.fixed_micro
        end = sess.stopped_us if sess.stopped_us is not None else until_us
        start = sess.started_us if self.whole else end - round((self.minutes or 0) * 60 * MICRO)
        window = [
            (max(a, start), min(b, end))
            for a, b in merge(session_intervals(conn, sess))
            if min(b, end) > max(a, start)
        ]
        return prices.cost_micro(
            sess.gpu_type,
            sess.gpus,
            rated_pricing(sess.pricing, sess.options),
            window,
            bid_of(sess.options),
            # Prepaid seconds (a paid reservation) cost nothing, so they credit nothing.
            reservations.prepaid_window(conn, sess),
        )


WHOLE_SESSION = Rule(whole=True)


def find_session(conn: Connection, user: str, server: str, at_us: int | None):
    """The session of ``user``'s ``server`` in force at ``at_us`` (the latest one started at or
    before it), or the server's latest session when no time is given; None if there is none."""
    q = select(ServerSession).where(ServerSession.user == user, ServerSession.server == server)
    if at_us is not None:
        q = q.where(ServerSession.started_us <= at_us)
    return conn.execute(
        q.order_by(ServerSession.started_us.desc(), ServerSession.id.desc()).limit(1)
    ).first()


def compensate(
    conn: Connection,
    prices: PriceBook,
    rule: Rule,
    sess,
    *,
    reason: str,
    checkpoint: str,
    key: str,
    note: str,
    actor: str,
    now_us: int,
    until_us: int,
) -> tuple[ledger.Entry, bool]:
    """Credit whoever paid for ``sess`` once per ``key`` (see :func:`split`): (the owner's
    ledger entry, whether it was made now).

    Raises ``ledger.IdempotencyConflict`` when the key was used for another session or kind."""
    stored_key = f"{KIND}:{key}"
    row = ledger.entry(conn, "user", stored_key)
    if row is None:
        if reason == LAUNCH_FAILED:
            rule = WHOLE_SESSION
        amount = rule.amount(conn, prices, sess, until_us)
        if reason == LAUNCH_FAILED and notebooks_ran(conn, sess.id):
            # The user's own server says when its app is ready: a launch they stall on purpose
            # while running notebooks would be free GPU time (attack wave F1). A failed launch
            # whose server ran kernels was used: nothing is credited.
            amount = 0
            note = (note + "; " if note else "") + "not credited: notebooks ran on the server"
        pool_part, own_part = split(conn, sess, amount)
        what = "launch failed" if reason == LAUNCH_FAILED else f"{reason}, checkpoint {checkpoint}"
        text = (
            f"{what}: {rule.describe(prices.catalog.currency)} "
            f"(session {sess.id}, server {sess.server or 'default'})"
        )
        if pool_part:
            text += (
                f"; {format_money(pool_part)} of {format_money(amount)} credited to course "
                f"{sess.course}'s pool, which paid that share"
            )
        if note:
            text += f"; {note}"
        entry_id = ledger.post(
            conn,
            ledger.user(sess.user),
            KIND,
            own_part,
            now_us,
            session_id=sess.id,
            key=stored_key,
            note=text,
            actor=actor,
        )
        row = ledger.entry(conn, "user", stored_key)
        assert row is not None
        if entry_id is not None:
            if pool_part:
                # Same transaction, same key (the pool's own book): made exactly when the
                # owner's is.
                ledger.post(
                    conn,
                    ledger.pool(sess.course),
                    KIND,
                    pool_part,
                    now_us,
                    session_id=sess.id,
                    user=sess.user,
                    key=stored_key,
                    note=text,
                    actor=actor,
                )
            return row, True
    if (row.kind, row.account, row.session_id) != (KIND, ledger.user(sess.user), sess.id):
        raise ledger.IdempotencyConflict(
            f"idempotency_key {key!r} was already used for a {row.kind} of {row.user}'s "
            f"session {row.session_id}"
        )
    return row, False


def notebooks_ran(conn: Connection, session_id: int) -> bool:
    """Whether any kernel (not the app's own span, nor the hub's observation) was seen in the
    session: its server was used beyond the app that failed to start."""
    ids = conn.execute(
        select(KernelSpan.kernel_id).where(KernelSpan.session_id == session_id)
    ).scalars()
    return any(not k.startswith((APP_PREFIX, OBSERVED_PREFIX)) for k in ids)


def split(conn: Connection, sess, amount: int) -> tuple[int, int]:
    """``amount`` split as the session's charge was paid: (course pool's part, owner's part).

    A course session's charge is split in ``course_charges`` (pool, student); the compensation
    goes back in the same proportion, the pool's part rounded down. Anything else: all the
    owner's."""
    if not getattr(sess, "course", None) or amount <= 0:
        return 0, amount
    pool_paid, own_paid = courses.paid_by(conn, [sess.id]).get(sess.id, (0, 0))
    total = pool_paid + own_paid
    if pool_paid <= 0 or total <= 0:
        return 0, amount
    pool_part = amount * pool_paid // total
    return pool_part, amount - pool_part
