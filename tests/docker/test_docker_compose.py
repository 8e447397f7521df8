"""docker-compose.yml validates, wires the hub to its proxy, database and billing service, and
refuses to run without its secrets."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import yaml
from conftest import require
from harness import REPO

SECRETS = {
    "POSTGRES_SUPERUSER_PASSWORD": "pg-superuser-secret-for-test",
    "GPULAB_HUB_DB_PASSWORD": "pg-secret-for-test",
    "GPULAB_BILLING_DB_PASSWORD": "pg-billing-secret-for-test",
    "CONFIGPROXY_AUTH_TOKEN": "proxy-token",
    "GPULAB_BILLING_API_TOKEN": "billing-token-for-test",
    # Not a secret, but required like one: the Docker socket's group, for the hub.
    "DOCKER_GID": "4242",
}


def compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    require(exe is not None, "docker-compose (Debian package docker-compose)")
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        [exe, "-f", str(REPO / "docker-compose.yml"), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_compose_file_validates_and_wires_the_platform() -> None:
    out = compose("config", env=SECRETS)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert set(cfg["services"]) == {"hub", "proxy", "postgres", "billing"}
    hub = cfg["services"]["hub"]["environment"]
    assert hub["GPULAB_SPAWNER"] == "docker"
    assert hub["GPULAB_DB_URL"].endswith("@postgres:5432/jupyterhub")
    assert "pg-secret-for-test" in hub["GPULAB_DB_URL"]
    # hub and proxy share the token; user containers join the named network the hub uses
    proxy = cfg["services"]["proxy"]
    assert hub["CONFIGPROXY_AUTH_TOKEN"] == proxy["environment"]["CONFIGPROXY_AUTH_TOKEN"]
    assert hub["GPULAB_PROXY_API_URL"] == "http://proxy-api:8001"
    assert cfg["networks"]["users"]["name"] == hub["GPULAB_DOCKER_NETWORK"]
    assert {"gpulab-data", "gpulab-spot", "gpulab-postgres"} <= set(cfg["volumes"])
    # the Docker socket goes to the hub only
    for name, svc in cfg["services"].items():
        mounts = " ".join(str(v) for v in svc.get("volumes", []))
        assert ("docker.sock" in mounts) == (name == "hub"), name


def test_ssh_is_off_in_the_containerised_hub() -> None:
    """Issue 25 (SSH): the gateway is off in docker-compose, said so, not half on. Under
    `gpulab up`'s default (8022) it started inside the hub's container, its port unpublished and
    its `docker exec` with no docker CLI: `ssh -p 8022 NAME@host` was refused with no word why."""
    out = compose("config", env=SECRETS)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["services"]["hub"]["environment"]["GPULAB_SSH_PORT"] == "0"
    published = [p for svc in cfg["services"].values() for p in svc.get("ports", [])]
    assert all(str(p.get("target")) != "8022" for p in published), published


def mounts(svc: dict) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only) of a service's volumes (short syntax, as written)."""
    found = {}
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            found[v["target"]] = (v.get("source", ""), bool(v.get("read_only")))
        else:
            src, target, *mode = str(v).split(":")
            found[target] = (src, mode == ["ro"])
    return found


def test_compose_runs_billing_as_an_external_service() -> None:
    out = compose("config", env=SECRETS)
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    hub, billing = cfg["services"]["hub"], cfg["services"]["billing"]
    henv, benv = hub["environment"], billing["environment"]
    # The billing image is the hub's, running the service instead of the hub.
    assert billing["image"] == hub["image"]
    assert billing["build"]["dockerfile"] == hub["build"]["dockerfile"]
    assert billing["command"][-2:] == ["-m", "gpulab.billing_service"]
    # Its own PostgreSQL database and role (created by initdb.sql: tests/docker).
    assert benv["GPULAB_BILLING_DB_URL"] == (
        "postgresql://gpulab_billing:pg-billing-secret-for-test@postgres:5432/billing"
    )
    assert "CREATE DATABASE billing OWNER" in (REPO / "images/compose/initdb.sql").read_text()
    assert "postgres" in billing["depends_on"]
    # One shared secret: the hub registers the service with the token the service holds.
    assert henv["GPULAB_BILLING_API_TOKEN"] == "billing-token-for-test"
    assert benv["JUPYTERHUB_API_TOKEN"] == henv["GPULAB_BILLING_API_TOKEN"]
    # The hub and its proxy reach the service by name on the internal network, where it
    # listens; it reaches the hub's API there. Servers go through the proxy (tests/docker).
    port = benv["JUPYTERHUB_SERVICE_URL"].rsplit(":", 1)[1]
    assert benv["JUPYTERHUB_SERVICE_URL"] == f"http://0.0.0.0:{port}"
    assert henv["GPULAB_BILLING_EXTERNAL_URL"] == f"http://billing:{port}"
    assert "internal" in billing["networks"] and "internal" in hub["networks"]
    assert benv["JUPYTERHUB_API_URL"] == f"http://{henv['GPULAB_HUB_CONNECT_IP']}:8081/hub/api"
    # The OAuth client JupyterHub registers for a service named billing, at its proxy prefix.
    assert benv["JUPYTERHUB_SERVICE_NAME"] == "billing"
    assert benv["JUPYTERHUB_CLIENT_ID"] == "service-billing"
    assert benv["JUPYTERHUB_SERVICE_PREFIX"] == "/services/billing/"
    assert benv["JUPYTERHUB_OAUTH_CALLBACK_URL"] == "/services/billing/oauth_callback"
    assert henv["GPULAB_BILLING_MIN_MINUTES"] == benv["GPULAB_BILLING_MIN_MINUTES"]
    # The spot price history: written by the hub in its data dir, read-only for billing, which
    # sees nothing else of the hub's data dir (its secrets).
    hub_mounts, billing_mounts = mounts(hub), mounts(billing)
    # The hub's data dir: set in its image.
    dockerfile = (REPO / "images/hub/Dockerfile").read_text()
    data = henv.get("GPULAB_DATA_DIR") or re.search(r"GPULAB_DATA_DIR=(\S+)", dockerfile)[1]
    assert hub_mounts[data][0] == "gpulab-data" and not hub_mounts[data][1]
    assert hub_mounts[f"{data}/spot"] == ("gpulab-spot", False)
    assert benv["GPULAB_HUB_DATA_DIR"] == data
    assert billing_mounts[f"{data}/spot"] == ("gpulab-spot", True)
    assert data not in billing_mounts
    assert benv["GPULAB_DATA_DIR"] != data
    # No Docker socket for billing (it stops servers through the hub's API).
    assert not any("docker.sock" in str(v) for v in billing.get("volumes", []))


def test_compose_refuses_to_run_without_secrets() -> None:
    out = compose("config", "-q", env={})
    assert out.returncode != 0
    assert any(name in out.stderr for name in SECRETS), out.stderr
    # Every secret on its own, billing's token included.
    for missing in SECRETS:
        out = compose("config", "-q", env={k: v for k, v in SECRETS.items() if k != missing})
        assert out.returncode != 0 and missing in out.stderr, (missing, out.stderr)
