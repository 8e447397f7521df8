"""The enforcer decides money from what billing holds, not from how fresh a server's reports are
(issue 20, "Debt without limit"): a server whose reporter went quiet, or posts heartbeats
backdated past the old freshness window, is still checked while the hub's observed spans charge
it; one charged by nothing lately costs nothing and is left alone."""

from __future__ import annotations

import time
import uuid

from billing.courses import enforcer_app, feed
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from billing.scenario import heartbeat, kernel, server_start

from gpulab.billing_service.enforce import Enforcer


def observed(user: str, first: float, t: float) -> dict:
    """The hub's own event kind: a span the observer saw (trusted, never from a server)."""
    return {
        "id": uuid.uuid4().hex,
        "kind": "activity",
        "user": user,
        "server": "",
        "span": "a-1",
        "first": first,
        "t": t,
    }


def decisions(engine, user: str, **settings) -> list[tuple[str, str]]:
    app = enforcer_app(engine, **settings)
    return [(a, r) for a, s, r in Enforcer(app).decide() if s.user == user]


def test_a_server_with_only_backdated_heartbeats_is_checked_from_its_observed_spans(
    engine,
) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    now = time.time()
    # 2x A100 for 5 hours: 21.00 of a 10.00 trial. The reporter's last word is 35 s old (a
    # heartbeat backdated past 3 intervals); the hub saw it working a second ago.
    feed(
        engine,
        [
            server_start(user, now - 5 * 3600, gpus=2),
            kernel("kernel_start", user, "k", now - 5 * 3600),
            heartbeat(user, now - 35, []),
            observed(user, now - 5 * 3600, now - 1),
        ],
    )
    assert decisions(engine, user) == [("stop", "balance used up")]


def test_a_server_charged_by_nothing_lately_is_left_alone(engine) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    now = time.time()
    # It ran up its debt two hours ago and has done nothing since: it costs nothing now.
    feed(
        engine,
        [
            server_start(user, now - 5 * 3600, gpus=2),
            observed(user, now - 5 * 3600, now - 2 * 3600),
            heartbeat(user, now - 5, []),
        ],
    )
    assert decisions(engine, user, idle_timeout=0) == []
    # (Idle that long, it is stopped as idle all the same, not for money.)
    assert decisions(engine, user) == [("stop", "no live kernel for 900s")]


def test_a_billing_restart_stops_nobody_as_idle_before_it_could_hear_them(engine) -> None:
    """Billing killed for 25 s while a kernel runs: on its restart nothing could have marked the
    session busy meanwhile, and the reporter's spool is still being flushed. Idleness counts from
    billing's own start at the earliest (a fresh-clone CI run caught the restarted service
    stopping a live server as "no live kernel")."""
    user = f"u{uuid.uuid4().hex[:8]}"
    now = time.time()
    feed(
        engine,
        [
            server_start(user, now - 120, gpus=0),
            kernel("kernel_start", user, "k", now - 120),
            heartbeat(user, now - 30, ["k"]),
        ],
    )
    just_up = int((now - 2) * 1_000_000)
    assert decisions(engine, user, idle_timeout=15, started_us=just_up) == []
    long_up = int((now - 600) * 1_000_000)
    assert decisions(engine, user, idle_timeout=15, started_us=long_up) == [
        ("stop", "no live kernel for 15s")
    ]
