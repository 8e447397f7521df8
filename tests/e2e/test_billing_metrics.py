"""Billing's metrics and the console's money, end to end: a real hub starts billing on a real
PostgreSQL database, real servers run real kernels and are charged, and the figures billing's
/metrics gives (through the proxy, with the Prometheus token of GPULAB_PROMETHEUS_TOKEN) are the
statements' and the ledger's.

Issue 24: "billing ingest rate and latency, revenue by type, pricing mode and course, enforcer
actions, balances below a threshold" on billing's own /metrics, "scope-protected as JupyterHub
does"; the console's money "the same number as in the metrics and the statement".
"""

from __future__ import annotations

import re
import time
import uuid
from collections import defaultdict
from decimal import Decimal

import psycopg
import pytest
import requests
from billing.client import Billing, user_token
from billing.fixtures import pg_cluster  # noqa: F401 (fixtures)
from harness import FAST_BILLING_ENV, HB, admin_web, wait_for
from prometheus_client.parser import text_string_to_metric_families

PROMETHEUS_TOKEN = uuid.uuid4().hex


@pytest.fixture(scope="module")
def mhub(module_hub_factory, pg_cluster):  # noqa: F811 (the fixture imported above)
    db_url = pg_cluster.create_database(f"m{uuid.uuid4().hex[:12]}")
    h = module_hub_factory(
        "billing-metrics",
        simulate="A100-80G:2",
        env={
            **FAST_BILLING_ENV,
            "GPULAB_BILLING_DB_URL": db_url,
            "GPULAB_PROMETHEUS_TOKEN": PROMETHEUS_TOKEN,
            "GPULAB_BILLING_ARGS": (
                f"--BillingService.heartbeat_interval={HB} --BillingService.enforce_interval=1 "
                "--BillingService.switch_margin=90 --BillingService.metrics_cache_seconds=0"
            ),
        },
    )
    wait_for(Billing(h).up, 60, 0.2, "the billing service")
    h.billing_db = db_url
    return h


@pytest.fixture
def billing(mhub) -> Billing:
    return Billing(mhub)


@pytest.fixture
def muser(mhub):
    name = mhub.create_user(f"m{uuid.uuid4().hex[:8]}")
    yield name
    if mhub.server(name) is not None:
        mhub.stop_server(name)


def scrape(billing: Billing, token: str = PROMETHEUS_TOKEN) -> dict[str, dict[tuple, float]]:
    """billing's /metrics through the proxy: family sample name -> labels -> value."""
    r = requests.get(
        billing.base + "metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain; version=")
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def db(mhub):
    return psycopg.connect(mhub.billing_db)


def statements_by_series(billing: Billing) -> tuple[dict[tuple, Decimal], dict[str, dict]]:
    """Every user's statement (all time), summed as the revenue family labels them; and the
    statements by user."""
    users = billing.get("api/v1/admin/overview", params={"from": "2000-01-01"}).json()["users"]
    sums: dict[tuple, Decimal] = defaultdict(Decimal)
    usages = {}
    for u in users:
        usage = billing.usage(u["user"])
        usages[u["user"]] = usage
        for s in usage["servers"]:
            key = (
                ("course", s["course"] or ""),
                ("pricing", s["pricing"].replace("-", "_")),
                ("type", s["gpu_type"]),
            )
            sums[key] += Decimal(s["amount"]["exact"])
        storage = Decimal(usage["storage"]["total"]["exact"])
        if storage:
            sums[(("course", ""), ("pricing", "storage"), ("type", "storage"))] += storage
    return dict(sums), usages


def test_a_users_and_a_servers_token_get_403(mhub, billing, muser) -> None:
    """Issue 24 ("scope-protected as JupyterHub does"): billing's /metrics answers the
    Prometheus token (read:metrics only) and admins; the console's revenue API admins only. A
    user's own token and their server's token (readable by any code in the server) get 403 on
    both, and so does the Prometheus token on the revenue API; no token at all is 403 on
    /metrics, and a browser with no billing session is sent to log in for the revenue API."""
    token = user_token(mhub, muser)
    mhub.spawn_ready(muser, {"gpu": "none"})
    with mhub.kernel(muser) as k:
        server_token = k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
    for who, t in (("user", token), ("server", server_token)):
        for path in ("metrics", "api/admin/revenue?days=7"):
            r = billing.get(path, t)
            assert r.status_code == 403, (who, path, r.status_code, r.text[:300])
    r = billing.get("api/admin/revenue", PROMETHEUS_TOKEN)
    assert r.status_code == 403, r.text
    r = requests.get(billing.base + "metrics", timeout=30)
    assert r.status_code == 403
    r = requests.get(billing.base + "api/admin/revenue", timeout=30, allow_redirects=False)
    assert r.status_code == 302 and "/hub/api/oauth2/authorize" in r.headers["Location"]
    # The operator's tokens get in.
    assert "gpulab_billing_accounts" in scrape(billing)
    assert "gpulab_billing_accounts" in scrape(billing, mhub.token)
    assert billing.get("api/admin/revenue?days=1").status_code == 200


