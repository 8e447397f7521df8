"""The enforcer's side of billing's metrics: every action it takes is counted by what it did
(``no_gpu``, ``stop``, ``close``, ``failed``), and each completed check stamps
``gpulab_billing_enforcer_last_run_timestamp_seconds`` (the alert "enforcer not running"
watches it), on the real ``Enforcer`` over a real store with the hub's side stubbed.

Issue 24: "enforcer actions" among billing's metrics; alerts when "the enforcer [is] not
running"."""

from __future__ import annotations

import asyncio
import time

from billing.courses import enforcer_app, feed
from billing.fixtures import billing_sqlite_engine  # noqa: F401 (fixture)
from billing.scenario import eid, heartbeat, kernel, server_start

from gpulab.billing_service import ledger
from gpulab.billing_service.enforce import Enforcer
from gpulab.billing_service.metrics import BillingMetrics
from gpulab.billing_service.models import MICRO


class Hub:
    """The hub as the enforcer sees it: which servers it runs, and its answers to a stop."""

    def __init__(self, runs: bool, stop_code: int = 204, fail: bool = False) -> None:
        self._runs, self.stop_code, self.fail = runs, stop_code, fail
        self.stopped: list[tuple[str, str]] = []

    async def runs(self, user: str, server: str) -> bool:
        if self.fail:
            raise RuntimeError("the hub is unreachable")
        return self._runs

    async def stop_server(self, user: str, server: str) -> int:
        self.stopped.append((user, server))
        return self.stop_code


def broke_user_with_a_running_server(engine) -> str:
    """A no-GPU server with a live kernel whose owner's balance is used up: the enforcer stops
    it at its next check."""
    user = f"u{eid()[:8]}"
    now = time.time()
    k = eid()
    feed(
        engine,
        [
            server_start(user, now - 60, "none"),
            kernel("kernel_start", user, k, now - 50),
            heartbeat(user, now - 1, [k]),
        ],
    )
    with engine.begin() as conn:
        balance = ledger.balance(conn, user)
        ledger.credit(conn, user, "adjustment", -balance - MICRO, eid(), time.time_ns() // 1000)
    return user


async def enforce_once(engine, hub: Hub) -> BillingMetrics:
    app = enforcer_app(engine)
    closed = []

    async def close_session(sess) -> None:
        closed.append(sess.id)

    async def no_figures(thresholds, settled):
        raise AssertionError("the enforcer reads no database figures for the metrics")

    app.metrics = BillingMetrics(no_figures, [])
    app.hub = hub
    app.close_session = close_session
    app.run_db = lambda fn, *args: asyncio.get_running_loop().run_in_executor(None, fn, *args)
    enforcer = Enforcer(app)
    t0 = time.time()
    assert app.metrics.enforcer_last_run._value.get() == 0
    await enforcer.check()
    assert t0 <= app.metrics.enforcer_last_run._value.get() <= time.time()
    # The action runs in its own task (which then waits before the server is considered again).
    for _ in range(200):
        if sum(_count(app.metrics, a) for a in ("no_gpu", "stop", "close", "failed")):
            break
        await asyncio.sleep(0.01)
    for task in list(enforcer.tasks):
        task.cancel()
    return app.metrics


def _count(metrics: BillingMetrics, action: str) -> float:
    return metrics.enforcer_actions.labels(action)._value.get()


def test_each_enforcer_action_is_counted_by_what_it_did(sqlite_engine) -> None:
    """A server stopped for its balance counts ``stop``; one the hub no longer runs, closed,
    counts ``close``; a stop the hub refuses, or a hub that cannot be asked, ``failed``."""
    cases = [
        (Hub(runs=True), "stop"),
        (Hub(runs=False), "close"),
        (Hub(runs=True, stop_code=500), "failed"),
        (Hub(runs=True, fail=True), "failed"),
    ]
    for hub, action in cases:
        user = broke_user_with_a_running_server(sqlite_engine)
        metrics = asyncio.run(enforce_once(sqlite_engine, hub))
        counts = {a: _count(metrics, a) for a in ("no_gpu", "stop", "close", "failed")}
        assert counts == {**dict.fromkeys(counts, 0), action: 1}, (action, counts)
        if action == "stop":
            assert (user, "") in hub.stopped
        # End this user's session, so the next case acts on its own user only.
        with sqlite_engine.begin() as conn:
            ledger.credit(conn, user, "topup", 100 * MICRO, eid(), time.time_ns() // 1000)
