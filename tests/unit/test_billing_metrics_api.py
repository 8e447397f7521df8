"""Billing's /metrics and the console's revenue API on the real app and handlers (in-process,
fresh SQLite; the hub's token check replaced by fixed token models).

Issue 24: "billing ingest rate and latency, revenue by type, pricing mode and course, enforcer
actions, balances below a threshold" on billing's own /metrics, scope-protected as JupyterHub
protects /hub/metrics; the console's "revenue per day and per user, top spenders, credits and
refunds with who gave them and why", the same numbers as the statements."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
from billing.scenario import eid, heartbeat, kernel, server_start, server_stop
from billing.service import make_service, serve
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from gpulab.billing_service import storage
from gpulab.billing_service.metrics import thresholds_of
from gpulab.catalog.models import CatalogError, load_catalog, parse_catalog

ADMIN = {"kind": "user", "name": "admin", "scopes": ["admin:users"]}
PROMETHEUS = {"kind": "service", "name": "gpulab-prometheus", "scopes": ["read:metrics"]}
ALICE = {"kind": "user", "name": "alice", "scopes": ["self", "access:servers!user=alice"]}
ALICE_SERVER = {
    "kind": "user",
    "name": "alice",
    "scopes": ["custom:gpulab:report-usage!server=alice/", "read:users:name!user=alice"],
}
TOKENS = {"admin": ADMIN, "prom": PROMETHEUS, "alice": ALICE, "alice-server": ALICE_SERVER}


async def fetch(c, path: str, token: str, method: str = "GET", body: str | None = None):
    base = c.base.removesuffix("api/v1/")
    req = HTTPRequest(
        base + path, method=method, headers={"Authorization": f"token {token}"}, body=body
    )
    resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    return resp.code, resp.body.decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def family(found: dict, name: str) -> dict[tuple, float]:
    return {labels: v for (n, labels), v in found.items() if n == name}


def usage_events(now: float) -> list[dict]:
    """Three users' sessions as the hub and their reporters post them: alice on an A100 for
    20 minutes, bob without a GPU for 30, carol under course ml101 on an A100 for 10; the hub's
    own observed sample of bob's server."""
    t0 = now - 3600
    events = []
    for user, gpu, minutes in (("alice", "a100-80g", 20), ("bob", "none", 30)):
        k = eid()
        events += [
            server_start(user, t0, gpu),
            kernel("kernel_start", user, k, t0 + 1),
            heartbeat(user, t0 + 300, [k]),
            kernel("kernel_stop", user, k, t0 + 60 * minutes),
            server_stop(user, t0 + 60 * minutes + 5),
        ]
    start = server_start("carol", t0, "a100-80g")
    start["options"] = {**start["options"], "course": "ml101"}
    k = eid()
    events += [
        start,
        kernel("kernel_start", "carol", k, t0 + 1),
        kernel("kernel_stop", "carol", k, t0 + 601),
        server_stop("carol", t0 + 700),
        {
            "id": eid(),
            "kind": "activity",
            "user": "bob",
            "server": "",
            "t": t0 + 1700,
            "span": "ALLOC-1",
            "first": t0 + 2,
        },
    ]
    return events


