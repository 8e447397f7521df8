"""Billing as an external service (its docker-compose container): not started by the hub.

The service runs as its own process with the environment docker-compose.yml gives its container
(only addresses, secrets and directories are this machine's), on a real PostgreSQL database; a
real hub registers it by URL and shared token. A user signs up, runs a real kernel on a GPU
server and reads the charge through the hub's proxy and the statement page's OAuth; killing the
hub leaves billing running, and the restarted hub uses it again.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import requests
import yaml
from billing.client import Billing, kernel_seconds
from billing.fixtures import pg_cluster, pg_url  # noqa: F401 (fixtures)
from harness import (
    FAST_BILLING_ENV,
    HB,
    PASSWORD,
    REPO,
    Hub,
    WebSession,
    approved_user,
    free_port,
    wait_for,
)
from traitlets.config import Config

A100_PER_S = Decimal("2.10") / 3600


def compose_billing() -> dict:
    """The billing service as docker-compose.yml declares it (before ${…} interpolation)."""
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["billing"]


class ExternalBilling:
    """The billing service run on its own, as its container runs it."""

    def __init__(self, base: Path, hub: Hub, db_url: str, token: str) -> None:
        self.dir = base / "billing"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "billing.log"
        spec = compose_billing()
        env = dict(spec["environment"])
        # What differs from the container: this machine's addresses, secrets and directories.
        here = {
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.hub_port}/hub/api",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{self.port}",
            "JUPYTERHUB_API_TOKEN": token,
            "GPULAB_BILLING_DB_URL": db_url,
            "GPULAB_DATA_DIR": str(self.dir),
            "GPULAB_HUB_DATA_DIR": str(hub.data_dir),
            "GPULAB_BILLING_MIN_MINUTES": "1",
        }
        assert set(here) <= set(env), set(here) - set(env)
        env.update(here)
        inherited = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "JUPYTERHUB_"))
        }
        self.env = {**inherited, **env}
        python, *args = spec["command"]
        assert python == "python"
        self.cmd = [
            sys.executable,
            *args,
            f"--BillingService.heartbeat_interval={HB}",
            "--BillingService.enforce_interval=1",
        ]
        self.pid: int | None = None

    def start(self) -> ExternalBilling:
        self.dir.mkdir(parents=True, exist_ok=True)
        # Started by a process that goes away once it is up (a shell, `nohup … &`, a daemonizing
        # supervisor): the service must outlive its parent, which is not the hub.
        parent = subprocess.Popen(
            [
                "sh",
                "-c",
                '"$@" </dev/null >>"$LOG" 2>&1 & echo $!; exec sleep 600',
                "sh",
                *self.cmd,
            ],
            env={**self.env, "LOG": str(self.log_path)},
            stdout=subprocess.PIPE,
            cwd=self.dir,
            start_new_session=True,
        )
        try:
            self.pid = int(parent.stdout.readline())
            wait_for(self.listening, 60, 0.2, "billing to listen")
        finally:
            parent.kill()
            parent.wait(10)
        return self

    def alive(self) -> bool:
        """Running (not a zombie): the process, not only its pid."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except FileNotFoundError:
            return False
        return "\nState:\tZ" not in status

    def listening(self) -> bool:
        if not self.alive():
            raise RuntimeError(f"billing exited:\n{self.log_tail()}")
        try:
            requests.get(f"{self.url}/services/billing/api/v1/", timeout=2)
            return True
        except requests.ConnectionError:
            return False

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.pid and self.alive():
            os.kill(self.pid, 15)
            wait_for(lambda: not self.alive(), 30, 0.2, "billing to stop")


@pytest.fixture(scope="module")
def ext(module_hub_factory, pg_cluster):  # noqa: F811 (fixture)
    db_url = pg_cluster.create_database(f"ext{uuid.uuid4().hex[:8]}")
    token = secrets.token_hex(32)
    billing: ExternalBilling | None = None

    def stop_billing(_: Hub) -> None:
        if billing is not None:
            billing.stop()

    # Started below, once the external service it is told about is listening.
    hub = module_hub_factory(
        "billing-ext",
        start=False,
        on_stop=stop_billing,
        simulate="A100-80G:1,RTX-4090:1",
        env={"GPULAB_BILLING_API_TOKEN": token, **FAST_BILLING_ENV},
    )
    hub.data_dir.mkdir(parents=True)
    billing = ExternalBilling(hub.data_dir.parent, hub, db_url, token)
    hub.extra_env["GPULAB_BILLING_EXTERNAL_URL"] = billing.url
    billing.start()
    hub.start()
    client = Billing(hub)
    wait_for(lambda: billing.listening() and client.up(), 30, 0.2, "billing via the proxy")
    return hub, billing, db_url


