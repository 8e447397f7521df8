"""A reporter's events are bounded by the session the hub reported (``billing_service.bounds``).

These drive ``ingest`` with the limits the events endpoint applies to a server's own token, on a
real SQLite database; tests/e2e/test_billing_attacks.py makes the same attacks over HTTP.
"""

from __future__ import annotations

import time
import uuid

import pytest
from billing.scenario import heartbeat, kernel, server_start, server_stop

from gpulab.billing_service import ledger
from gpulab.billing_service.bounds import Limits
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO, Event, KernelSpan, ServerSession
from gpulab.billing_service.rating import PriceBook
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import load_catalog

PRICES = PriceBook(load_catalog())
TRIAL = 10 * MICRO
LIMITS = Limits(skew_us=5 * MICRO, max_new_per_batch=20, max_new_per_heartbeat=5)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = make_engine(f"sqlite:///{tmp_path_factory.mktemp('bounds') / 'billing.sqlite'}")
    upgrade(eng)
    return eng


def hub(engine, events: list[dict], now: float) -> None:
    """Trusted events (the hub's hooks): no bounds."""
    ingest(engine, parse_batch({"events": events}, now + 1), PRICES, TRIAL, round(now * MICRO))


def reporter(engine, events: list[dict], now: float):
    """A server's own reporter: the endpoint's limits apply."""
    batch = parse_batch({"events": events}, now + 1)
    return ingest(engine, batch, PRICES, TRIAL, round(now * MICRO), LIMITS)


def state(engine, user: str) -> tuple:
    with engine.connect() as conn:
        sessions = conn.execute(
            ServerSession.__table__.select()
            .where(ServerSession.user == user)
            .order_by(ServerSession.id)
        ).all()
        spans = conn.execute(
            KernelSpan.__table__.select()
            .where(KernelSpan.user == user)
            .order_by(KernelSpan.kernel_id)
        ).all()
        events = conn.execute(Event.__table__.select().where(Event.user == user)).all()
        return (
            ledger.balance(conn, user),
            [(s.billed_us, s.charged_micro, s.stopped_us) for s in sessions],
            [(k.kernel_id, k.first_us, k.last_us, k.session_id) for k in spans],
            len(events),
        )


def running(engine, t0: float) -> str:
    """A user whose server started at t0 and ran kernel k1 from t0+1 to t0+60 (heartbeats)."""
    user = f"u{uuid.uuid4().hex[:8]}"
    hub(engine, [server_start(user, t0)], t0)
    evs = [kernel("kernel_start", user, "k1", t0 + 1)]
    evs += [heartbeat(user, t0 + t, ["k1"]) for t in (10, 20, 30, 40, 50, 60)]
    assert reporter(engine, evs, t0 + 61).accepted == len(evs)
    return user


def test_a_stop_dated_1970_is_refused_and_refunds_nothing(engine) -> None:
    t0 = time.time() - 100
    user = running(engine, t0)
    before = state(engine, user)
    assert before[1][0][1] > 0  # charged for ~59 s
    r = reporter(engine, [{**kernel("kernel_stop", user, "k1", 1.0)}], t0 + 62)
    assert r.accepted == 0 and len(r.rejected) == 1
    (rej,) = r.rejected
    assert rej.field == "events[0].t" and "outside the current session" in rej.message
    lo = (round(t0 * MICRO) - 5 * MICRO) / MICRO  # the range starts 5 s before the start
    assert f"allowed {lo:.6f} to " in rej.message
    assert state(engine, user) == before


def test_backwards_report_of_a_known_kernel_is_refused(engine) -> None:
    t0 = time.time() - 100
    user = running(engine, t0)
    before = state(engine, user)
    # Within the session, but before what was already accepted for k1.
    r = reporter(engine, [kernel("kernel_stop", user, "k1", t0 + 30)], t0 + 62)
    assert [x.field for x in r.rejected] == ["events[0].t"]
    assert "already accepted for kernel 'k1'" in r.rejected[0].message
    assert state(engine, user) == before
    # Forward is fine.
    assert reporter(engine, [kernel("kernel_stop", user, "k1", t0 + 61)], t0 + 62).accepted == 1


def test_future_and_ghost_server_reports_are_refused(engine) -> None:
    t0 = time.time() - 100
    user = running(engine, t0)
    before = state(engine, user)
    r = reporter(engine, [heartbeat(user, t0 + 100 + 30, ["k1"])], t0 + 100)
    assert r.rejected[0].field == "events[0].t"
    r = reporter(engine, [heartbeat(user, t0 + 90, ["k9"], server="ghost")], t0 + 100)
    assert r.rejected[0].field == "events[0].server" and "no session" in r.rejected[0].message
    assert state(engine, user) == before


def test_a_batch_rejects_only_the_bad_events(engine) -> None:
    t0 = time.time() - 100
    user = running(engine, t0)
    good = heartbeat(user, t0 + 70, ["k1"])
    bad = kernel("kernel_stop", user, "k1", 1.0)
    r = reporter(engine, [good, bad], t0 + 71)
    assert r.accepted == 1 and [(x.index, x.id) for x in r.rejected] == [(1, bad["id"])]
    spans = state(engine, user)[2]
    assert spans[0][2] == round((t0 + 70) * MICRO)
    # A duplicate is answered as one and never re-checked.
    again = reporter(engine, [good], t0 + 200)
    assert (again.accepted, again.duplicates, again.rejected) == (0, 1, [])


def test_a_span_stays_in_its_session(engine) -> None:
    t0 = time.time() - 300
    user = running(engine, t0)
    hub(engine, [server_stop(user, t0 + 65), server_start(user, t0 + 100)], t0 + 100)
    first = state(engine, user)
    # The old kernel cannot be dragged into the new session.
    r = reporter(engine, [heartbeat(user, t0 + 110, ["k1"])], t0 + 111)
    assert r.rejected[0].field == "events[0].kernels[0]"
    assert "another session" in r.rejected[0].message
    # A new kernel reported 3 s before the new session's start (clock skew) counts from the
    # start, in the new session, never in the one before.
    r = reporter(engine, [kernel("kernel_start", user, "k2", t0 + 97)], t0 + 111)
    assert r.accepted == 1
    spans = {k: (a, b, sid) for k, a, b, sid in state(engine, user)[2]}
    with engine.connect() as conn:
        new_sid = (
            conn.execute(ServerSession.__table__.select().where(ServerSession.user == user))
            .all()[-1]
            .id
        )
    assert spans["k2"] == (round((t0 + 100) * MICRO), round((t0 + 100) * MICRO), new_sid)
    assert spans["k1"] == tuple(first[2][0][1:])


def test_new_id_caps(engine) -> None:
    t0 = time.time() - 100
    user = running(engine, t0)
    before = state(engine, user)
    r = reporter(engine, [heartbeat(user, t0 + 70, [f"n{i}" for i in range(6)])], t0 + 71)
    assert r.rejected[0].field == "events[0].kernels"
    assert "at most 5 new ones per heartbeat" in r.rejected[0].message
    assert state(engine, user) == before
    batch = [heartbeat(user, t0 + 70 + i / 10, [f"m{i}-{j}" for j in range(5)]) for i in range(5)]
    r = reporter(engine, batch, t0 + 71)
    assert r.accepted == 4 and [x.index for x in r.rejected] == [4]
    assert "at most 20 new ones per batch" in r.rejected[0].message
