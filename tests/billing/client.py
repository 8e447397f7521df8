"""Talk to the billing service of a test hub, through the public proxy like any client."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import requests
from harness import Hub, wait_for


class Billing:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.base = f"{hub.url}/services/billing/"

    def get(self, path: str, token: str | None = None, **kw) -> requests.Response:
        return requests.get(
            self.base + path,
            headers={"Authorization": f"token {token or self.hub.token}"},
            timeout=30,
            **kw,
        )

    def post(self, path: str, body, token: str | None = None) -> requests.Response:
        return requests.post(
            self.base + path,
            headers={"Authorization": f"token {token or self.hub.token}"},
            json=body,
            timeout=30,
        )

    def usage(self, user: str, token: str | None = None) -> dict:
        r = self.get(f"api/v1/users/{user}/usage", token, params={"from": "2000-01-01"})
        assert r.status_code == 200, r.text
        return r.json()

    def balance(self, user: str, token: str | None = None) -> dict:
        r = self.get(f"api/v1/users/{user}/balance", token)
        assert r.status_code == 200, r.text
        return r.json()

    def credit(self, user: str, amount: str, kind: str = "adjustment", key: str | None = None):
        key = key or f"{user}-{time.time_ns()}"
        r = self.post(
            f"api/v1/users/{user}/credits", {"amount": amount, "kind": kind, "idempotency_key": key}
        )
        assert r.status_code in (200, 201), r.text
        return r.json()

    # ---- the service process -----------------------------------------------------------------

    @property
    def pid(self) -> int:
        return int((self.hub.data_dir / "billing.pid").read_text())

    def up(self) -> bool:
        try:
            return self.get("api/v1/users/admin/balance").status_code == 200
        except requests.RequestException:
            return False

    def kill(self) -> int:
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_restarted(self, old_pid: int, timeout: float = 90) -> None:
        wait_for(lambda: self.pid != old_pid and self.up(), timeout, 0.5, "billing to be restarted")

    def db(self) -> sqlite3.Connection:
        path = Path(self.hub.data_dir) / "billing.sqlite"
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)


def user_token(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"note": "billing test"})
    assert r.status_code in (200, 201), r.text
    return r.json()["token"]


def kernel_seconds(usage: dict) -> dict[str, float]:
    return {k["kernel_id"]: k["kernel_seconds"] for s in usage["servers"] for k in s["kernels"]}


def assert_billed_for_the_life_seen(
    billed: float, t0: float, t1: float, t2: float, t3: float, sampled: float = 0.0
) -> None:
    """``billed`` seconds of something the test started between ``t0`` and ``t1`` (its start
    call) and stopped between ``t2`` and ``t3`` (its stop call) lie between the life the test
    saw for certain (``t2 - t1``) and the most it can have had (``t3 - t0``), to a tenth of a
    second; ``sampled``: how much later an observed span may end or earlier begin (the hub's
    sampling). Exact whatever the machine's load, where a midpoint within 1 s failed on a busy
    machine whose start calls alone took seconds."""
    least, most = t2 - t1, t3 - t0
    assert least - 0.1 <= billed <= most + 0.1 + sampled, (
        f"billed {billed:.2f} s; alive for certain {least:.2f} s, at most {most:.2f} s"
    )