def test_metrics_and_revenue_are_the_statements_sums_and_only_for_the_operator(
    tmp_path, monkeypatch
) -> None:
    """Issue 24 points: billing's families on /metrics (ingest by source, revenue by type,
    pricing and course, credits by kind, balances below each threshold, accounts, lag), for
    read:metrics or admins only (403 for a user's and a server's token); the revenue API's
    days, users, top spenders and credits with who and why are the statements' numbers."""
    service = make_service(tmp_path, monkeypatch, TOKENS)
    service.metrics_cache_seconds = 0  # every scrape reads the database afresh
    now = time.time()

    async def scenario(c):
        # Nobody but the operator reads them.
        for token in ("alice", "alice-server", "nobody"):
            code, text = await fetch(c, "metrics", token)
            assert code == 403, (token, code, text)
            code, text = await fetch(c, "api/admin/revenue?days=7", token)
            assert code == 403, (token, code, text)

        events = usage_events(now)
        code, body = await c.call("POST", "events", "admin", {"events": events})
        assert code == 200 and body["accepted"] == len(events), body
        for user, amount, kind, key, note in (
            ("alice", "5.00", "topup", "t1", "paid by bank transfer"),
            ("bob", "-1.00", "adjustment", "a1", "duplicate trial"),
            ("bob", "2.50", "adjustment", "a2", "outage on 2 Dec"),
        ):
            code, body = await c.call(
                "POST",
                f"users/{user}/credits",
                "admin",
                {"amount": amount, "kind": kind, "idempotency_key": key, "note": note},
            )
            assert code == 201, body
        code, body = await c.call(
            "POST", "courses/ml101/credits", "admin", {"amount": "20", "idempotency_key": "p1"}
        )
        assert code == 201, body

        code, text = await fetch(c, "metrics", "prom")
        assert code == 200, text
        found = samples(text)

        # Revenue: per (type, pricing, course), the statements' session amounts.
        statements = {}
        for user in ("alice", "bob", "carol"):
            code, usage = await c.call("GET", f"users/{user}/usage?from=2000-01-01", "admin")
            statements[user] = usage
        expected: dict[tuple, Decimal] = {}
        for usage in statements.values():
            for s in usage["servers"]:
                key = (
                    ("course", s["course"] or ""),
                    ("pricing", s["pricing"].replace("-", "_")),
                    ("type", s["gpu_type"]),
                )
                expected[key] = expected.get(key, Decimal(0)) + Decimal(s["amount"]["exact"])
        revenue = family(found, "gpulab_billing_revenue_total")
        assert {k: Decimal(str(v)) for k, v in revenue.items()} == expected
        assert (("course", "ml101"), ("pricing", "on_demand"), ("type", "a100-80g")) in revenue
        assert (("course", ""), ("pricing", "on_demand"), ("type", "none")) in revenue
        assert all(v > 0 for v in revenue.values())

        credits = family(found, "gpulab_billing_credits_total")
        assert credits == {
            (("kind", "trial"),): 30.0,  # three accounts opened with 10.00
            (("kind", "credit"),): 25.0,  # alice's 5.00 and the pool's 20
            (("kind", "refund"),): 2.5,  # bob's positive adjustment (the debit is no credit)
            (("kind", "compensation"),): 0.0,
        }

        # Accounts and balances below each threshold (0 and 10): what the balances say.
        balances = {}
        for user in ("alice", "bob", "carol"):
            code, info = await c.call("GET", f"users/{user}/balance", "admin")
            balances[user] = Decimal(info["balance"]["exact"])
        assert family(found, "gpulab_billing_accounts") == {(): 3.0}
        below = family(found, "gpulab_billing_balances_below")
        assert below == {
            (("threshold", "0"),): float(sum(b < 0 for b in balances.values())),
            (("threshold", "10"),): float(sum(b < 10 for b in balances.values())),
        }
        # carol paid her course session herself (the pool was empty then); alice and bob got more.
        assert below[(("threshold", "10"),)] == 1

        # What ingestion took, by source: the hub's observed sample apart.
        ingest = family(found, "gpulab_billing_ingest_total")
        assert ingest[(("source", "observed"),)] == 1
        assert ingest[(("source", "event"),)] == len(events) - 1
        assert ingest[(("source", "storage"),)] == 0
        count = family(found, "gpulab_billing_ingest_latency_seconds_count")
        assert count == {(): 1.0}
        # No server runs: nothing lags.
        assert family(found, "gpulab_billing_lag_seconds") == {(): 0.0}
        for action in ("no_gpu", "stop", "close", "failed"):
            assert (
                family(found, "gpulab_billing_enforcer_actions_total")[(("action", action),)] == 0
            )

        # The console's money: the same sums.
        code, text = await fetch(c, "api/admin/revenue?days=2", "admin")
        assert code == 200, text
        report = json.loads(text)
        assert len(report["days"]) == 2
        total = sum(Decimal(d["total"]["exact"]) for d in report["days"])
        assert total == sum(expected.values())
        by_user = {u["user"]: Decimal(u["total"]["exact"]) for u in report["by_user"]}
        assert by_user == {u: Decimal(s["total"]["amount"]["exact"]) for u, s in statements.items()}
        assert [u["user"] for u in report["top"]] == sorted(by_user, key=lambda u: (-by_user[u], u))
        today = report["days"][-1]
        assert Decimal(today["by_type"]["a100-80g"]["exact"]) == sum(
            v for k, v in expected.items() if k[2] == ("type", "a100-80g")
        )
        given = {
            (c_["account"], c_["kind"], c_["amount"]["exact"], c_["by"], c_["reason"])
            for c_ in report["credits"]
        }
        assert given == {
            ("user:alice", "credit", "5", "admin", "paid by bank transfer"),
            ("user:bob", "debit", "-1", "admin", "duplicate trial"),
            ("user:bob", "refund", "2.5", "admin", "outage on 2 Dec"),
            ("course:ml101", "credit", "20", "admin", ""),
        }

        # A server running now: the lag is the time since its newest sample.
        k = eid()
        code, body = await c.call(
            "POST",
            "events",
            "admin",
            {
                "events": [
                    server_start("dave", now - 100, "none"),
                    kernel("kernel_start", "dave", k, now - 90),
                    heartbeat("dave", now - 30, [k]),
                ]
            },
        )
        assert code == 200, body
        code, text = await fetch(c, "metrics", "admin")
        (lag,) = family(samples(text), "gpulab_billing_lag_seconds").values()
        assert 30 <= lag < 30 + (time.time() - now) + 1

    serve(service, scenario)


