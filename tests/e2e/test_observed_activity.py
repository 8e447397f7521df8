"""Metering truth: the hub watches every server itself. What the user's own server says (or
keeps quiet about) can add detail to the bill but never remove time, and cannot keep a card.

One hub with billing, an observer sampling every 0.5 s, a 6 s GPU idle timeout and a 1 s
last-activity update, so each attack plays out in seconds.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime

import pytest
import requests
import websocket
from billing.client import Billing, assert_billed_for_the_life_seen
from harness import Hub, wait_for, write_in_home

ENV = {
    "GPULAB_REPORTER_HEARTBEAT": "1",
    "GPULAB_BILLING_MIN_MINUTES": "1",
    "GPULAB_BILLING_ARGS": "--BillingService.heartbeat_interval=1 --BillingService.enforce_interval=1",
}
OBSERVER = [
    "--ActivityObserver.interval=0.5",
    "--ActivityObserver.report_interval=1",
    "--ActivityObserver.gpu_idle_timeout=6",
    "--ActivityObserver.idle_timeout=0",
    "--ActivityObserver.activity_update_interval=1",
]


@pytest.fixture(scope="module")
def ohub(module_hub_factory):
    h = module_hub_factory("observer-hub", env=ENV, extra_args=OBSERVER)
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


@pytest.fixture
def ouser(ohub):
    name = ohub.create_user(f"o{uuid.uuid4().hex[:8]}")
    yield name
    if ohub.server(name) is not None:
        ohub.stop_server(name)


def observed(billing: Billing, user: str) -> list[dict]:
    return [o for s in billing.usage(user)["servers"] for o in s["observed"]]


def observed_seconds(billing: Billing, user: str) -> float:
    return sum(o["observed_seconds"] for o in observed(billing, user))


def server_api(hub: Hub, user: str) -> tuple[str, dict]:
    token = hub.api("POST", f"/users/{user}/tokens", json={"note": "test"}).json()["token"]
    return hub.user_url(user, "api"), {"Authorization": f"token {token}"}


def test_a_terminal_running_sleep_20_is_billed_about_20_seconds(ohub, ouser) -> None:
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "none"})
    base, headers = server_api(ohub, ouser)
    name = requests.post(f"{base}/terminals", headers=headers, timeout=30).json()["name"]
    ws = websocket.create_connection(
        ohub.user_url(ouser, f"terminals/websocket/{name}").replace("http://", "ws://"),
        header=[f"{k}: {v}" for k, v in headers.items()],
    )
    t0 = time.time()
    ws.send(json.dumps(["stdin", "sleep 20; exit\r"]))
    # The terminal ends with its shell, after the sleep.
    wait_for(
        lambda: not requests.get(f"{base}/terminals", headers=headers, timeout=30).json(),
        60,
        0.5,
        "the terminal to end",
    )
    ended = time.time()
    ws.close()
    secs = wait_for(
        lambda: observed_seconds(billing, ouser) >= 19 and observed_seconds(billing, ouser),
        30,
        0.5,
        "observed time",
    )
    # Billed from the shell's start to the last sample that saw it; no kernel was ever reported.
    assert 19 <= secs <= (ended - t0) + 1.5, (secs, ended - t0)
    usage = billing.usage(ouser)
    (server,) = usage["servers"]
    assert server["kernels"] == []
    assert abs(server["billed_seconds"] - secs) < 0.01


DETACH = """
import subprocess, sys
code = "import time\\nend = time.time() + 12\\nwhile time.time() < end: pass"
p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, env={},
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid)
"""


def test_a_detached_process_keeps_the_server_billed_while_it_lives(ohub, ouser) -> None:
    """A no-GPU server is billed for what runs in it (a GPU server for its cards, below)."""
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "none"})
    with ohub.kernel(ouser) as k:
        k.execute(DETACH)
    # The kernel is gone; the detached process runs on for about 12 s and is billed.
    secs = wait_for(
        lambda: (s := observed_seconds(billing, ouser)) >= 11 and s,
        40,
        0.5,
        "the detached process billed",
    )
    assert secs < 20
    (server,) = billing.usage(ouser)["servers"]
    assert server["billed_seconds"] >= secs - 0.01


RENAMED = """
import ctypes, os, time
if os.fork() == 0:
    os.setsid()
    ctypes.CDLL(None).prctl(15, bytes([0xFF, 0xFE]) + b"(x) y", 0, 0, 0)
    end = time.time() + 12
    while time.time() < end:
        pass
    os._exit(0)
