"""The JupyterLab extension's server half (``/gpulab/api/...``) in real single-user servers.

Every call goes browser-style to the user's server through the real proxy; the server extension
calls the real hub with the server's own token.
"""

from __future__ import annotations

import importlib.util
import os
from decimal import Decimal

import pytest
import requests
from conftest import require
from harness import Hub

pytestmark = pytest.mark.usefixtures("labext_installed")


@pytest.fixture(scope="session")
def labext_installed() -> None:
    require(
        importlib.util.find_spec("jupyterlab_gpulab") is not None,
        "the jupyterlab_gpulab extension (make install)",
    )


def ext(hub: Hub, user: str, path: str, method: str = "GET", **kw) -> requests.Response:
    return requests.request(
        method,
        f"{hub.url}/user/{user}/gpulab/api/{path}",
        headers={"Authorization": f"token {hub.token}"},
        timeout=30,
        **kw,
    )


def test_status_describes_the_gpu_server(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "a100-80g", "gpus": 1, "datasets": ["sklearn-toy"]})
    r = ext(hub, user, "status")
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["gpulab"] is True
    assert status["user"] == user
    assert status["mode"] == "A100-80G x1 (simulated)"
    assert status["gpu_type"] == "a100-80g" and status["gpu_count"] == 1
    assert status["simulated"] is True
    assert Decimal(status["price_per_hour"]) == Decimal("2.10")
    assert status["currency"] == "CNY"
    assert status["datasets"] == ["sklearn-toy"]
    assert status["allocation_id"] == hub.server(user)["state"]["allocation"]["alloc_id"]
    # The session cost grows with the price: it is price x elapsed, never negative.
    cost = Decimal(status["session_cost"])
    assert Decimal(0) <= cost <= Decimal("2.10") * Decimal(status["elapsed_seconds"] + 1) / 3600

    gpus = ext(hub, user, "gpus").json()
    assert gpus["state"] == "simulated"
    assert [d["id"] for d in gpus["devices"]] == hub.server(user)["state"]["allocation"]["uuids"]


def test_no_gpu_server_says_so(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    status = ext(hub, user, "status").json()
    assert status["mode"] == "No GPU" and status["gpu_type"] == "none"
    assert Decimal(status["price_per_hour"]) == Decimal("0.09")
    assert ext(hub, user, "gpus").json()["state"] == "none"


def test_catalog_and_pool_come_from_the_hub_with_the_servers_token(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    catalog = ext(hub, user, "catalog").json()
    assert set(catalog["datasets"]) == {"sklearn-toy", "sklearn-images"}
    assert "source" not in catalog["datasets"]["sklearn-toy"]
    assert catalog["no_gpu"]["price_per_hour"] == "0.09"
    pool = ext(hub, user, "pool").json()
    rtx = next(t for t in pool["gpu_types"] if t["slug"] == "rtx-4090")
    assert rtx["free"] == hub.free("rtx-4090")
    assert rtx["total"] == 2
    # The user's own card is marked as theirs, and holders of other cards are not revealed.
    mine = [g for g in pool["gpus"] if g.get("yours")]
    assert [g["uuid"] for g in mine] == hub.server(user)["state"]["allocation"]["uuids"]
    assert all("holder" not in g for g in pool["gpus"])


def test_balance_is_unavailable_without_billing(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    r = ext(hub, user, "balance")
    assert r.status_code == 200
    balance = r.json()
    assert balance["available"] is False
    assert "billing" in balance["reason"]


def test_switch_rejects_bad_requests_before_asking_the_hub(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    alloc = hub.server(user)["state"]["allocation"]["alloc_id"]
    r = ext(hub, user, "switch", "POST", json={"gpu": "a100-80g", "colour": "red"})
    assert r.status_code == 400
    assert r.json()["message"].startswith("colour: unknown field; allowed: gpu, gpus, datasets")
    r = ext(hub, user, "switch", "POST", data="not json")
    assert r.status_code == 400 and "JSON object" in r.json()["message"]
    assert hub.server(user)["state"]["allocation"]["alloc_id"] == alloc


def test_extension_endpoints_need_authentication(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    r = requests.get(
        f"{hub.url}/user/{user}/gpulab/api/status", timeout=30, allow_redirects=False
    )
    assert r.status_code in (302, 403)
    r = requests.post(
        f"{hub.url}/user/{user}/gpulab/api/switch",
        json={"gpu": "none"},
        timeout=30,
        allow_redirects=False,
    )
    assert r.status_code in (302, 403)
    assert hub.server(user)["ready"]


def test_extension_import_is_light() -> None:
    """The server extension's import cost is part of every server start: nothing heavy."""
    import subprocess
    import sys

    code = (
        "import sys, jupyterlab_gpulab, jupyterlab_gpulab.handlers;"
        "heavy = [m for m in ('pynvml', 'pydantic', 'numpy', 'requests') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.strip() == ""
