"""Spot servers in the JupyterLab extension, against a real hub with a spot market.

- ``gpulab/api/spot`` in real single-user servers: the server reads the hub's spot status with
  its own token (price, bid, warning with the hub's clock, checkpoint result, cancellation), says
  "not spot" for on-demand servers and "unavailable" while the hub is down.
- Debian's Chromium (Playwright): the status bar shows "spot CNY 0.40/h (max 0.60)"; a price
  rise above the bid shows a countdown and saves the unsaved editor to disk at once; the price
  falling back says "cancelled" and takes the countdown away.

Prices are driven as an operator would: pinning the spot price with the admin API.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import requests
from conftest import require
from harness import (
    PASSWORD,
    REPO,
    SLOW,
    Hub,
    approved_user,
    browser_log_in,
    wait_for,
    write_in_home,
)
from jupyterlab_gpulab.spot import normalize_spot

# Long enough that the page (which reads the spot status every 10 s) sees the warning with
# time to spare on a busy machine; the tests cancel the preemption, so they never wait it out.
WARNING = 30
# Copied by hand to docs/screenshots/labext-spot-countdown.png (tests never write tracked files).
SCREENSHOT = REPO / "artifacts" / "screenshots" / "labext-spot-countdown.png"


@pytest.fixture(scope="module")
def spot_hub(module_hub_factory) -> Hub:
    require(
        importlib.util.find_spec("jupyterlab_gpulab") is not None,
        "the jupyterlab_gpulab extension (make install)",
    )
    return module_hub_factory(
        "labext-spot",
        simulate="RTX-4090:2",
        extra_args=[f"--SpotMarket.warning_seconds={WARNING}", "--SpotMarket.tick_interval=0.5"],
    )


@pytest.fixture
def hub(spot_hub: Hub):
    """The spot hub; afterwards the price is unpinned and every server stopped."""
    yield spot_hub
    if spot_hub.proc is None or spot_hub.proc.poll() is not None:
        return  # a test killed it and could not restart it; the module teardown reports that
    spot_hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": None})
    for u in spot_hub.api("GET", "/users").json():
        if u["servers"]:
            spot_hub.stop_server(u["name"])


def pin(hub: Hub, price: str | None) -> None:
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": price})
    assert r.status_code == 200, r.text


def ext_spot(hub: Hub, user: str) -> dict:
    """What the page reads: the user's server's ``gpulab/api/spot``, through the proxy."""
    r = requests.get(
        hub.user_url(user, "gpulab/api/spot"),
        headers={"Authorization": f"token {hub.token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


SPOT = {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.60"}


# ---- the hub's answer, normalized (pure) ------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [None, [], "down", {}, {"time": "now", "price": "0.40"}, {"time": 1.0, "price": "cheap"}],
)
def test_unreadable_hub_answers_are_unavailable(answer) -> None:
    out = normalize_spot(answer, "CNY", home="/home/ada")
    assert out["spot"] is True and out["available"] is False and out["reason"]


def test_hub_answer_is_normalized_with_paths_in_the_home() -> None:
    out = normalize_spot(
        {
            "running": True,
            "price": "0.65",
            "max_price": "0.60",
            "currency": "CNY",
            "time": 1000.5,
            "warning_seconds": 300.0,
            "preemption": {
                "id": "p-1",
                "status": "warning",
                "reason": "price-above-max",
                "price": "0.65",
                "max_price": "0.60",
                "warned_at": 1000.0,
                "deadline": 1300.0,
                "seconds_left": 299.5,
                "signalled_pids": [11, 12],
                "checkpoint": {
                    "command": "python save.py",
                    "log": "/srv/gpulab/users/ada/.gpulab/checkpoints/T.log",
                    "exit_code": 3,
                },
                "webhook": {"url": "https://example.invalid/hook"},
            },
        },
        home="/srv/gpulab/users/ada",
    )
    p = out["preemption"]
    assert (out["available"], out["price"], out["max_price"], out["time"]) == (
        True,
        "0.65",
        "0.60",
        1000.5,
    )
    assert (p["status"], p["deadline"], p["signalled"]) == ("warning", 1300.0, 2)
    assert p["checkpoint"] == {
        "state": "failed",
        "exit_code": 3,
        "error": None,
        "command": "python save.py",
        "log": "~/.gpulab/checkpoints/T.log",
    }
    assert "webhook" not in p  # the user's webhook URL stays out of the page
    # A record of an unknown state (a newer hub) is left out rather than shown wrongly.
    odd = normalize_spot({"time": 1.0, "price": "0.4", "preemption": {"id": "p", "status": "?"}})
    assert odd["available"] and odd["preemption"] is None


# ---- real servers behind a real hub -----------------------------------------------------------


def test_on_demand_server_is_not_spot(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    assert ext_spot(hub, user) == {"spot": False, "pricing": "on-demand"}


def test_spot_status_follows_the_market_with_the_servers_token(hub: Hub, user: str) -> None:
    # A checkpoint command, to see its result reach the page.
    r = hub.api(
        "PUT", f"/gpulab/spot/settings/{user}", json={"checkpoint_command": "echo saved-at-warning"}
    )
    assert r.status_code == 200, r.text
    pin(hub, "0.40")
    hub.spawn_ready(user, SPOT)
    before = time.time()
    spot = ext_spot(hub, user)
    after = time.time()
    assert spot["available"] is True, spot
    assert (spot["price"], spot["max_price"], spot["currency"]) == ("0.40", "0.60", "CNY")
    assert spot["running"] is True and spot["preemption"] is None
    assert before - 1 <= spot["time"] <= after + 1  # the hub's clock (same machine here)
    assert spot["warning_seconds"] == WARNING

    # The price rises above the bid: a warning with its deadline on the hub's clock.
    pin(hub, "0.65")
    spot = ext_spot(hub, user)
    p = spot["preemption"]
    assert spot["price"] == "0.65"
    assert (p["status"], p["reason"]) == ("warning", "price-above-max")
    assert (p["price"], p["max_price"]) == ("0.65", "0.60")
    assert 0 < p["deadline"] - spot["time"] <= WARNING
    admin_view = hub.api("GET", f"/gpulab/spot/status/{user}").json()["preemption"]
    assert (p["id"], p["deadline"]) == (admin_view["id"], admin_view["deadline"])

    # The checkpoint command ran in the user's home; its result reaches the page.
    def finished():
        s = ext_spot(hub, user)
        checkpoint = s["preemption"]["checkpoint"]
        # A checkpoint shows first as "running" (on a busy machine for a while), then its result.
        return s if checkpoint and checkpoint["state"] != "running" else None

    spot = wait_for(finished, timeout=60, what="the checkpoint result")
    checkpoint = spot["preemption"]["checkpoint"]
    assert (checkpoint["state"], checkpoint["exit_code"]) == ("done", 0)
    assert checkpoint["log"].startswith("~/.gpulab/checkpoints/")
    log = hub.data_dir / "users" / user / checkpoint["log"][2:]
    assert "saved-at-warning" in log.read_text()

    # The price falls back within the bid before the deadline: cancelled, same record.
    pin(hub, "0.40")
    spot = ext_spot(hub, user)
    assert spot["preemption"]["id"] == p["id"]
    assert spot["preemption"]["status"] == "cancelled"
    assert spot["preemption"]["cancelled_at"] < p["deadline"]
    assert spot["preemption"]["seconds_left"] is None
    assert hub.server(user)["ready"]


def test_spot_status_is_unavailable_while_the_hub_is_down(hub: Hub, user: str) -> None:
    pin(hub, "0.40")
    hub.spawn_ready(user, SPOT)
    assert ext_spot(hub, user)["available"] is True  # also puts the token in the server's cache
    pid = hub.server(user)["state"]["pid"]
    hub.kill()
    try:
        spot = ext_spot(hub, user)
        assert spot["spot"] is True and spot["available"] is False
        assert "the hub did not answer" in spot["reason"]
    finally:
        hub.start()
    # Back: the same server, and the page reads the price again.
    assert hub.server(user)["state"]["pid"] == pid
    spot = wait_for(lambda: (s := ext_spot(hub, user))["available"] and s, timeout=30)
    assert (spot["price"], spot["max_price"]) == ("0.40", "0.60")


# ---- the page, in Debian's Chromium -----------------------------------------------------------


def sign_up(hub: Hub) -> str:
    """A person who signed up on the hub and was approved by the admin."""
    return approved_user(hub, "bidder", PASSWORD)


def status_text(page, part: str) -> str:
    return page.locator(f"#gpulab-status .jp-gpulab-{part}").inner_text()


def test_spot_price_countdown_save_and_cancel_in_the_browser(hub: Hub, browser) -> None:
    name = sign_up(hub)
    r = hub.api(
        "PUT", f"/gpulab/spot/settings/{name}", json={"checkpoint_command": "touch ckpt.done"}
    )
    assert r.status_code == 200, r.text
    pin(hub, "0.40")
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)
        hub.spawn_ready(name, SPOT)
        notes = write_in_home(hub.data_dir / "users" / name, "notes.py", "lr = 0.1\n")

        page.goto(hub.user_url(name, "lab/tree/notes.py"), timeout=SLOW)
        page.wait_for_function(
            "document.querySelector('#gpulab-status .jp-gpulab-price')?.textContent"
            " === 'spot CNY 0.40/h (max 0.60)'",
            timeout=SLOW,
        )
        assert status_text(page, "mode") == "RTX 4090 x1 (simulated)"
        assert page.locator("#gpulab-status .jp-gpulab-countdown").is_hidden()

        # Unsaved work in the editor.
        page.locator(".jp-FileEditor .cm-content").click()
        page.keyboard.press("Control+End")
        page.keyboard.type("epochs = 30")
        page.locator(".lm-DockPanel-tabBar .jp-mod-dirty").wait_for(timeout=SLOW)
        assert notes.read_text() == "lr = 0.1\n"

        # The price rises above the bid: within one refresh (10 s) the countdown shows and the
        # editor is saved, without the user doing anything.
        pin(hub, "0.65")
        warned = time.monotonic()
        countdown = page.locator("#gpulab-status .jp-gpulab-countdown")
        countdown.wait_for(state="visible", timeout=15_000)
        seen_after = time.monotonic() - warned
        wait_for(
            lambda: notes.read_text() == "lr = 0.1\nepochs = 30",
            timeout=10,
            what="the editor to be saved to disk",
        )
        page.locator(".lm-DockPanel-tabBar .jp-mod-dirty").wait_for(state="detached")
        toast = page.locator(".jp-Notification-Toast-warning", has_text="Spot server stops in")
        toast.wait_for(timeout=10_000)
        toast.get_by_text("All open documents saved.").wait_for(timeout=10_000)
        first = countdown.inner_text()
        assert first.startswith("reclaimed in 0:")
        left = int(first.rsplit(":", 1)[1])
        assert 0 < left <= WARNING
        page.wait_for_function(
            "t => document.querySelector('#gpulab-status .jp-gpulab-countdown').textContent !== t",
            arg=first,
            timeout=5_000,
        )
        assert "(spot price CNY 0.65/h > your max 0.60)" in toast.inner_text()
        # The user's checkpoint command ran at the warning; its result shows in the notice.
        toast.get_by_text("Checkpoint: done (exit 0).").wait_for(timeout=20_000)
        assert status_text(page, "price") == "spot CNY 0.65/h (max 0.60)"
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), animations="disabled")
        # "Details" tells the whole story and leaves the countdown running in the notice.
        toast.get_by_role("button", name="Details").click()
        dialog = page.locator(".jp-Dialog", has_text="Spot server preemption")
        dialog.wait_for(timeout=10_000)
        text = dialog.inner_text()
        assert "rose above your max price (CNY 0.60/h)" in text and "It stops at " in text
        assert "Your checkpoint command finished (exit 0). Output: ~/.gpulab/checkpoints/" in text
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
        dialog.wait_for(state="detached", timeout=10_000)
        assert toast.is_visible()

        # The price falls back within the bid: "cancelled", and the countdown goes away.
        pin(hub, "0.40")
        page.locator(".jp-Notification-Toast-success", has_text="Preemption cancelled").wait_for(
            timeout=10_000
        )
        countdown.wait_for(state="hidden", timeout=5_000)
        assert page.evaluate("document.body.dataset.gpulabPreemption") == "cancelled"
        page.wait_for_function(
            "document.querySelector('#gpulab-status .jp-gpulab-price')?.textContent"
            " === 'spot CNY 0.40/h (max 0.60)'",
            timeout=15_000,
        )
        assert hub.server(name)["ready"]
        print(f"countdown visible {seen_after:.1f}s after the price rise (page refresh: 10 s)")
    except Exception:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT.with_name("spot-failure.png")))
        raise
    finally:
        context.close()
