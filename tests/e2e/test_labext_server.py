"""The JupyterLab extension's server half (``/gpulab/api/...``) in real single-user servers.

Every call goes browser-style to the user's server through the real proxy; the server extension
calls the real hub with the server's own token.
"""

from __future__ import annotations

import importlib.util
import os
import time
from decimal import Decimal

import pytest
import requests
from conftest import require
from harness import Hub, wait_for

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
        hub.user_url(user, f"gpulab/api/{path}"),
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


def test_balance_comes_from_billing(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    r = ext(hub, user, "balance")
    assert r.status_code == 200
    balance = r.json()
    # A new user holds the trial credit; no kernel has run, so nothing was charged.
    assert balance["available"] is True, balance
    assert (Decimal(balance["balance"]), balance["currency"]) == (Decimal("10"), "CNY")


def test_balance_is_unavailable_without_billing(hub_factory) -> None:
    hub = hub_factory(simulate="RTX-4090:1", env={"GPULAB_BILLING": "0"})
    user = hub.create_user()
    hub.spawn_ready(user, {"gpu": "none"})
    balance = ext(hub, user, "balance").json()
    assert balance["available"] is False
    assert "billing" in balance["reason"]
    hub.stop_server(user)


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
    base = hub.user_url(user, "gpulab/api")
    r = requests.get(f"{base}/status", timeout=30, allow_redirects=False)
    assert r.status_code == 403
    r = requests.post(f"{base}/switch", json={"gpu": "a100-80g"}, timeout=30, allow_redirects=False)
    assert r.status_code == 403
    # The restart poll answers without log-in, and reveals only a random id of the process.
    r = requests.get(f"{base}/ping", timeout=30, allow_redirects=False)
    assert r.status_code == 200 and set(r.json()) == {"gpulab", "server_id"}
    status = ext(hub, user, "status").json()
    assert r.json()["server_id"] == status["server_id"]
    assert status["allocation_id"] not in r.text
    assert hub.server(user)["state"]["options"]["gpu"] == "none"


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


def wait_new_server(hub: Hub, user: str, old_alloc: str, timeout: float = 60) -> dict:
    """Poll the extension's status, as the page does, until a server with a new allocation answers."""

    def fresh():
        try:
            r = requests.get(
                hub.user_url(user, "gpulab/api/status"),
                headers={"Authorization": f"token {hub.token}"},
                timeout=5,
                allow_redirects=False,
            )
        except requests.RequestException:
            return None
        if r.status_code != 200 or "json" not in r.headers.get("Content-Type", ""):
            return None
        status = r.json()
        return status if status.get("allocation_id") not in ("", old_alloc) else None

    return wait_for(fresh, timeout, interval=0.1, what=f"{user}'s restarted server")


def test_switch_to_no_gpu_and_back_keeps_files(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "rtx-4090", "datasets": ["sklearn-toy"]})
    free_before = hub.free("rtx-4090")
    old = ext(hub, user, "status").json()
    with hub.kernel(user) as k:
        k.execute("open('notes.txt', 'w').write('before the switch')")

    t0 = time.monotonic()
    r = ext(hub, user, "switch", "POST", json={"gpu": "none"})
    assert r.status_code == 202, r.text
    assert r.json()["options"]["gpu"] == "none"
    status = wait_new_server(hub, user, old["allocation_id"])
    elapsed = time.monotonic() - t0
    print(f"switch rtx-4090 -> no-GPU: new server answered after {elapsed:.2f}s")
    assert status["server_id"] != old["server_id"]
    ping = requests.get(hub.user_url(user, "gpulab/api/ping"), timeout=30).json()
    assert ping["server_id"] == status["server_id"]
    assert status["mode"] == "No GPU" and status["gpu_type"] == "none"
    # Same image and datasets; the GPU went back to the pool.
    assert status["image"] == old["image"] and status["datasets"] == ["sklearn-toy"]
    assert hub.free("rtx-4090") == free_before + 1
    with hub.kernel(user) as k:
        assert k.execute("print(open('notes.txt').read())").strip() == "before the switch"
        assert k.execute("import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))").strip() == (
            "''"
        )

    r = ext(hub, user, "switch", "POST", json={"gpu": "rtx-4090"})
    assert r.status_code == 202, r.text
    status = wait_new_server(hub, user, status["allocation_id"])
    assert status["mode"] == "RTX 4090 x1 (simulated)"
    uuids = hub.server(user)["state"]["allocation"]["uuids"]
    with hub.kernel(user) as k:
        assert k.execute("print(open('notes.txt').read())").strip() == "before the switch"
        assert (
            k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() == (uuids[0])
        )