print("forked")
"""


def test_a_process_named_in_no_utf8_is_billed_all_the_same(ohub, ouser) -> None:
    """Issue 24 (F1, the observer's /proc reading): a process that names itself in bytes that
    are no UTF-8 (prctl, or an executable with such a file name) made every sample of its server
    raise, and the pass with it: its server was billed nothing while it ran, nor anybody else's."""
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "none"})
    with ohub.kernel(ouser) as k:
        assert "forked" in k.execute(RENAMED)
    secs = wait_for(
        lambda: (s := observed_seconds(billing, ouser)) >= 11 and s,
        40,
        0.5,
        "the renamed process billed",
    )
    assert secs < 20


def test_an_idle_gpu_goes_back_even_with_forged_heartbeats(ohub, ouser) -> None:
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "a100-80g"})
    uuid_held = ohub.server(ouser)["state"]["allocation"]["uuids"][0]
    # The attacker's notebook hands over the server's own token, then its kernel shuts down.
    with ohub.kernel(ouser) as k:
        token = k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
    # Nor can the server claim observations of its own: that kind is the hub's.
    forged = {
        "id": uuid.uuid4().hex,
        "kind": "activity",
        "user": ouser,
        "server": "",
        "t": time.time(),
        "span": "x-1",
        "first": time.time() - 3600,
    }
    r = billing.post("api/v1/events", {"events": [forged]}, token=token)
    assert r.status_code == 403 and "from the hub only" in r.text, r.text
    stop = time.time() + 30

    def forged_heartbeat() -> None:
        billing.post(
            "api/v1/events",
            {
                "events": [
                    {
                        "id": uuid.uuid4().hex,
                        "kind": "heartbeat",
                        "user": ouser,
                        "server": "",
                        "t": time.time(),
                        "kernels": [uuid.uuid4().hex],
                    }
                ]
            },
            token=token,
        )

    def moved() -> bool:
        forged_heartbeat()
        model = ohub.server(ouser)
        return bool(model and model["ready"] and model["state"]["allocation"]["gpu_type"] is None)

    wait_for(moved, stop - time.time(), 0.5, "the idle GPU server moved to no-GPU mode")
    card = next(g for g in ohub.pool()["gpus"] if g["uuid"] == uuid_held)
    assert not card["held"]
    notices = ohub.api("GET", f"/gpulab/users/{ouser}/notices").json()["notices"]
    assert notices and notices[-1]["kind"] == "gpu-idle"
    assert "no-GPU mode" in notices[-1]["message"]
    # JupyterLab reads it through the server's own extension, with the user's credentials.
    _, headers = server_api(ohub, ouser)
    seen = requests.get(
        ohub.user_url(ouser, "gpulab/api/notices"), headers=headers, timeout=30
    ).json()["notices"]
    assert seen[-1]["message"] == notices[-1]["message"]
    # Only a short-lived kernel ran, but the card was held: the GPU session is billed for every
    # second it held it, which the idle timeout (6 s here) bounds.
    (gpu,) = [s for s in billing.usage(ouser)["servers"] if s["gpu_type"] == "a100-80g"]
    held = seconds_between(gpu["started"], gpu["stopped"])
    assert held - 3 <= gpu["billed_seconds"] <= held, (gpu["billed_seconds"], held)


def seconds_between(start: str, stop: str) -> float:
    def t(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    return t(stop) - t(start)


# What attack 04 put in ~/.jupyter/jupyter_server_config.py: a thread of the single-user server
# that works in short bursts (here 0.5 s every 3 s, against this hub's 6 s GPU idle timeout).
BURSTS = """
import threading, time
def _bursts():
    for _ in range(40):
        time.sleep(3)
        t = time.time()
        while time.time() - t < 0.5:
            pass
threading.Thread(target=_bursts, daemon=True).start()
"""


def test_a_gpu_server_is_billed_for_every_second_it_holds_its_card(ohub, ouser) -> None:
    """Attack 04: no kernel, no process, only rare bursts of work from the user's own server
    config keep the card from the idle timeout; it was billed for the bursts alone (a few % of
    the time). A GPU server is billed for holding its cards, as a cloud bills an instance."""
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "none"})  # makes the home
    ohub.stop_server(ouser)
    home = ohub.data_dir / "users" / ouser
    write_in_home(home, ".jupyter/jupyter_server_config.py", BURSTS)
    ohub.spawn_ready(ouser, {"gpu": "rtx-4090"})

    def gpu_session() -> dict | None:
        found = [s for s in billing.usage(ouser)["servers"] if s["gpu_type"] == "rtx-4090"]
        return found[0] if found else None

    # Twice the idle timeout: the bursts keep the card (the user pays for it all along).
    t0 = time.time()
    wait_for(lambda: time.time() - t0 >= 14, 20, 0.5, "two idle timeouts")
    model = ohub.server(ouser)
    assert model["state"]["allocation"]["gpu_type"] == "rtx-4090"
    ohub.stop_server(ouser)
    session = wait_for(
        lambda: (s := gpu_session()) and s["stopped"] and s, 30, 0.5, "the GPU session stopped"
    )
    held = seconds_between(session["started"], session["stopped"])
    assert held >= 14
    assert held - 3 <= session["billed_seconds"] <= held, (session["billed_seconds"], held)
    assert session["kernels"] == []


