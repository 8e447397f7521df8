"""docker-compose.yml validates, wires the hub to its proxy and database, and refuses to run
without its secrets."""

from __future__ import annotations

import os
import shutil
import subprocess

import yaml
from conftest import require
from harness import REPO

SECRETS = {"POSTGRES_PASSWORD": "pg-secret-for-test", "CONFIGPROXY_AUTH_TOKEN": "proxy-token"}


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
    assert set(cfg["services"]) == {"hub", "proxy", "postgres"}
    hub = cfg["services"]["hub"]["environment"]
    assert hub["GPULAB_SPAWNER"] == "docker"
    assert hub["GPULAB_DB_URL"].endswith("@postgres:5432/jupyterhub")
    assert "pg-secret-for-test" in hub["GPULAB_DB_URL"]
    # hub and proxy share the token; user containers join the named network the hub uses
    proxy = cfg["services"]["proxy"]
    assert hub["CONFIGPROXY_AUTH_TOKEN"] == proxy["environment"]["CONFIGPROXY_AUTH_TOKEN"]
    assert hub["GPULAB_PROXY_API_URL"] == "http://proxy:8001"
    assert cfg["networks"]["gpulab"]["name"] == hub["GPULAB_DOCKER_NETWORK"]
    assert {"gpulab-data", "gpulab-postgres"} <= set(cfg["volumes"])
    # the Docker socket goes to the hub only
    for name, svc in cfg["services"].items():
        mounts = " ".join(str(v) for v in svc.get("volumes", []))
        assert ("docker.sock" in mounts) == (name == "hub"), name


def test_compose_refuses_to_run_without_secrets() -> None:
    out = compose("config", "-q", env={})
    assert out.returncode != 0
    assert "POSTGRES_PASSWORD" in out.stderr or "CONFIGPROXY_AUTH_TOKEN" in out.stderr