def test_the_families_are_the_statements_and_the_ledger(mhub, billing, muser) -> None:
    """Issue 24 (a scrape "checks the values against what the APIs say"): after a GPU and a
    no-GPU server ran real kernels and were charged, revenue per (type, pricing, course) is the
    sum of every user's statement and of the ledger's charges; credits per kind are the
    ledger's; accounts and balances below 0 and 10 are the balances billing reports; events
    ingested by source are the events stored; the lag is small while a server runs and 0 once
    none does; the console's revenue report is the same money."""
    other = mhub.create_user(f"m{uuid.uuid4().hex[:8]}")
    billing.credit(other, "3.00", kind="topup", key=f"topup-{other}")
    mhub.spawn_ready(muser, {"gpu": "a100-80g"})
    mhub.spawn_ready(other, {"gpu": "none"})
    with mhub.kernel(muser) as ka, mhub.kernel(other) as kb:
        ka.execute("x = 1")
        kb.execute("y = 2")

        # While servers run, billing keeps up: the lag is a few heartbeats at most.
        def fresh():
            lag = scrape(billing)["gpulab_billing_lag_seconds"][()]
            return lag if 0 < lag < 5 * HB + 2 else None

        wait_for(fresh, 30, 0.5, "billing's lag to show running servers")
        time.sleep(3)
    mhub.stop_server(muser)
    mhub.stop_server(other)

    seen: list[dict] = []

    def agreed():
        # Settled: the same money in two reads a heartbeat apart (a stopped server's last
        # observed sample is charged when it arrives, up to a heartbeat after the stop; CI, stop
        # 31), and the metric equal to the statements read between two scrapes that agree.
        before = scrape(billing)
        sums, usages = statements_by_series(billing)
        after = scrape(billing)
        revenue = after["gpulab_billing_revenue_total"]
        if before["gpulab_billing_revenue_total"] != revenue:
            return None  # still being charged
        got = {k: Decimal(str(v)) for k, v in revenue.items() if v}
        if got != {k: v for k, v in sums.items() if v}:
            return None
        settled = seen[-1:] == [got]
        seen.append(got)
        return (after, usages) if settled else None

    found, usages = wait_for(agreed, 60, HB + 0.5, "the revenue metric to equal the statements")
    revenue = found["gpulab_billing_revenue_total"]
    a100 = (("course", ""), ("pricing", "on_demand"), ("type", "a100-80g"))
    none = (("course", ""), ("pricing", "on_demand"), ("type", "none"))
    assert revenue[a100] > 0 and revenue[none] > 0
    assert Decimal(str(revenue[a100])) >= Decimal(usages[muser]["total"]["amount"]["exact"]) > 0

    with db(mhub) as conn:
        charged = (
            -conn.execute(
                "SELECT coalesce(sum(amount_micro), 0) FROM ledger WHERE kind IN ('charge', 'storage')"
            ).fetchone()[0]
            - conn.execute(
                "SELECT coalesce(sum(amount_micro), 0) FROM course_ledger WHERE kind = 'charge'"
            ).fetchone()[0]
        )
        given = dict(
            conn.execute(
                "SELECT kind, sum(amount_micro) FILTER (WHERE amount_micro > 0) FROM ("
                " SELECT kind, amount_micro FROM ledger UNION ALL"
                " SELECT kind, amount_micro FROM course_ledger) e GROUP BY kind"
            ).fetchall()
        )
    # The ledger's charges, to the micro-unit (no reservation was made here).
    assert round(sum(Decimal(str(v)) for v in revenue.values()) * 10**6) == charged
    credits = found["gpulab_billing_credits_total"]
    assert credits[(("kind", "credit"),)] * 10**6 == pytest.approx(given.get("topup") or 0)
    assert credits[(("kind", "trial"),)] * 10**6 == pytest.approx(given["trial"])
    assert credits[(("kind", "credit"),)] >= 3.0

    overview = billing.get("api/v1/admin/overview", params={"from": "2000-01-01"}).json()
    balances = [Decimal(u["balance"]["exact"]) for u in overview["users"]]
    assert found["gpulab_billing_accounts"][()] == len(balances)
    for threshold in ("0", "10"):
        expected = sum(b < Decimal(threshold) for b in balances)
        assert found["gpulab_billing_balances_below"][(("threshold", threshold),)] == expected
    assert found["gpulab_billing_lag_seconds"][()] == 0  # nothing runs now

    # Ingested by source: the events billing stored (the hub's observed samples apart), read
    # between two scrapes that agree (a late report may still arrive).
    def ingested():
        first = scrape(billing)["gpulab_billing_ingest_total"]
        with db(mhub) as conn:
            stored = dict(
                conn.execute(
                    "SELECT kind = 'activity', count(*) FROM events"
                    " WHERE event_id NOT LIKE 'enforcer-stop-%' GROUP BY 1"
                ).fetchall()
            )
        second = scrape(billing)["gpulab_billing_ingest_total"]
        return (second, stored) if first == second else None

    ingest, stored = wait_for(ingested, 30, 0.5, "a quiet moment of ingestion")
    assert ingest[(("source", "observed"),)] == stored.get(True, 0) > 0
    assert ingest[(("source", "event"),)] == stored.get(False, 0) > 0
    assert found["gpulab_billing_ingest_latency_seconds_count"][()] > 0

    # The console's money: today's revenue and each user's total are the statements', read
    # between two reports that agree.
    def console():
        first = billing.get("api/admin/revenue", params={"days": "1"}).json()
        _, now = statements_by_series(billing)
        report = billing.get("api/admin/revenue", params={"days": "1"}).json()
        return (report, now) if report["by_user"] == first["by_user"] else None

    report, usages = wait_for(console, 30, 0.5, "a revenue report between two that agree")
    by_user = {u["user"]: Decimal(u["total"]["exact"]) for u in report["by_user"]}
    for name in (muser, other):
        usage = usages[name]
        assert by_user[name] == Decimal(usage["total"]["amount"]["exact"]) + Decimal(
            usage["storage"]["total"]["exact"]
        ), (name, report["by_user"], usage["total"])
    assert any(
        c["account"] == f"user:{other}" and c["kind"] == "credit" and c["amount"]["exact"] == "3"
        for c in report["credits"]
    )