def last_activity(hub: Hub, user: str) -> float:
    stamp = hub.user(user)["servers"][""]["last_activity"]
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_a_kernel_busy_in_a_silent_loop_moves_the_hubs_last_activity(ohub, ouser) -> None:
    ohub.spawn_ready(ouser, {"gpu": "none"})
    k = ohub.kernel(ouser)
    try:
        k.send("import time\nend = time.time() + 60\nwhile time.time() < end: pass")
        t0 = time.time()
        wait_for(lambda: last_activity(ohub, ouser) > t0 + 2, 30, 0.5, "last_activity to move")
    finally:
        k.close()


def test_money_comes_first_a_switch_or_reclaim_the_balance_cannot_pay_changes_nothing(
    ohub, ouser
) -> None:
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "none"})
    before = ohub.server(ouser)
    billing.credit(ouser, "-9.99")  # CNY 0.01 left
    free = ohub.free("a100-80g")
    r = ohub.api("POST", f"/gpulab/users/{ouser}/switch", json={"gpu": "a100-80g", "gpus": 2})
    assert r.status_code == 402, r.text
    assert "balance" in r.json()["message"]
    # The old server runs on, untouched, and no card was reserved for the switch.
    after = ohub.server(ouser)
    assert after["ready"] and after["started"] == before["started"]
    assert after["state"]["pid"] == before["state"]["pid"]
    assert ohub.free("a100-80g") == free

    # Every RTX 4090 on spot for someone else: an on-demand request would reclaim one, but the
    # poor user's request is refused before the market is asked, and nobody is warned.
    renters = [ohub.create_user() for _ in range(2)]
    assert ohub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.30"}).ok
    try:
        for renter in renters:
            ohub.spawn_ready(renter, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.40"})
        ohub.stop_server(ouser)
        r = ohub.spawn(ouser, {"gpu": "rtx-4090"})
        assert r.status_code == 402, r.text
        warned = ohub.api("GET", "/gpulab/spot/preemptions").json()["preemptions"]
        assert not [p for p in warned if p["user"] in renters]
        assert ohub.api("GET", "/gpulab/spot/queue").json()["queue"] == []
    finally:
        assert ohub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": None}).ok
        for renter in renters:
            if ohub.server(renter) is not None:
                ohub.stop_server(renter)


def test_a_kernel_alive_12_seconds_is_billed_12_seconds_with_both_sources(ohub, ouser) -> None:
    """Reports and observation together: the union, never the sum, within a second of life (on
    a no-GPU server, billed for what runs in it)."""
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "none"})
    t0 = time.time()
    k = ohub.kernel(ouser)
    t1 = time.time()
    # Working all along.
    k.send("import time\nend = time.time() + 11.5\nwhile time.time() < end: pass")
    time.sleep(12)
    t2 = time.time()
    k.close()
    t3 = time.time()
    ohub.stop_server(ouser)

    def settled():
        (server,) = billing.usage(ouser)["servers"]
        return server if server["stopped"] and server["observed"] else None

    server = wait_for(settled, 30, 0.5, "the session closed with its observed span")
    assert_billed_for_the_life_seen(server["billed_seconds"], t0, t1, t2, t3, sampled=1.0)


def test_work_inside_the_single_user_server_itself_is_observed_and_billed(ohub, ouser) -> None:
    """No kernel, no terminal, no other process: the user makes the single-user server itself
    work (here through its own contents API, validating a large notebook again and again; an
    extension or a config file of theirs could do the same). It used to be billed 0 s."""
    billing = Billing(ohub)
    ohub.spawn_ready(ouser, {"gpu": "none"})
    base, headers = server_api(ohub, ouser)
    cells = [
        {
            "cell_type": "code",
            "metadata": {},
            "source": "x = 1\n" * 20,
            "outputs": [],
            "execution_count": None,
            "id": f"c{i}",
        }
        for i in range(20000)
    ]
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    t0 = time.time()
    r = requests.put(
        f"{base}/contents/big.ipynb",
        json={"type": "notebook", "format": "json", "content": nb},
        headers=headers,
        timeout=120,
    )
    assert r.status_code in (200, 201), r.text
    while time.time() - t0 < 10:
        r = requests.get(f"{base}/contents/big.ipynb", headers=headers, timeout=120)
        assert r.status_code == 200
    secs = wait_for(
        lambda: (s := observed_seconds(billing, ouser)) >= 6 and s,
        30,
        0.5,
        "the server's work billed",
    )
    assert secs <= time.time() - t0 + 1
    (server,) = billing.usage(ouser)["servers"]
    assert server["kernels"] == [] and server["billed_seconds"] >= secs - 0.01
