"""The billing store against real SQLite and a real PostgreSQL: metering, rating, ledger.

These drive the same code the HTTP handlers call (``ingest``, ``ledger.credit``) without a hub,
so that order-independence and concurrency can be checked over many generated cases.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from decimal import Decimal

import pytest
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from billing.scenario import app, heartbeat, kernel, server_start, server_stop, session_events
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from gpulab.billing_service import ledger, statements
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO, Event, KernelSpan, ServerSession
from gpulab.billing_service.rating import PriceBook, format_money, round_div
from gpulab.billing_service.schemas import BatchError, parse_batch
from gpulab.catalog import load_catalog

PRICES = PriceBook(load_catalog())
TRIAL = 10 * MICRO
T0 = 1_780_000_000.0


def now_us() -> int:
    return time.time_ns() // 1000


def feed(engine, events: list[dict]):
    return ingest(engine, parse_batch({"events": events}, time.time()), PRICES, TRIAL, now_us())


def snapshot(engine, user: str) -> dict:
    """Everything a user would notice: balance, sessions (billed, charged), kernel spans."""
    with engine.connect() as conn:
        sessions = conn.execute(
            select(ServerSession)
            .where(ServerSession.user == user)
            .order_by(ServerSession.started_us)
        ).all()
        by_id = {s.id: i for i, s in enumerate(sessions)}
        spans = conn.execute(
            select(KernelSpan).where(KernelSpan.user == user).order_by(KernelSpan.kernel_id)
        ).all()
        bal = ledger.balance(conn, user) or 0
        assert bal == ledger.recompute_balance(conn, user)
        return {
            "balance": bal,
            "sessions": [
                (s.gpu_type, s.started_us, s.stopped_us, s.billed_us, s.charged_micro)
                for s in sessions
            ],
            "spans": [
                (k.kernel_id.split("-")[-1], k.first_us, k.last_us, by_id.get(k.session_id))
                for k in spans
            ],
            "events": conn.execute(select(Event.event_id).where(Event.user == user))
            .scalars()
            .all()
            .__len__(),
        }


def test_rounding_rule() -> None:
    # 30 s of an A100 at 2.10/h = 0.0175 exactly; 1 s = 583.33… micro-units, rounded half-even.
    assert PRICES.cost_micro("a100-80g", 1, "on-demand", [(0, 30 * MICRO)]) == 17_500
    assert PRICES.cost_micro("a100-80g", 1, "on-demand", [(0, MICRO)]) == 583
    assert round_div(5, 2) == 2 and round_div(7, 2) == 4 and round_div(-3, 2) == -2
    assert format_money(17_500) == "0.02" and format_money(12_500) == "0.01"
    # Spot is rated at on-demand until the spot market supplies prices.
    assert PRICES.price_at("a100-80g", "spot", 0) == Decimal("2.10")
    assert PRICES.cost_micro("rtx-4090", 2, "on-demand", [(0, 3600 * MICRO)]) == 1_360_000


def test_one_kernel_and_two_kernels_union(engine) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    # Kernel A 0-30 s, kernel B 10-40 s: kernel-seconds 60, billed (union) 40 s.
    feed(engine, session_events(user, T0, [(0, 30), (10, 40)], stop_at=45))
    snap = snapshot(engine, user)
    ((gpu, _, stopped, billed, charged),) = snap["sessions"]
    assert gpu == "a100-80g" and stopped == int((T0 + 45) * MICRO)
    assert billed == 40 * MICRO
    assert charged == PRICES.cost_micro("a100-80g", 1, "on-demand", [(0, 40 * MICRO)]) == 23_333
    assert snap["balance"] == TRIAL - 23_333
    assert sorted(last - first for _, first, last, _ in snap["spans"]) == [30 * MICRO] * 2


def test_apps_are_metered_like_kernels_and_bill_the_union(engine) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    # A kernel 0-20 s; an app run 10-40 s (killed: no stop, last listed at +40), restarted as a
    # new run at 45 s and last listed at 50 s. Billed: 0-40 and 45-50 = 45 s, not the sum.
    events = [
        server_start(user, T0),
        kernel("kernel_start", user, "k-1", T0),
        kernel("kernel_stop", user, "k-1", T0 + 20),
        app("app_start", user, "sd-1", T0 + 10),
        heartbeat(user, T0 + 20, ["k-1"], apps=["sd-1"]),
        heartbeat(user, T0 + 30, [], apps=["sd-1"]),
        heartbeat(user, T0 + 40, [], apps=["sd-1"]),
        app("app_stop", user, "sd-1", T0 + 40),
        app("app_start", user, "sd-2", T0 + 45),
        heartbeat(user, T0 + 50, [], apps=["sd-2"]),
        server_stop(user, T0 + 55),
    ]
    feed(engine, events)
    snap = snapshot(engine, user)
    ((_, _, _, billed, charged),) = snap["sessions"]
    assert billed == 45 * MICRO
    assert charged == PRICES.cost_micro("a100-80g", 1, "on-demand", [(0, 45 * MICRO)])
    assert sorted(last - first for _, first, last, _ in snap["spans"]) == [
        5 * MICRO,
        20 * MICRO,
        30 * MICRO,
    ]
    with engine.connect() as conn:
        usage = statements.usage(conn, PRICES, user, 0, round((T0 + 3600) * MICRO))
    (server,) = usage["servers"]
    assert [k["kernel_id"] for k in server["kernels"]] == ["k-1"]
    assert {a["app_id"]: a["app_seconds"] for a in server["apps"]} == {"sd-1": 30, "sd-2": 5}
    assert {a["name"] for a in server["apps"]} == {"sd-webui"}
    assert usage["total"] == {
        "kernel_seconds": 20,
        "app_seconds": 35,
        "observed_seconds": 0,  # no hub observation in this scenario
        "billed_seconds": 45,
        "amount": statements.money(charged),
    }


def test_app_events_are_validated_and_old_heartbeats_stay_valid() -> None:
    now = time.time()
    old = heartbeat("u", T0, ["k"])  # no "apps": a reporter from before apps
    assert "apps" not in old and parse_batch({"events": [old]}, now)[0].apps == []
    with pytest.raises(BatchError) as e:
        parse_batch({"events": [heartbeat("u", T0, ["app:sd-1"])]}, now)
    assert e.value.field == "events[0].kernels[0]" and "reserved for apps" in str(e.value)
    with pytest.raises(BatchError) as e:
        parse_batch({"events": [{**app("app_start", "u", "sd-1", T0), "app": ""}]}, now)
    assert e.value.field == "events[0].app"
    with pytest.raises(BatchError) as e:
        parse_batch({"events": [heartbeat("u", T0, [], apps="sd-1")]}, now)
    assert e.value.field == "events[0].apps"


def test_killed_server_is_billed_to_its_last_heartbeat(engine) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    kid = "k-1"
    events = [server_start(user, T0), kernel("kernel_start", user, kid, T0 + 1)]
    events += [heartbeat(user, T0 + t, [kid]) for t in (10, 20, 30)]
    # SIGKILL at ~T0+35: no stop event; the hub notices later and reports the stop at T0+50.
    events.append(server_stop(user, T0 + 50))
    feed(engine, events)
    (session,) = snapshot(engine, user)["sessions"]
    assert session[3] == 29 * MICRO  # from the start event to the last heartbeat


def test_a_late_stop_cannot_erase_reported_time(engine) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    feed(engine, session_events(user, T0, [(0, 60)]))
    before = snapshot(engine, user)
    # A forged "stop" dated before the heartbeats changes nothing.
    feed(engine, [kernel("kernel_stop", user, f"{user}--{T0}-0", T0 + 5)])
    after = snapshot(engine, user)
    assert after["sessions"] == before["sessions"] and after["balance"] == before["balance"]


def test_malformed_batch_names_the_field_and_stores_nothing(engine) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    good = session_events(user, T0, [(0, 30)])
    bad = [*good, {**heartbeat(user, T0 + 99, []), "t": "yesterday"}]
    with pytest.raises(BatchError) as e:
        parse_batch({"events": bad}, time.time())
    assert e.value.field == f"events[{len(good)}].t"
    with pytest.raises(BatchError) as e:
        parse_batch({"events": [{**good[1], "kernel": None}]}, time.time())
    assert e.value.field == "events[0].kernel"
    with pytest.raises(BatchError) as e:
        parse_batch({"events": [{**good[1], "kind": "kernel_explode"}]}, time.time())
    assert e.value.field == "events[0].kind" and "allowed" in str(e.value)
    assert snapshot(engine, user)["events"] == 0


def scenario(draw_kernels, second_session: bool, stop: bool, user: str) -> list[dict]:
    events = session_events(user, T0, draw_kernels, stop_at=None)
    if second_session:
        # The server is restarted without GPU at +200 s with one more kernel.
        events += session_events(
            user, T0 + 200, [(5, 50)], gpu="none", stop_at=60 if stop else None
        )
    elif stop:
        events.append(server_stop(user, T0 + 190))
    return events


kernels_strategy = st.lists(
    st.tuples(st.integers(0, 150), st.integers(1, 40)).map(lambda p: (p[0], p[0] + p[1])),
    min_size=1,
    max_size=3,
)


def rename(events: list[dict], user: str) -> list[dict]:
    return [{**e, "user": user, "id": f"{user}:{e['id']}"} for e in events]


def check_order_independence(engine, kernels, second, stop, seed) -> None:
    base = scenario(kernels, second, stop, "x")
    ref_user, test_user = f"r{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    feed(engine, rename(base, ref_user))
    rng = random.Random(seed)
    events = rename(base, test_user)
    events += rng.sample(events, k=min(len(events), rng.randint(0, 5)))  # duplicates
    rng.shuffle(events)
    i = 0
    while i < len(events):
        n = rng.randint(1, 6)
        feed(engine, events[i : i + n])
        i += n
    # Replaying everything once more (at-least-once delivery) changes nothing either.
    feed(engine, events)
    ref, got = snapshot(engine, ref_user), snapshot(engine, test_user)
    assert got == ref


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kernels=kernels_strategy, second=st.booleans(), stop=st.booleans(), seed=st.integers())
def test_duplicates_and_shuffles_change_nothing_sqlite(sqlite_engine, kernels, second, stop, seed):
    check_order_independence(sqlite_engine, kernels, second, stop, seed)


def test_duplicates_and_shuffles_change_nothing_postgresql(pg_url) -> None:  # noqa: F811
    engine = make_engine(pg_url)
    upgrade(engine)

    @settings(max_examples=15, deadline=None)
    @given(kernels=kernels_strategy, second=st.booleans(), stop=st.booleans(), seed=st.integers())
    def prop(kernels, second, stop, seed):
        check_order_independence(engine, kernels, second, stop, seed)

    prop()


def test_credits_are_idempotent(engine) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    key = uuid.uuid4().hex
    with engine.begin() as conn:
        entry, created = ledger.credit(
            conn, user, "topup", 5 * MICRO, key, now_us(), trial_micro=TRIAL
        )
    assert created
    with engine.begin() as conn:
        again, created = ledger.credit(
            conn, user, "topup", 5 * MICRO, key, now_us(), trial_micro=TRIAL
        )
    assert not created and again.id == entry.id
    with pytest.raises(ledger.IdempotencyConflict), engine.begin() as conn:
        ledger.credit(conn, user, "topup", 7 * MICRO, key, now_us(), trial_micro=TRIAL)
    with engine.connect() as conn:
        assert (
            ledger.balance(conn, user) == TRIAL + 5 * MICRO == ledger.recompute_balance(conn, user)
        )


def test_concurrent_topups_and_charges_lose_no_update(pg_url) -> None:  # noqa: F811
    """Many threads top up and charge one account at once on PostgreSQL: nothing is lost."""
    engine = make_engine(pg_url)
    upgrade(engine)
    user = "busy"
    errors: list[BaseException] = []
    topup_keys = [uuid.uuid4().hex for _ in range(60)]

    def topups(keys):
        try:
            for key in keys:
                with engine.begin() as conn:
                    ledger.credit(conn, user, "topup", 10_000, key, now_us(), trial_micro=TRIAL)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def charges(server: str):
        try:
            t0 = T0 + 1000
            feed(engine, [server_start(user, t0, "rtx-4090", 1, server)])
            for i in range(20):
                # Each batch extends the kernel by 7 s: one charge per batch.
                feed(engine, [heartbeat(user, t0 + 7 * (i + 1), ["k"], server)])
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=topups, args=(topup_keys[i::3] * 2,)) for i in range(3)]
    threads += [threading.Thread(target=charges, args=(f"s{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    with engine.connect() as conn:
        charged = sum(
            conn.execute(
                select(ServerSession.charged_micro).where(ServerSession.user == user)
            ).scalars()
        )
        bal = ledger.balance(conn, user)
        assert bal == ledger.recompute_balance(conn, user)
    # Every kernel ran 133 s (first heartbeat at +7 s to the last at +140 s) on an RTX 4090.
    per_server = PRICES.cost_micro("rtx-4090", 1, "on-demand", [(0, 133 * MICRO)])
    assert charged == 4 * per_server
    assert bal == TRIAL + 60 * 10_000 - 4 * per_server