def test_the_enforcers_actions_are_counted(mhub, billing, muser) -> None:
    """Issue 24 ("enforcer actions", "balances below a threshold"): a GPU server whose balance
    runs low is moved to no-GPU mode, then stopped at zero; each is counted once by action, the
    enforcer's last run is recent, and the user is counted below 0 and 10."""
    before = scrape(billing)["gpulab_billing_enforcer_actions_total"]
    billing.credit(muser, "-9.95")  # pays the A100's 1-minute minimum, not its 90 s margin
    mhub.spawn_ready(muser, {"gpu": "a100-80g"})
    api = mhub.user_url(muser, "api")
    r = requests.post(
        f"{api}/kernels", json={}, headers={"Authorization": f"token {mhub.token}"}, timeout=60
    )
    assert r.status_code == 201, r.text

    def moved():
        s = mhub.server(muser)
        return s and s["ready"] and s["state"].get("options", {}).get("gpu") == "none"

    wait_for(moved, 60, 0.5, "the server to move to no-GPU mode")

    def counted(action: str, n: int):
        def check():
            got = scrape(billing)["gpulab_billing_enforcer_actions_total"]
            return got if got[(("action", action),)] == before[(("action", action),)] + n else None

        return check

    wait_for(counted("no_gpu", 1), 30, 0.5, "the move to be counted")
    with mhub.kernel(muser) as k:
        k.execute("z = 3")
        balance = Decimal(billing.balance(muser)["balance"]["exact"])
        billing.credit(muser, str(-balance - Decimal("0.01")))
        wait_for(lambda: mhub.server(muser) is None, 60, 0.5, "the server to stop")
    found = wait_for(counted("stop", 1), 30, 0.5, "the stop to be counted")
    assert found[(("action", "failed"),)] == before[(("action", "failed"),)]
    assert found[(("action", "no_gpu"),)] == before[(("action", "no_gpu"),)] + 1
    metrics = scrape(billing)
    last_run = metrics["gpulab_billing_enforcer_last_run_timestamp_seconds"][()]
    assert time.time() - 10 < last_run <= time.time() + 1
    overview = billing.get("api/v1/admin/overview", params={"from": "2000-01-01"}).json()
    mine = next(Decimal(u["balance"]["exact"]) for u in overview["users"] if u["user"] == muser)
    assert mine < 0
    below = metrics["gpulab_billing_balances_below"]
    for threshold in ("0", "10"):
        n = sum(Decimal(u["balance"]["exact"]) < Decimal(threshold) for u in overview["users"])
        assert below[(("threshold", threshold),)] == n >= 1


def test_the_navbar_links_billing_on_the_hubs_own_origin(mhub) -> None:
    """Attack wave (issue 24): the hub's Services menu linked billing as
    ``//localhost/services/billing/`` (JupyterHub drops the port of the hub's host), sending a
    click to whatever listens on port 80. The link is a path on the hub's own origin."""
    page = admin_web(mhub).get("/hub/home")
    assert page.status_code == 200
    hrefs = re.findall(r'href="([^"]*services/billing[^"]*)"', page.text)
    assert hrefs, "no link to billing in the navbar"
    assert all(h.startswith("/services/billing/") for h in hrefs), hrefs