def test_hub_registers_billing_without_starting_it(ext) -> None:
    hub, billing, _ = ext
    # Its parent died right after it started listening: it keeps running.
    assert billing.alive() and billing.listening()
    r = hub.api("GET", "/services/billing")
    assert r.status_code == 200, r.text
    model = r.json()
    assert model["url"] == billing.url and model["prefix"] == "/services/billing/"
    assert model["command"] == [] and model["pid"] == 0
    # Nothing of the managed service in the hub's data dir; the service's own pid file is ours.
    assert not (hub.data_dir / "billing.pid").exists()
    assert not (hub.data_dir / "billing-api-token").exists()
    assert int((billing.dir / "billing.pid").read_text()) == billing.pid


def test_user_runs_a_kernel_and_reads_the_charge(ext) -> None:
    hub, billing, db_url = ext
    client = Billing(hub)
    name, password = approved_user(hub, "ext"), PASSWORD
    web = WebSession(hub)
    assert web.login(name, password)

    hub.spawn_ready(name, {"gpu": "a100-80g"})
    with hub.kernel(name) as k:
        # The server's reporter posts straight to the service, not through the hub.
        url = k.execute("import os; print(os.environ['GPULAB_BILLING_URL'])").strip()
        assert url == f"{billing.url}/services/billing/"
        t0 = time.time()
        k.execute("import time; time.sleep(5)")
    t_closed = time.time()
    hub.stop_server(name)

    def settled():
        usage = client.usage(name)
        servers = usage["servers"]
        return usage if servers and servers[0]["stopped"] and servers[0]["kernels"] else None

    usage = wait_for(settled, 30, 0.5, "the stopped server in the statement")
    (server,) = usage["servers"]
    assert server["mode"] == "A100-80G x1" and server["pricing"] == "on-demand", server
    secs = kernel_seconds(usage)[k.id]
    assert 5 <= secs <= t_closed - t0 + 3 + HB, (secs, t_closed - t0)
    charge = Decimal(server["amount"]["exact"])
    expected = Decimal(str(server["billed_seconds"])) * A100_PER_S
    assert charge > 0 and abs(charge - expected) <= Decimal("0.000001")
    balance = Decimal(10) - charge
    assert client.balance(name)["balance"]["exact"] == str(balance.normalize())

    # It is all in the service's PostgreSQL database (no SQLite file anywhere).
    with psycopg.connect(db_url) as conn:
        (stored,) = conn.execute(
            'SELECT balance_micro FROM accounts WHERE "user" = %s', (name,)
        ).fetchone()
    assert Decimal(stored) / 1_000_000 == balance
    assert not list(hub.data_dir.glob("billing.sqlite*"))
    assert not list(billing.dir.glob("billing.sqlite*"))

    # The statement page, through the proxy with the hub's OAuth on the way, as in a browser.
    page = web.get("/services/billing/")
    assert page.status_code == 200, page.text[-2000:]
    assert any("/hub/api/oauth2/authorize" in h.url for h in page.history)
    assert f'Billing statement: <span id="user">{name}</span>' in page.text
    assert server["amount"]["display"] in page.text
    assert f"CNY {balance.quantize(Decimal('0.01'))}" in page.text
    assert web.get("/services/billing/?user=admin").status_code == 403
    csv = web.get("/services/billing/statement.csv").text
    assert k.id in csv and server["amount"]["exact"] in csv