def test_bad_days_answer_400_naming_days(tmp_path, monkeypatch) -> None:
    """Issue 24 (console's money): ``days`` outside 1..366 or not a whole number is a 400
    naming ``days``."""
    service = make_service(tmp_path, monkeypatch, TOKENS)

    async def scenario(c):
        for bad in ("0", "367", "-1", "1.5", "abc", "", "1e2", "٣"):
            code, text = await fetch(c, f"api/admin/revenue?days={bad}", "admin")
            assert code == 400, (bad, code, text)
            assert '"field": "days"' in text, text
        for good, n in (("1", 1), ("366", 366)):
            code, text = await fetch(c, f"api/admin/revenue?days={good}", "admin")
            assert code == 200 and text.count('"date"') == n, text[:200]
        code, text = await fetch(c, "api/admin/revenue", "admin")
        assert code == 200 and text.count('"date"') == 30

    serve(service, scenario)


def test_low_balance_thresholds_come_from_the_catalog(tmp_path, monkeypatch) -> None:
    """Issue 24 ("balances below a threshold"): the thresholds are the catalog's
    ``[billing] low_balance_thresholds``; a bad one stops the catalog with its key named."""
    base = load_catalog()
    data = base.model_dump(mode="json")
    for section in ("gpu_types", "images", "datasets", "apps", "models"):
        for entry in data[section].values():
            entry.pop("slug", None)
    data["billing"] = {"low_balance_thresholds": ["-2", "1.5"]}
    catalog = parse_catalog(data)
    assert thresholds_of(catalog.billing.low_balance_thresholds) == [
        ("-2", -2_000_000),
        ("1.5", 1_500_000),
    ]
    for bad in (["1.1234567"], ["ten"], "10"):
        data["billing"] = {"low_balance_thresholds": bad}
        with pytest.raises(CatalogError, match=r"billing\.low_balance_thresholds"):
            parse_catalog(data)

    service = make_service(tmp_path, monkeypatch, TOKENS)
    service.catalog = catalog
    service.metrics_cache_seconds = 0

    async def scenario(c):
        for user, amount in (("alice", "-11"), ("bob", "-8")):  # balances -1 and 2 of 10
            code, body = await c.call(
                "POST",
                f"users/{user}/credits",
                "admin",
                {"amount": amount, "kind": "adjustment", "idempotency_key": user},
            )
            assert code == 201, body
        code, text = await fetch(c, "metrics", "prom")
        assert family(samples(text), "gpulab_billing_balances_below") == {
            (("threshold", "-2"),): 0.0,
            (("threshold", "1.5"),): 1.0,
        }

    serve(service, scenario)


def test_storage_metered_from_the_hubs_scan_counts_as_ingested(tmp_path, monkeypatch) -> None:
    """Issue 24 ("billing ingest rate"): each home billing meters from the hub's storage scan
    is counted under ``source="storage"``; a pull the hub gives no scan for counts nothing."""
    service = make_service(tmp_path, monkeypatch, TOKENS)
    service.storage_metering = storage.StorageMetering(service)
    answers = []

    class Hub:
        async def request(self, method: str, path: str):
            assert (method, path) == ("GET", "/storage")
            return answers.pop(0)

    service.hub = Hub()
    free = service.catalog.storage.free_bytes
    t = time.time()
    scan = {
        "measured_at": t,
        "homes": [
            {"user": u, "measured_at": t, "used_bytes": 1, "quota_bytes": free + 2**30}
            for u in ("alice", "bob", "carol")
        ],
    }
    answers += [(200, scan), (503, None)]

    async def scenario(c):
        code, body = await c.call("POST", "storage/pull", "admin")
        assert code == 200 and body["homes"] == 3, body
        code, _ = await c.call("POST", "storage/pull", "admin")
        assert code == 502
        code, text = await fetch(c, "metrics", "prom")
        ingest = family(samples(text), "gpulab_billing_ingest_total")
        assert ingest == {
            (("source", "storage"),): 3.0,
            (("source", "event"),): 0.0,
            (("source", "observed"),): 0.0,
        }

    serve(service, scenario)
