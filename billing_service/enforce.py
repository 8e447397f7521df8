"""The enforcement loop: servers that cannot be paid, and idle servers, give their GPUs back.

Money is enforced from what billing holds, never from the freshness of a server's own reports:
every open session (the hub posted its start and no stop) charged within ``busy_window`` is
checked every ``enforce_interval``, whether or not its reporter still sends heartbeats, because
a user controls their reporter (they can stop it, or post heartbeats backdated past any
freshness window with the server's own token) but not the hub's observed ``activity`` spans,
which charge the balance on their own and mark the session busy as they do (at least every
``report_interval`` of the hub's observer while it sees the server work). A session charged by
nothing within the window costs nothing meanwhile.

- A GPU server whose owner's balance cannot pay ``switch_margin`` more seconds of it is moved to
  no-GPU mode (``zero_balance_action = 'no-gpu'``), or stopped (``'stop'``, or when even no-GPU
  cannot be paid for ``start_minutes``). A no-GPU server is stopped when the balance reaches zero.
- A server with no live kernel and no observed activity for ``idle_timeout`` is stopped.
- A server the hub runs but that sends no heartbeat for ``silent_timeout`` (its reporter was
  killed or is missing) is stopped: unmetered time is not given away. A training job's server
  (``job-*``) runs no reporter and is exempt: the hub's observed spans meter it.
- A course session (``courses``) is paid by its course's pool up to the student's cap, then by
  the student: with ``overflow = "personal"`` the money it may still use is what the pool can
  pay for the student now (min(cap left, pool balance)) plus the student's balance, and the
  rules above apply to that sum; with ``overflow = "refuse"`` only the pool pays, so only what
  it can still pay counts: the server is stopped as soon as that cannot pay ``switch_margin``
  more seconds of it (cap used up, pool empty, or outside the term), whatever the student's own
  balance (zero included), so the pool never pays beyond the cap. A session the hub reports
  ``paid_by = "course"`` (started by course staff, not its owner) is checked that way whatever
  the course's ``overflow``: the student's own money never pays for it.
- A server inside the paid reservation it runs on (``reservations``) costs nothing then: no
  money check applies to it until the reservation ends (idle and silent servers are still
  stopped).
- Storage (``storage``) is charged to the same balance, whatever it is, and can take it below
  zero: that debt is like any other. The checks above then move or stop the user's servers, the
  hub refuses their starts and quota raises (402); nothing is deleted for debt (only the
  retention schedule releases homes), and lowering the quota, which stops the charge, is always
  allowed.

**The bound.** Charges reach a balance as the hub's observed spans (every ``report_interval``
of the hub's observer) and the reports arrive; the next check is at most 1.2 x
``enforce_interval`` away; then the hub stops or switches the server, and billing ends at the
last sample that saw it. So a GPU server's balance goes below zero by at most its price x
(1.2 x ``enforce_interval`` + the observer's ``report_interval`` + ``interval`` + the time the
stop or switch takes - ``switch_margin``), nothing with the defaults (10 s, 15 s, 2 s, 60 s)
unless the stop takes over 30 s; a no-GPU server's (checked at zero) by at most its price x
(1.2 x ``enforce_interval`` + ``report_interval`` + ``interval`` + the stop's time).

Each decision is taken from the database only; before acting the hub is asked (its REST API,
billing's only way to the hub) whether it still runs the server: a session it does not run is
closed instead, at its last sign of life.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from gpulab.billing_service import courses, reservations
from gpulab.billing_service.models import MICRO, Account, ServerSession
from gpulab.billing_service.rating import bid_of, paid_by_course, rated_pricing
from gpulab.billing_service.statements import session_options
from gpulab.catalog import NO_GPU

# Training jobs' servers (the hub's job-ID and job-ID-RANK): no reporter runs in them.
JOB_SERVERS = "job-%"

if TYPE_CHECKING:
    from gpulab.billing_service.app import BillingService

log = logging.getLogger("gpulab.billing")


def refuse_reason(st: courses.StudentStatus) -> str:
    if st.period is None:
        return "outside the term"
    if st.cap_left_micro <= st.pool_micro:
        return "the cap per student is used up"
    return "the course's credit pool is used up"


class Enforcer:
    def __init__(self, app: BillingService) -> None:
        self.app = app
        self.in_flight: set[tuple[str, str]] = set()
        self.tasks: set[asyncio.Task] = set()

    async def run(self) -> None:
        while True:
            # Jitter: many nodes never hit the hub at the same instant.
            await asyncio.sleep(self.app.enforce_interval * random.uniform(0.8, 1.2))
            try:
                await self.check()
            except Exception:
                log.exception("billing enforcement check failed")

    def decide(self) -> list[tuple[str, Any, str]]:
        """(action, session, reason) for each open server needing one: 'no-gpu', 'stop', or
        'silent' (no heartbeat: stop it if the hub still runs it, else close its session)."""
        app = self.app
        now = time.time_ns() // 1000
        # Charged lately, by anyone's account: the hub's observed spans mark it as they charge,
        # at least every report_interval while the hub sees it work (see ``busy_window``).
        recent = int(max(app.busy_window, 3 * app.heartbeat_interval) * MICRO)
        out = []
        with app.engine.connect() as conn:
            # Every open session, whatever its reports say: a user can silence their reporter
            # or backdate its heartbeats, not the hub's observed spans that charge the balance.
            rows = conn.execute(
                select(ServerSession, Account.balance_micro)
                .join(Account, Account.user == ServerSession.user)
                .where(ServerSession.stopped_us.is_(None))
            ).all()
            status = {
                (s.course, s.user): courses.student_status(conn, s.course, s.user, now)
                for s in rows
                if s.course is not None
            }
            tags = reservations.checks(conn, rows)
        for sess in rows:
            balance = sess.balance_micro
            busy = sess.last_busy_us is not None and sess.last_busy_us >= now - recent
            window = tags[sess.id].window if sess.id in tags else None
            # Inside its paid reservation the server costs nothing: no money check then.
            charged = busy and not (window is not None and window[0] <= now < window[1])
            st = status.get((sess.course, sess.user))
            if charged and st is not None:
                rate = app.prices.rate_micro_per_hour(
                    sess.gpu_type,
                    sess.gpus,
                    rated_pricing(sess.pricing, sess.options),
                    now,
                    bid_of(sess.options),
                )
                if st.settings.overflow == "refuse" or paid_by_course(sess.options):
                    if st.available_micro < rate * app.switch_margin / 3600:
                        out.append(("stop", sess, f"course {sess.course}: {refuse_reason(st)}"))
                        continue
                    # Only the pool pays a refusing course's session: the student's own
                    # balance (zero, say) is not what it runs on.
                    charged = False
                else:
                    # The pool's share for the student first, then their own balance.
                    balance += st.available_micro
            if charged:
                rate = app.prices.rate_micro_per_hour(
                    sess.gpu_type,
                    sess.gpus,
                    rated_pricing(sess.pricing, sess.options),
                    now,
                    bid_of(sess.options),
                )
                margin = rate * app.switch_margin / 3600
                if sess.gpu_type != NO_GPU and balance < margin:
                    no_gpu = app.prices.rate_micro_per_hour(NO_GPU, 0, "on-demand", now)
                    if (
                        app.zero_balance_action == "no-gpu"
                        and balance >= no_gpu * app.start_minutes / 60
                    ):
                        out.append(("no-gpu", sess, "balance too low for the GPU"))
                    else:
                        out.append(("stop", sess, "balance used up"))
                    continue
                if sess.gpu_type == NO_GPU and balance <= 0:
                    out.append(("stop", sess, "balance used up"))
                    continue
            if app.idle_timeout > 0:
                # Not before this process has been up that long: while billing was down (or
                # just restarted) nothing could mark the session busy, and the spools are
                # still being flushed.
                last = max(sess.last_busy_us or 0, sess.started_us, app.started_us)
                if now - last > app.idle_timeout * MICRO:
                    out.append(("stop", sess, f"no live kernel for {app.idle_timeout:.0f}s"))
        silent = int(app.silent_timeout * MICRO)
        # Only once this process has been up that long: while billing was down (or just
        # restarted) heartbeats could not arrive, and the spools are still being flushed.
        if silent and now - app.started_us > silent:
            with app.engine.connect() as conn:
                quiet = conn.execute(
                    select(ServerSession).where(
                        ServerSession.stopped_us.is_(None),
                        func.coalesce(ServerSession.last_heartbeat_us, ServerSession.started_us)
                        < now - silent,
                        # A training job's server (job-ID[-RANK]) runs the job runner, not a
                        # Jupyter server with a reporter: it never sends heartbeats, and is
                        # metered from the hub's observed spans alone (issue 26).
                        ServerSession.server.not_like(JOB_SERVERS),
                    )
                ).all()
            for sess in quiet:
                out.append(("silent", sess, f"no heartbeat for {app.silent_timeout:.0f}s"))
        return out

    async def check(self) -> None:
        decisions = await self.app.run_db(self.decide)
        # Decided: the check ran (billing's metrics; an alert fires when it stops running).
        self.app.metrics.enforcer_last_run.set(time.time())
        for action, sess, reason in decisions:
            key = (sess.user, sess.server)
            if key in self.in_flight:
                continue
            self.in_flight.add(key)
            task = asyncio.create_task(self._act(action, sess, reason, key))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _act(self, action: str, sess: Any, reason: str, key) -> None:
        hub = self.app.hub
        try:
            log.warning("%s server of %s/%s: %s", action, sess.user, sess.server, reason)
            if not await hub.runs(sess.user, sess.server):
                # The hub does not run it: gone without the hub's stop report reaching us. Close
                # the session at its last sign of life, as the hub would have.
                await self.app.close_session(sess)
                self.app.metrics.enforced("close")
            elif action == "no-gpu":
                await hub.move_to_no_gpu(sess.user, sess.server, session_options(sess))
                self.app.metrics.enforced("no_gpu")
            else:
                # 'stop', or 'silent': running without a reporter, no metering, no server.
                code = await hub.stop_server(sess.user, sess.server)
                self.app.metrics.enforced("stop" if code < 400 else "failed")
        except Exception:
            log.exception("could not %s %s/%s", action, sess.user, sess.server)
            self.app.metrics.enforced("failed")
        finally:
            # Give the hub's stop report time to arrive before the server is considered again.
            await asyncio.sleep(max(5.0, 3 * self.app.heartbeat_interval))
            self.in_flight.discard(key)
