"""A real Prometheus (Debian's binary) with gpulab's shipped alert rules, scraping a real hub and
its billing service with the token of GPULAB_PROMETHEUS_TOKEN, fires the alerts an operator
needs (issue 24: "a real Prometheus loads the rules and fires the pool-exhausted and billing-down
alerts in a test").

The rules are monitoring/rules/gpulab.rules.yml with only their ``for:`` shortened (the shipped
expressions are what is evaluated); the scrape config is monitoring/prometheus.yml with the
test's targets, token file and 1-second intervals. Prometheus runs in the test's own temp dir on
a free loopback port and is stopped (its whole process group) at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from conftest import require
from harness import REPO, Hub, free_port, wait_for

RULES = REPO / "monitoring" / "rules" / "gpulab.rules.yml"
CONFIG = REPO / "monitoring" / "prometheus.yml"
DASHBOARD = REPO / "monitoring" / "grafana" / "dashboards" / "gpulab.json"
# The only card: taking it exhausts the pool of its type.
CARD = "A100-80G"


class Prometheus:
    """``prometheus`` on 127.0.0.1:PORT with the shipped config and rules, rewritten for a test:
    targets, token file, intervals, and every ``for:`` set to ``for_``."""

    def __init__(self, root: Path, targets: dict[str, str], token: str, for_: str = "2s"):
        exe = shutil.which("prometheus")
        require(exe is not None, "prometheus (Debian package prometheus)")
        self.exe = exe
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (root / "rules").mkdir(parents=True)
        rules, n = re.subn(r"(?m)^(\s+for:)\s*\S+$", rf"\1 {for_}", RULES.read_text())
        assert n == len(re.findall(r"(?m)^\s+- alert:", rules)), "every alert has a for:"
        (root / "rules" / RULES.name).write_text(rules)
        token_file = root / "token"
        token_file.write_text(token)
        token_file.chmod(0o600)
        cfg = yaml.safe_load(CONFIG.read_text())
        cfg["global"] = {
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "evaluation_interval": "1s",
        }
        for job in cfg["scrape_configs"]:
            job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
            assert job["authorization"]["type"] == "Bearer"
            job["authorization"]["credentials_file"] = str(token_file)
        (root / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.proc: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        log = open(self.root / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [
                self.exe,
                f"--config.file={self.root / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
        )
        log.close()
        wait_for(self.ready, 60, 0.2, "Prometheus to be ready")
        return self

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log()
        try:
            return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def log(self) -> str:
        return (self.root / "prometheus.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def get(self, path: str, **params) -> dict:
        r = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]

    def health(self) -> dict[str, tuple[str, str]]:
        """Job -> (health, last error) of its target."""
        return {
            t["labels"]["job"]: (t["health"], t["lastError"])
            for t in self.get("targets")["activeTargets"]
        }

    def query(self, expr: str) -> dict[str, float]:
        """An instant query: each series' labels (as a sorted tuple string) -> value."""
        return {
            ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items())): float(s["value"][1])
            for s in self.get("query", query=expr)["result"]
        }

    def alerts(self, name: str, state: str = "firing") -> list[dict]:
        return [
            a["labels"]
            for a in self.get("alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == state
        ]


def dashboard_queries(prom: Prometheus) -> set[str]:
    """Run every panel's queries of monitoring/grafana/dashboards/gpulab.json (variables set to
    "all", rate windows to 1m); a query Prometheus refuses fails. Returns the titles of panels
    with no data."""
    dash = json.loads(DASHBOARD.read_text())
    empty = set()
    for panel in dash["panels"]:
        results = []
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m")
            expr = expr.replace("$type", ".*").replace("$node", ".*")
            r = requests.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=10)
            assert r.status_code == 200, (panel["title"], expr, r.text)
            results += r.json()["data"]["result"]
        if panel["type"] != "row" and not results:
            empty.add(panel["title"])
    return empty


@pytest.fixture
def prometheus_for(tmp_path):
    started: list[Prometheus] = []

    def make(hub: Hub, token: str) -> Prometheus:
        host = f"localhost:{hub.port}"
        root = tmp_path / f"prometheus-{len(started)}"
        p = Prometheus(root, {"gpulab-hub": host, "gpulab-billing": host}, token)
        started.append(p)
        return p.start()

    yield make
    for p in started:
        p.stop()


