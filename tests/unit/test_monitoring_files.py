"""monitoring/ (issue 24: alert rules, Prometheus, Grafana) is what an operator runs as shipped.

Read by the real tools where they run here: ``promtool check rules`` / ``promtool test rules``
(Debian's prometheus: every alert on synthetic series, firing and silent where it should) and
``promtool check config`` on the scrape config; the compose and Swarm overlays through
``docker-compose config`` and ``docker stack config`` (the images cannot be pulled here, so
Prometheus and Grafana are not run from them: tests/e2e/test_prometheus_alerts.py runs the real
Prometheus binary against a real hub). The rules and the dashboard name only metric families
of the contract (a typo is a panel or an alert that never shows anything).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import require
from harness import REPO

MONITORING = REPO / "monitoring"
RULES = MONITORING / "rules" / "gpulab.rules.yml"
RULES_TESTS = MONITORING / "rules" / "gpulab.rules.test.yml"
CONFIG = MONITORING / "prometheus.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "gpulab.json"
TOKEN_PATH = "/run/secrets/gpulab_prometheus_token"

# The families the hub (hub_config/metrics) and billing (billing_service/metrics.py) export (issue 24),
# JupyterHub's own that the rules and dashboard use, and Prometheus' `up`.
CONTRACT_FAMILIES = {
    "gpulab_pool_cards",
    "gpulab_pool_allocations",
    "gpulab_allocation_age_seconds",
    "gpulab_spawn_duration_seconds",
    "gpulab_spawn_refusals_total",
    "gpulab_spot_queue_length",
    "gpulab_spot_queue_oldest_wait_seconds",
    "gpulab_spot_queue_wait_seconds",
    "gpulab_spot_price",
    "gpulab_preemptions_total",
    "gpulab_checkpoints_total",
    "gpulab_observer_samples_total",
    "gpulab_observer_lag_seconds",
    "gpulab_observer_pass_seconds",
    "gpulab_holds",
    "gpulab_booking_servers",
    "gpulab_card_idle_seconds",
    "gpulab_data_disk_bytes",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "gpulab_billing_ingest_total",
    "gpulab_billing_ingest_latency_seconds",
    "gpulab_billing_lag_seconds",
    "gpulab_billing_revenue_total",
    "gpulab_billing_credits_total",
    "gpulab_billing_enforcer_actions_total",
    "gpulab_billing_enforcer_last_run_timestamp_seconds",
    "gpulab_billing_balances_below",
    "gpulab_billing_accounts",
}
HISTOGRAMS = {
    "gpulab_allocation_age_seconds",
    "gpulab_spawn_duration_seconds",
    "gpulab_spot_queue_wait_seconds",
    "gpulab_observer_pass_seconds",
    "gpulab_billing_ingest_latency_seconds",
    "jupyterhub_request_duration_seconds",
}
JUPYTERHUB_FAMILIES = {
    "jupyterhub_request_duration_seconds",
    "jupyterhub_running_servers",
    "jupyterhub_total_users",
    "jupyterhub_active_users",
}
# What each alert of the issue is called in the rules file.
ISSUE_ALERTS = {
    "GpulabPoolExhausted",
    "GpulabSpawnFailures",
    "GpulabSpawnsRateLimited",
    "GpulabHubThrottling",
    "GpulabBookedClassNotReady",
    "GpulabBillingDown",
    "GpulabBillingLagging",
    "GpulabEnforcerNotRunning",
    "GpulabCardHeldIdle",
    "GpulabDataDiskAlmostFull",
}
NAME = re.compile(r"\b((?:gpulab|jupyterhub)_[a-z_]+|DCGM_FI_[A-Z_]+)\b")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    require(exe is not None, "promtool (Debian package prometheus)")
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def families(expr: str) -> set[str]:
    """The metric families an expression reads (a histogram's _bucket/_count/_sum as itself)."""
    found = set()
    for name in NAME.findall(expr):
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        found.add(base if base in HISTOGRAMS else name)
    return found


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_accepts_the_rules_and_every_alert_fires_on_synthetic_series() -> None:
    """Issue 24, alert rules: `promtool check rules`, then `promtool test rules` on each alert
    (pool exhausted for a type, spawn failures, rate-limit refusals and JupyterHub's 429s, a
    booked class not ready, billing down / lagging, the enforcer not running, cards held idle,
    disk almost full): it fires with the labels and summary named, and stays silent before its
    `for:` and on the healthy series beside it."""
    out = promtool("check", "rules", str(RULES), cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    out = promtool("test", "rules", RULES_TESTS.name, cwd=RULES_TESTS.parent)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    # Every alert of the file has a test case (one that fires, with its annotations).
    tested = {
        case["alertname"]
        for t in yaml.safe_load(RULES_TESTS.read_text())["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {r["alert"] for r in rules()} == tested


def test_each_alert_waits_names_its_severity_and_reads_only_known_families() -> None:
    """Issue 24: each alert has `for:`, a severity and a summary; the issue's alerts are all
    there; no rule reads a family the hub or billing does not export."""
    alerts = {r["alert"]: r for r in rules()}
    assert ISSUE_ALERTS <= set(alerts)
    for name, rule in alerts.items():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        assert rule["labels"]["severity"] in {"page", "ticket"}, name
        assert rule["annotations"]["summary"].strip(), name
        read = families(rule["expr"])
        assert read <= CONTRACT_FAMILIES | JUPYTERHUB_FAMILIES, (name, read)
    # The two the issue says must be checked by a real Prometheus: on the contract's names.
    assert families(alerts["GpulabPoolExhausted"]["expr"]) == {"gpulab_pool_cards"}
    assert 'up{job="gpulab-billing"}' in alerts["GpulabBillingDown"]["expr"]


def test_the_scrape_config_passes_promtool_with_a_token_file(tmp_path) -> None:
    """Issue 24: the shipped scrape config loads (promtool check config reads its rule files
    and the token file too), scrapes both endpoints with the token of GPULAB_PROMETHEUS_TOKEN as
    a bearer credentials file, and the job names are the ones the rules read."""
    cfg = yaml.safe_load(CONFIG.read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"gpulab-hub", "gpulab-billing"}
    assert jobs["gpulab-hub"]["metrics_path"] == "/hub/metrics"
    assert jobs["gpulab-billing"]["metrics_path"] == "/services/billing/metrics"
    for job in jobs.values():
        assert job["authorization"] == {"type": "Bearer", "credentials_file": TOKEN_PATH}
    assert cfg["rule_files"] == ["rules/gpulab.rules.yml"]
    # promtool checks the credentials file exists: the test copy points at a real one.
    token = tmp_path / "token"
    token.write_text("a-token")
    (tmp_path / "rules").mkdir()
    shutil.copy(RULES, tmp_path / "rules" / RULES.name)
    (tmp_path / "prometheus.yml").write_text(CONFIG.read_text().replace(TOKEN_PATH, str(token)))
    out = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 rule files found" in out.stdout + out.stderr


def test_the_dashboard_has_the_rows_of_jupyterhubs_dashboards_and_dcgm_panels() -> None:
    """Issue 24, Grafana: rows for the pool, spawns, users, billing and cards; the card panels
    use DCGM exporter's names (NVIDIA's dashboards read the same series); every query reads
    known families through the data source variable; no two panels overlap."""
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == ["Pool", "Spawns", "Users", "Billing", "Cards (DCGM)"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["PROMETHEUS_DS"]["type"] == "datasource"
    read: set[str] = set()
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        mine = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not mine & cells, p["title"]
        assert g["x"] + g["w"] <= 24, p["title"]
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${PROMETHEUS_DS}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            read |= families(t["expr"])
    assert read <= CONTRACT_FAMILIES | JUPYTERHUB_FAMILIES, read - CONTRACT_FAMILIES
    dcgm = {n for n in CONTRACT_FAMILIES if n.startswith("DCGM_")} - {"DCGM_FI_DEV_FB_FREE"}
    assert dcgm <= read
    # Most of the contract's families are on it (those left off: the FB_FREE twin of FB_USED,
    # the spot queue's wait histogram, ingest's source-less twins).
    assert len(read & CONTRACT_FAMILIES) >= len(CONTRACT_FAMILIES) - 3, CONTRACT_FAMILIES - read
    # The provisioning files point at the dashboard's folder and at Prometheus.
    prov = MONITORING / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert [(d["type"], d["url"]) for d in ds] == [("prometheus", "http://prometheus:9090")]
    boards = yaml.safe_load((prov / "dashboards" / "gpulab.yml").read_text())["providers"]
    assert boards[0]["options"]["path"] == "/var/lib/grafana/dashboards"


# ---- the compose and Swarm overlays --------------------------------------------------------------

COMPOSE_ENV = {
    "POSTGRES_SUPERUSER_PASSWORD": "pg-superuser-secret-for-test",
    "GPULAB_HUB_DB_PASSWORD": "pg-hub-secret-for-test",
    "GPULAB_BILLING_DB_PASSWORD": "pg-billing-secret-for-test",
    "CONFIGPROXY_AUTH_TOKEN": "proxy-token-for-test",
    "GPULAB_BILLING_API_TOKEN": "billing-token-for-test",
    "DOCKER_GID": "4242",
    "GPULAB_PROMETHEUS_TOKEN": "prometheus-token-for-test",
    "GPULAB_PROMETHEUS_TOKEN_FILE": "/srv/prometheus-token",
    "GPULAB_GRAFANA_ADMIN_PASSWORD": "grafana-password-for-test",
}


def compose_config(*files: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    require(exe is not None, "docker-compose (Debian package docker-compose)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "POSTGRES_"))}
    args = [a for f in files for a in ("-f", str(REPO / f))]
    return subprocess.run(
        [exe, *args, "config"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )


def networks(svc: dict) -> set[str]:
    nets = svc.get("networks") or {}
    return set(nets)


def test_the_compose_overlay_adds_prometheus_and_grafana_away_from_user_containers() -> None:
    """Issue 24: Prometheus and Grafana in compose, provisioned from monitoring/: Prometheus on
    the internal network only (with Grafana's), reading the token from a secret file at the
    path the scrape config names, the hub given the same token; Grafana on no network of the
    platform; both published on 127.0.0.1 only. Without the overlay nothing changes."""
    base = compose_config("docker-compose.yml", env=COMPOSE_ENV)
    assert base.returncode == 0, base.stderr
    assert not {"prometheus", "grafana"} & set(yaml.safe_load(base.stdout)["services"])
    out = compose_config("docker-compose.yml", "monitoring/docker-compose.yml", env=COMPOSE_ENV)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    svc = cfg["services"]
    users = next(k for k, n in cfg["networks"].items() if (n or {}).get("name") == "gpulab-users")
    assert networks(svc["prometheus"]) == {"internal", "monitoring"}
    assert networks(svc["grafana"]) == {"monitoring"}
    assert users not in networks(svc["prometheus"]) | networks(svc["grafana"])
    assert not cfg["networks"]["monitoring"].get("internal")
    # The hub and billing are where the scrape config looks for them.
    targets = {
        j["job_name"]: j["static_configs"][0]["targets"][0]
        for j in yaml.safe_load(CONFIG.read_text())["scrape_configs"]
    }
    assert targets["gpulab-hub"] == f"{svc['hub']['environment']['GPULAB_HUB_CONNECT_IP']}:8081"
    billing_url = svc["billing"]["environment"]["JUPYTERHUB_SERVICE_URL"]
    assert targets["gpulab-billing"] == f"billing:{billing_url.rsplit(':', 1)[1]}"
    assert {"hub", "billing"} <= {
        s for s, spec in svc.items() if "internal" in networks(spec) and s != "prometheus"
    }
    # One token: the hub's setting, and Prometheus' secret file at credentials_file's path.
    assert svc["hub"]["environment"]["GPULAB_PROMETHEUS_TOKEN"] == "prometheus-token-for-test"
    secret = svc["prometheus"]["secrets"][0]
    name = secret["source"] if isinstance(secret, dict) else secret
    assert f"/run/secrets/{name}" == TOKEN_PATH
    assert cfg["secrets"][name]["file"] == "/srv/prometheus-token"
    # Nothing of the token in Prometheus' or Grafana's environment.
    for s in ("prometheus", "grafana"):
        assert "prometheus-token-for-test" not in json.dumps(svc[s])
    # The shipped files, mounted where the images read them.
    mounts = {
        target: src
        for spec in (svc["prometheus"], svc["grafana"])
        for src, target, *_ in (str(v).split(":") for v in spec["volumes"])
    }
    assert mounts["/etc/prometheus/prometheus.yml"] == str(CONFIG)
    assert mounts["/etc/prometheus/rules"] == str(RULES.parent)
    assert mounts["/etc/grafana/provisioning"] == str(MONITORING / "grafana" / "provisioning")
    assert mounts["/var/lib/grafana/dashboards"] == str(DASHBOARD.parent)
    for s in ("prometheus", "grafana"):
        for port in svc[s]["ports"]:
            assert str(port).startswith("127.0.0.1:"), (s, port)
    genv = svc["grafana"]["environment"]
    assert genv["GF_USERS_ALLOW_SIGN_UP"] == genv["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    # Each setting the overlay needs is asked for by name.
    for missing in ("GPULAB_PROMETHEUS_TOKEN", "GPULAB_PROMETHEUS_TOKEN_FILE"):
        env = {k: v for k, v in COMPOSE_ENV.items() if k != missing}
        out = compose_config("docker-compose.yml", "monitoring/docker-compose.yml", env=env)
        assert out.returncode != 0 and missing in out.stderr, (missing, out.stderr)


def stack_config(*files: str) -> dict:
    docker = shutil.which("docker")
    require(docker is not None, "the docker CLI (Debian package docker.io)")
    probe = subprocess.run([docker, "stack", "config", "--help"], capture_output=True, timeout=30)
    require(probe.returncode == 0, "`docker stack config` (docker CLI >= 20.10)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "DOCKER_"))}
    args = [a for f in files for a in ("-c", str(REPO / f))]
    out = subprocess.run(
        [docker, "stack", "config", *args],
        env={**clean, "DOCKER_GID": "4242", "GPULAB_HUB_NODE_IP": "10.0.0.1"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def canon(spec: dict, *leave_out: str) -> dict:
    """A service without ``leave_out``, its lists in one order (merging reorders them)."""
    return {
        k: sorted(v, key=json.dumps) if isinstance(v, list) else v
        for k, v in spec.items()
        if k not in leave_out
    }


def test_the_stack_overlay_keeps_the_hub_and_adds_monitoring_on_the_hub_node() -> None:
    """Issue 24, Swarm: the hub's command is the stack's own plus the Prometheus token from a
    Docker secret (never the environment); Prometheus and Grafana read theirs from secrets
    too, get the shipped files as configs, are pinned to the hub's node, and join no network
    the hub's edge or the servers' side has."""
    base, merged = (
        stack_config("docker-stack.yml"),
        stack_config("docker-stack.yml", "monitoring/docker-stack.yml"),
    )
    svc = merged["services"]
    assert set(svc) == set(base["services"]) | {"prometheus", "grafana"}
    for name in base["services"]:
        if name != "hub":
            assert canon(svc[name]) == canon(base["services"][name]), name
    old, new = base["services"]["hub"], svc["hub"]
    export = ' GPULAB_PROMETHEUS_TOKEN="$(cat /run/secrets/gpulab_prometheus_token)"'
    assert new["command"] == [old["command"][0].replace(" && exec", export + " && exec")]
    assert canon(new, "command", "secrets") == canon(old, "command", "secrets")
    added = {s["source"] for s in new["secrets"]} - {s["source"] for s in old["secrets"]}
    assert added == {"gpulab_prometheus_token"}
    for name in ("prometheus", "grafana"):
        spec = svc[name]
        assert spec["deploy"]["placement"] == base["services"]["hub"]["deploy"]["placement"]
        assert "edge" not in networks(spec), name
        for key, value in (spec.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN|SECRET", key):
                assert key.endswith("__FILE") and value.startswith("/run/secrets/"), key
        for c in spec.get("configs", []):
            assert Path(merged["configs"][c["source"]]["file"]).is_file(), c
    assert networks(svc["grafana"]) == {"monitoring"}
    assert networks(svc["prometheus"]) == {"internal", "monitoring"}
    assert {s["source"] for s in svc["prometheus"]["secrets"]} == {"gpulab_prometheus_token"}
    # Only Grafana is published (servers on GPU nodes reach the hub node): log-in only.
    assert not svc["prometheus"].get("ports")
    genv = svc["grafana"]["environment"]
    assert genv["GF_USERS_ALLOW_SIGN_UP"] == genv["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    prom_files = {
        c["target"]: merged["configs"][c["source"]]["file"] for c in svc["prometheus"]["configs"]
    }
    assert prom_files == {
        "/etc/prometheus/prometheus.yml": str(CONFIG),
        "/etc/prometheus/rules/gpulab.rules.yml": str(RULES),
    }
    assert all(s.get("external") for s in merged["secrets"].values())


@pytest.mark.parametrize("path", ["docker-compose.yml", "docker-stack.yml"])
def test_the_platform_files_point_at_their_monitoring_overlay(path: str) -> None:
    """Operators reading the stack files learn where Prometheus and Grafana are."""
    assert f"monitoring/{path}" in (REPO / path).read_text()