def test_spot_time_is_rated_from_the_hubs_price_history(ext) -> None:
    """The service reads the hub's spot price history from the hub's data dir (in
    docker-compose a read-only volume), not from its own."""
    hub, billing, _ = ext
    client = Billing(hub)
    name = hub.create_user()
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.35"})
    assert r.status_code == 200, r.text
    assert (hub.data_dir / "spot" / "spot-prices.jsonl").exists()
    assert not (billing.dir / "spot").exists()
    hub.spawn_ready(name, {"gpu": "rtx-4090", "pricing": "spot", "max_price": 1})
    with hub.kernel(name) as k:
        k.execute("import time; time.sleep(3)")
    hub.stop_server(name)

    def settled():
        servers = client.usage(name)["servers"]
        return servers[0] if servers and servers[0]["stopped"] and servers[0]["kernels"] else None

    server = wait_for(settled, 30, 0.5, "the stopped spot server in the statement")
    assert server["pricing"] == "spot" and server["billed_seconds"] >= 3
    assert server["spot"]["seconds_without_spot_price"] == 0
    # Rated at the spot price in force (0.35), not at on-demand (0.68, for unknown history).
    assert {(r["price_per_card_hour"], r["spot_price_recorded"]) for r in server["rates"]} == {
        ("0.35", True)
    }
    expected = Decimal(str(server["billed_seconds"])) * Decimal("0.35") / 3600
    assert abs(Decimal(server["amount"]["exact"]) - expected) <= Decimal("0.000001")


def test_start_refused_when_balance_cannot_pay(ext) -> None:
    """The hub's pre-start check asks the external service."""
    hub, _, _ = ext
    client = Billing(hub)
    name = hub.create_user()
    client.credit(name, "-9.99")
    r = hub.spawn(name, {"gpu": "a100-80g"})
    assert r.status_code == 402, r.text
    assert "Your balance (CNY 0.01) cannot pay for 1 minutes of A100-80G x1" in r.json()["message"]
    assert hub.server(name) is None and hub.free("a100-80g") == 1
    assert client.balance(name)["balance"]["exact"] == "0.01"


def test_killing_the_hub_leaves_billing_running(ext) -> None:
    hub, billing, _ = ext
    client = Billing(hub)
    name = hub.create_user()
    before = client.balance(name)["balance"]["exact"]
    hub.kill()
    try:
        # Several of its parent-watch periods (1 s) after the hub died, it still runs and listens.
        time.sleep(4)
        assert billing.alive() and billing.listening(), billing.log_tail()
        assert "is gone; stopping" not in billing.log_tail(200)
    finally:
        hub.start()
    # The restarted hub uses the same service (same process), with what it had stored.
    wait_for(client.up, 30, 0.2, "billing through the restarted hub")
    assert int((billing.dir / "billing.pid").read_text()) == billing.pid and billing.alive()
    assert client.balance(name)["balance"]["exact"] == before


def test_hub_refuses_external_billing_without_a_valid_url_and_token(monkeypatch) -> None:
    from gpulab.hub_config.billing.hooks import configure_billing

    monkeypatch.setenv("GPULAB_BILLING_EXTERNAL_URL", "http://billing:10101")
    monkeypatch.delenv("GPULAB_BILLING_API_TOKEN", raising=False)
    c = Config()
    with pytest.raises(ValueError, match="GPULAB_BILLING_API_TOKEN: required"):
        configure_billing(c, "/nonexistent", "", [{"name": "user", "scopes": []}])
    monkeypatch.setenv("GPULAB_BILLING_API_TOKEN", "x" * 32)
    monkeypatch.setenv("GPULAB_BILLING_EXTERNAL_URL", "http://billing:10101/services/billing/")
    with pytest.raises(ValueError, match=r"GPULAB_BILLING_EXTERNAL_URL: .*no path"):
        configure_billing(c, "/nonexistent", "", [{"name": "user", "scopes": []}])
    assert "services" not in c.JupyterHub and "pre_allocate_hook" not in c.Spawner


def test_service_refuses_to_start_without_the_hub_service_env(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "JUPYTERHUB_"))}
    env.update(
        {
            "GPULAB_DATA_DIR": str(tmp_path),
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{free_port()}",
            "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api",
        }
    )
    out = subprocess.run(
        [sys.executable, "-m", "gpulab.billing_service"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "missing environment: JUPYTERHUB_API_TOKEN, JUPYTERHUB_CLIENT_ID" in out.stderr
    assert not (tmp_path / "billing.sqlite").exists()