def test_a_real_prometheus_fires_pool_exhausted_and_billing_down(
    hub_factory, prometheus_for
) -> None:
    """Issue 24, alert rules evaluated by a real Prometheus scraping a real hub: with the
    scrape token (GPULAB_PROMETHEUS_TOKEN, read:metrics) both the hub's /hub/metrics and
    billing's /services/billing/metrics are up; the pool's cards match the hub's pool API and
    the gauges the other rules read (disk, observer lag, billing lag, enforcer's last run, a held
    card's DCGM utilisation and idle seconds with its holder) are there under the rules' names;
    taking the only card of a type fires GpulabPoolExhausted for that type (and stopping the
    server clears it); every query of the Grafana dashboard is valid here, its pool and card
    panels with data; billing not answering its scrape fires GpulabBillingDown."""
    token = uuid.uuid4().hex
    hub = hub_factory("prom", simulate=f"{CARD}:1", env={"GPULAB_PROMETHEUS_TOKEN": token})
    prom = prometheus_for(hub, token)

    # Both endpoints answer Prometheus with the token (a 403 or a missing family would be "down").
    try:
        wait_for(lambda: set(prom.health().values()) == {("up", "")}, 60, 0.5, "the scrapes")
    except TimeoutError:
        raise AssertionError(f"targets not up: {prom.health()}") from None
    # The metrics' card types are the pool API's (slugs); this hub has one card, of one type.
    pool = {t["slug"]: t for t in hub.pool()["gpu_types"]}
    (card,) = [slug for slug, t in pool.items() if t["total"] > 0]
    free = f'sum by (type) (gpulab_pool_cards{{type="{card}",state="free"}})'
    wait_for(lambda: prom.query(free) == {f"type={card}": 1.0}, 30, 0.5, "the free card")
    total = prom.query("sum by (type) (gpulab_pool_cards)")
    assert {k.removeprefix("type="): v for k, v in total.items() if v} == {card: 1.0}
    assert set(k.removeprefix("type=") for k in total) <= set(pool)
    # The gauges the other rules read are there under the names the rules use.
    for family in (
        "gpulab_data_disk_bytes",
        "gpulab_observer_lag_seconds",
        "gpulab_billing_lag_seconds",
        "gpulab_billing_enforcer_last_run_timestamp_seconds",
    ):
        wait_for(lambda f=family: prom.query(f), 30, 0.5, f"{family} in Prometheus")
    # Nothing fires once both are scraped (before the first scrape, billing was "absent").
    quiet = ("GpulabPoolExhausted", "GpulabBillingDown", "GpulabHubDown")
    wait_for(
        lambda: not any(prom.alerts(a, s) for a in quiet for s in ("firing", "pending")),
        30,
        0.5,
        "no alert while a card is free and billing answers",
    )

    # The only card taken: the pool of that type is exhausted, and the alert names the type.
    name = hub.create_user()
    hub.spawn_ready(name, {"gpu": card}, timeout=120)
    assert hub.free(card) == 0
    fired = wait_for(
        lambda: prom.alerts("GpulabPoolExhausted"), 60, 0.5, "GpulabPoolExhausted to fire"
    )
    assert [(a["type"], a["severity"]) for a in fired] == [(card, "page")]
    # The card's DCGM series and its idle time name the holder (the idle-card alert's labels).
    util = f'DCGM_FI_DEV_GPU_UTIL{{user="{name}",type="{card}"}}'
    wait_for(lambda: len(prom.query(util)) == 1, 60, 0.5, "the held card's utilisation")
    idle = f'gpulab_card_idle_seconds{{user="{name}",type="{card}"}}'
    wait_for(lambda: len(prom.query(idle)) == 1, 60, 0.5, "the held card's idle seconds")
    # Every query of the shipped Grafana dashboard is valid PromQL to this Prometheus, and the
    # pool's and cards' panels show this hub (Grafana cannot be installed here to draw them).
    empty = dashboard_queries(prom)
    assert not {"Cards by state", "GPU utilisation", "Held but idle cards"} & empty, empty
    hub.stop_server(name)
    wait_for(
        lambda: (
            not prom.alerts("GpulabPoolExhausted")
            and not prom.alerts("GpulabPoolExhausted", "pending")
        ),
        60,
        0.5,
        "GpulabPoolExhausted to clear",
    )

    # Billing stops answering (frozen: the hub would restart a killed one at once).
    pid = int((hub.data_dir / "billing.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        down = wait_for(
            lambda: prom.alerts("GpulabBillingDown"), 60, 0.5, "GpulabBillingDown to fire"
        )
        assert [(a["job"], a["severity"]) for a in down] == [("gpulab-billing", "page")]
        assert prom.health()["gpulab-hub"] == ("up", "")
    finally:
        os.kill(pid, signal.SIGCONT)