def test_switch_without_a_free_card_changes_nothing(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    before = hub.server(user)["state"]["allocation"]["alloc_id"]
    # Another user holds one of the hub's 2 RTX 4090: 2 fit on the node but are not free.
    holder = hub.create_user()
    hub.spawn_ready(holder, {"gpu": "rtx-4090"})
    try:
        free = hub.free("rtx-4090")
        r = ext(hub, user, "switch", "POST", json={"gpu": "rtx-4090", "gpus": 2})
        assert r.status_code == 409, r.text
        assert "free" in r.json()["message"]
        # More than the largest node has (issue 26): 400 naming gpus.
        r = ext(hub, user, "switch", "POST", json={"gpu": "rtx-4090", "gpus": 3})
        assert r.status_code == 400 and "gpus" in r.json()["message"], r.text
    finally:
        hub.stop_server(holder)
    r = ext(hub, user, "switch", "POST", json={"gpu": "v100"})
    assert r.status_code == 400 and r.json()["message"].startswith("Invalid spawn option gpu:")
    time.sleep(1)
    assert hub.server(user)["ready"]
    assert hub.server(user)["state"]["allocation"]["alloc_id"] == before
    assert ext(hub, user, "status").json()["allocation_id"] == before
    assert hub.free("rtx-4090") == free + 1  # the holder's card is back; none taken


def test_mount_dataset_by_switch(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    old = ext(hub, user, "status").json()
    r = ext(hub, user, "switch", "POST", json={"datasets": ["sklearn-images"]})
    assert r.status_code == 202, r.text
    status = wait_new_server(hub, user, old["allocation_id"])
    assert status["datasets"] == ["sklearn-images"] and status["mode"] == "No GPU"
    with hub.kernel(user) as k:
        listing = k.execute("import os; print(sorted(os.listdir('datasets/sklearn-images')))")
    assert "china.jpg" in listing


@pytest.mark.parametrize("sigint", ["python-handler", "default-action"])
def test_switch_answer_survives_the_stop_signal(tmp_path, sigint: str) -> None:
    """The hub stops a server right as it accepts the switch, so the stop signal can reach the
    server before the server has relayed the hub's 202 to the page. The answer must still
    arrive, and the server must still stop at once.

    To hit that window every time, this test plays the hub's part itself (a plain HTTP server
    that sends SIGINT to the real jupyter server, then answers 202) instead of racing the hub.
    SIGINT is either Python's KeyboardInterrupt handler (Popen-started servers) or the default
    action, which kills at once (servers forked by gpulab's fork server).
    """
    import http.server
    import json
    import signal
    import subprocess
    import sys
    import threading

    from harness import free_port

    server: dict[str, subprocess.Popen] = {}

    def sigint_pending(pid: int) -> bool:
        """SIGINT sent to the process but not yet taken by it (its handler has not run)."""
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            return False
        pending = int(status.split("\nShdPnd:\t", 1)[1].split()[0], 16)
        return bool(pending & (1 << (signal.SIGINT - 1)))

    class HubSide(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            server["proc"].send_signal(signal.SIGINT)  # as the spawner's stop() does
            # Answer once the server has taken the signal, so it is in before the answer.
            wait_for(lambda: not sigint_pending(server["proc"].pid), 30, 0.001, "SIGINT taken")
            body = json.dumps({"options": {"gpu": "none"}}).encode()
            self.send_response(202)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    hub_side = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), HubSide)
    threading.Thread(target=hub_side.serve_forever, daemon=True).start()
    port = free_port()
    env = {
        **os.environ,
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_side.server_port}/hub/api",
        "JUPYTERHUB_API_TOKEN": "server-token",
        "JUPYTERHUB_USER": "ada",
        "GPULAB_ALLOCATION_ID": "alloc-1",
        "GPULAB_GPU_TYPE": "a100-80g",
    }
    boot = "import signal, sys; from jupyter_server.serverapp import main; "
    if sigint == "default-action":
        boot += "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    boot += "sys.exit(main())"
    args = [sys.executable, "-c", boot, f"--port={port}", "--IdentityProvider.token=t"]
    args += ["--ServerApp.open_browser=False", f"--ServerApp.root_dir={tmp_path}"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    log = open(tmp_path / "server.log", "wb")
    server["proc"] = subprocess.Popen(
        args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}/gpulab/api"
    headers = {"Authorization": "token t"}
    try:

        def up() -> bool:
            if server["proc"].poll() is not None:
                raise RuntimeError((tmp_path / "server.log").read_text(errors="replace")[-3000:])
            try:
                return requests.get(f"{base}/status", headers=headers, timeout=2).ok
            except requests.RequestException:
                return False

        # Start-up may be slow on a loaded machine or a fresh checkout (bytecode to write); a
        # server that dies says so at once, so the limit only guards against a hang.
        wait_for(up, 180, what="the jupyter server")
        r = requests.post(f"{base}/switch", headers=headers, json={"gpu": "none"}, timeout=30)
        assert r.status_code == 202, r.text
        assert r.json()["options"] == {"gpu": "none"}
        # ...and the deferred stop signal then stops the server: it acts on the signal at once
        # (its own handler logs "Interrupted...", the default action kills it). Its exit then
        # waits for its clean-up and background threads, so that limit only guards against a hang.
        proc = server["proc"]
        if sigint == "python-handler":
            wait_for(
                lambda: (
                    proc.poll() is not None
                    or "Interrupted..." in (tmp_path / "server.log").read_text(errors="replace")
                ),
                60,
                what="the server to act on the deferred stop signal",
            )
        proc.wait(timeout=120)
        if sigint == "default-action":
            assert proc.returncode == -signal.SIGINT
    finally:
        if server["proc"].poll() is None:
            server["proc"].kill()
            server["proc"].wait()
        hub_side.shutdown()
        log.close()
