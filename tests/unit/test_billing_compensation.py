"""Compensation for work lost to a platform reclaim: the rule, the credit, once per key."""

from __future__ import annotations

import csv
import io
import time
import uuid

import pytest
from billing.scenario import heartbeat, kernel, server_start, server_stop

from gpulab.billing_service import ledger, statements
from gpulab.billing_service.compensation import Rule, compensate, find_session
from gpulab.billing_service.csv_export import render
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import PriceBook
from gpulab.billing_service.schemas import parse_batch
from gpulab.hub_config.catalog import load_catalog

PRICES = PriceBook(load_catalog())
T0 = 1_780_000_000.0


def test_rules_parse_or_say_what_is_allowed() -> None:
    assert Rule.parse("last-minutes:10") == Rule(minutes=10.0)
    assert Rule.parse("fixed:1.50") == Rule(fixed_micro=1_500_000)
    for bad in ("", "last-minutes:0", "last-minutes:x", "fixed:-1", "fixed:0.0000001", "all"):
        with pytest.raises(ValueError, match="last-minutes:N"):
            Rule.parse(bad)


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path / 'billing.sqlite'}")
    upgrade(eng)
    yield eng
    eng.dispose()


def test_compensation_credits_the_last_minutes_once(engine) -> None:
    user = f"c{uuid.uuid4().hex[:8]}"
    # A kernel ran 30 minutes (0-1800 s) on an A100 (2.10/h); the server was reclaimed at 1800 s.
    events = [server_start(user, T0), kernel("kernel_start", user, "k1", T0)]
    events += [heartbeat(user, T0 + t, ["k1"]) for t in range(60, 1801, 60)]
    events.append(server_stop(user, T0 + 1800))
    ingest(engine, parse_batch({"events": events}, time.time()), PRICES, 10 * MICRO, 0)
    rule = Rule.parse("last-minutes:10")
    with engine.begin() as conn:
        sess = find_session(conn, user, "", None)
        entry, created = compensate(
            conn,
            PRICES,
            rule,
            sess,
            reason="spot-preemption",
            checkpoint="failed",
            key="k-1",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
    assert created and entry.kind == "compensation" and entry.session_id == sess.id
    assert entry.amount_micro == 350_000  # 10 minutes of 2.10/h
    assert "spot-preemption, checkpoint failed" in entry.note
    with engine.begin() as conn:
        again, created = compensate(
            conn,
            PRICES,
            rule,
            sess,
            reason="spot-preemption",
            checkpoint="failed",
            key="k-1",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
        assert not created and again.id == entry.id
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)
        usage = statements.usage(conn, PRICES, user, 0, round((T0 + 3600) * MICRO))
    assert usage["compensation"]["micro"] == 350_000
    (s,) = usage["servers"]
    assert [c["amount"]["micro"] for c in s["compensations"]] == [350_000]
    rows = list(csv.DictReader(io.StringIO(render(usage))))
    (comp,) = [r for r in rows if r["row"] == "compensation"]
    assert comp["amount_CNY"] == "-0.35" and "spot-preemption" in comp["note"]
    # Another session's key cannot be reused.
    other = f"o{uuid.uuid4().hex[:8]}"
    ingest(engine, parse_batch({"events": [server_start(other, T0)]}, time.time()), PRICES, 0, 0)
    with pytest.raises(ledger.IdempotencyConflict), engine.begin() as conn:
        compensate(
            conn,
            PRICES,
            rule,
            find_session(conn, other, "", None),
            reason="node-failure",
            checkpoint="timeout",
            key="k-1",
            note="",
            actor="hub",
            now_us=0,
            until_us=0,
        )
