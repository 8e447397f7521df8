"""The spot market end to end: real hub, real servers and kernels, a real webhook receiver.

One hub for this module with a 3 s warning period and a fast tick. Prices are driven the way an
operator would: pinning a type's spot price through the admin API (``PUT .../spot/prices/TYPE``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from harness import PASSWORD, Hub, Receiver, WebSession, approved_user, browser_log_in, wait_for

from gpulab.catalog.price_history import price_at

WARNING = 3


@pytest.fixture(scope="module")
def spot_hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "spot",
        simulate="A100-80G:1,RTX-4090:2",
        extra_args=[
            f"--SpotMarket.warning_seconds={WARNING}",
            "--SpotMarket.tick_interval=0.5",
            "--SpotMarket.timezone=Asia/Shanghai",
            # The webhook receivers below listen on loopback, which is refused by default.
            "--SpotMarket.webhook_allowed_networks=127.0.0.0/8",
        ],
    )


@pytest.fixture
def hub(spot_hub: Hub):
    """The spot hub, with every price unpinned and every server stopped after the test."""
    yield spot_hub
    for slug in ("rtx-4090", "a100-80g"):
        spot_hub.api("PUT", f"/gpulab/spot/prices/{slug}", json={"price": None})
    for entry in spot_hub.api("GET", "/gpulab/spot/queue").json()["queue"]:
        spot_hub.api("DELETE", f"/gpulab/spot/queue/{entry['user']}")
    users = spot_hub.api("GET", "/users").json()
    for u in users:
        if u["servers"]:
            spot_hub.stop_server(u["name"])


def pin(hub: Hub, slug: str, price: str | None) -> dict:
    r = hub.api("PUT", f"/gpulab/spot/prices/{slug}", json={"price": price})
    assert r.status_code == 200, r.text
    return r.json()


def spot(max_price: str, **extra) -> dict:
    return {"gpu": "rtx-4090", "pricing": "spot", "max_price": max_price, **extra}


def home(hub: Hub, user: str) -> Path:
    return hub.data_dir / "users" / user


def preemptions(hub: Hub, user: str) -> list[dict]:
    r = hub.api("GET", "/gpulab/spot/preemptions")
    assert r.status_code == 200, r.text
    return [p for p in r.json()["preemptions"] if p["user"] == user]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_price_rise_warns_checkpoints_and_stops_at_the_deadline(hub: Hub, receiver) -> None:
    user = hub.create_user()
    r = hub.api(
        "PUT",
        f"/gpulab/spot/settings/{user}",
        json={
            "webhook_url": receiver.url,
            "checkpoint_command": "echo saving on $GPULAB_GPU_TYPE in $PWD; sleep 1; "
            "touch ckpt-done; ls ckpt-done",
        },
    )
    assert r.status_code == 200, r.text
    secret = r.json()["webhook_secret"]
    assert len(secret) >= 32

    pin(hub, "rtx-4090", "0.30")
    free_before = hub.free("rtx-4090")
    hub.spawn_ready(user, spot("0.40"))
    assert hub.free("rtx-4090") == free_before - 1
    opted_in = hub.kernel(user)
    opted_in.execute(
        "import json, gpulab_spot\n"
        "gpulab_spot.on_preempt(lambda info: open('preempted.txt', 'w').write(json.dumps(info)))"
    )
    bystander = hub.kernel(user)  # no handler: SIGUSR1 would kill it, so it must not get one
    bystander_pid = int(bystander.execute("import os; print(os.getpid())"))
    server_token = opted_in.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()

    pin(hub, "rtx-4090", "0.60")
    warned = time.time()
    # The checkpoint command's progress is on record while it runs, not only after.
    running = wait_for(
        lambda: hub.api("GET", f"/gpulab/spot/status/{user}").json()["preemption"]["checkpoint"],
        timeout=WARNING,
        interval=0.05,
        what="the checkpoint command's start",
    )
    assert running["state"] == "running" and running.get("exit_code") is None
    assert Path(running["log"]).parent == home(hub, user) / ".gpulab" / "checkpoints"
    marker = home(hub, user) / "preempted.txt"
    wait_for(marker.exists, timeout=WARNING, interval=0.05, what="the kernel's SIGUSR1 handler")
    info = json.loads(wait_for(lambda: marker.read_text(), timeout=5, what="the handler's file"))
    assert info["signal"] == "SIGUSR1"

    # The JupyterLab extension's view, read with the server's own token.
    r = hub.api("GET", f"/gpulab/spot/status/{user}", token=server_token)
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["preemption"]["status"] == "warning"
    assert status["preemption"]["reason"] == "price-above-max"
    assert 0 < status["preemption"]["seconds_left"] <= WARNING
    assert status["price"] == "0.60" and status["max_price"] == "0.40"
    # The kernel that did not opt in is alive and answering.
    assert bystander.execute("print(6 * 7)").strip() == "42"
    record = preemptions(hub, user)[-1]
    assert bystander_pid in record["skipped_pids"]
    assert record["signalled_pids"]

    # The signed webhook arrived.
    headers, body = wait_for(lambda: receiver.deliveries and receiver.deliveries[0], timeout=5)
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Gpulab-Signature"], expected)
    assert headers["X-Gpulab-Event"] == "preemption-warning"
    payload = json.loads(body)
    assert payload["server"] == f"{user}/" and payload["reason"] == "price-above-max"
    assert abs(payload["deadline"] - (warned + WARNING)) < 2

    # At the deadline: stopped, GPU free, the record closed, the checkpoint output kept.
    wait_for(lambda: hub.server(user) is None, timeout=WARNING + 15, what="the stop")
    stopped = time.time()
    assert stopped >= warned + WARNING - 0.5
    assert hub.free("rtx-4090") == free_before
    record = preemptions(hub, user)[-1]
    assert record["status"] == "stopped"
    assert record["deadline"] <= record["stopped_at"] <= stopped + 1
    assert record["webhook"]["delivered"] is True
    assert record["checkpoint"]["exit_code"] == 0 and record["checkpoint"]["state"] == "done"
    assert record["checkpoint"]["log"] == running["log"]
    log = Path(record["checkpoint"]["log"])
    assert log.parent == home(hub, user) / ".gpulab" / "checkpoints"
    text = log.read_text()
    assert f"saving on rtx-4090 in {home(hub, user)}" in text and "\nckpt-done" in text

    # Billing's seam: the price in force at each second, from the durable history.
    before, after = warned - 0.5, warned + 0.5
    assert price_at("rtx-4090", before, hub.data_dir) == Decimal("0.30")
    assert price_at("rtx-4090", after, hub.data_dir) == Decimal("0.60")


def test_preemption_is_cancelled_when_the_price_falls_back(hub: Hub, receiver) -> None:
    user = hub.create_user()
    hub.api("PUT", f"/gpulab/spot/settings/{user}", json={"webhook_url": receiver.url})
    pin(hub, "rtx-4090", "0.30")
    hub.spawn_ready(user, spot("0.40"))
    pid = hub.server(user)["state"]["pid"]
    pin(hub, "rtx-4090", "0.50")
    assert hub.api("GET", f"/gpulab/spot/status/{user}").json()["preemption"]["status"] == "warning"
    pin(hub, "rtx-4090", "0.35")
    status = hub.api("GET", f"/gpulab/spot/status/{user}").json()
    assert status["preemption"]["status"] == "cancelled"
    assert status["preemption"]["cancelled_at"] < status["preemption"]["deadline"]
    time.sleep(WARNING + 1.5)
    s = hub.server(user)
    assert s is not None and s["ready"] and s["state"]["pid"] == pid
    events = [
        h["X-Gpulab-Event"]
        for h, _ in wait_for(
            lambda: len(receiver.deliveries) >= 2 and receiver.deliveries, timeout=5
        )
    ]
    assert events == ["preemption-warning", "preemption-cancelled"]


def test_on_demand_reclaims_the_lowest_bid(hub: Hub) -> None:
    low, high, od = (hub.create_user() for _ in range(3))
    pin(hub, "rtx-4090", "0.30")
    hub.spawn_ready(high, spot("0.60"))
    hub.spawn_ready(low, spot("0.45"))
    assert hub.free("rtx-4090") == 0

    r = hub.spawn(od, {"gpu": "rtx-4090"})
    assert r.status_code == 202, r.text
    assert "reclaimed" in r.json()["message"]
    queue = hub.api("GET", "/gpulab/spot/queue").json()["queue"]
    mine = [q for q in queue if q["user"] == od]
    assert mine and mine[0]["waiting_for"] == "reclaim" and mine[0]["pricing"] == "on-demand"
    assert preemptions(hub, low)[-1]["reason"] == "on-demand-reclaim"
    assert not preemptions(hub, high)

    hub.wait_ready(od, timeout=WARNING + 30)
    assert hub.server(low) is None
    assert hub.server(high)["ready"]
    assert hub.server(od)["user_options"]["pricing"] == "on-demand"
    assert preemptions(hub, low)[-1]["status"] == "stopped"


def test_queued_spot_request_starts_when_the_price_falls(hub: Hub) -> None:
    user, other = hub.create_user(), hub.create_user()
    pin(hub, "rtx-4090", "0.60")
    r = hub.spawn(user, spot("0.40", wait=True))
    assert r.status_code == 202, r.text
    assert "Queued as q-" in r.json()["message"] and "0.60" in r.json()["message"]
    assert r.json()["queued"]["position"] == 1 and r.json()["queued"]["max_price"] == "0.40"
    assert hub.server(user) is None
    # Queued, not a failed spawn: nothing pending, and the hub log says so without an error.
    assert hub.api("GET", f"/users/{user}").json()["servers"] == {}
    log = hub.log_path.read_text(errors="replace")
    assert f"Queued {r.json()['queued']['id']} for {user}/ (no spawn started)" in log
    assert not [line for line in log.splitlines() if user in line and re.search(r"\[E |rror", line)]

    # Visible to its owner and admins, not to other users.
    token = hub.api("POST", f"/users/{other}/tokens", json={"expires_in": 600}).json()["token"]
    assert hub.api("GET", "/gpulab/spot/queue", token=token).json()["queue"] == []
    queue = hub.api("GET", "/gpulab/spot/queue").json()["queue"]
    assert [q["user"] for q in queue] == [user]
    r = hub.api("DELETE", f"/gpulab/spot/queue/{user}", token=token)
    assert r.status_code in (403, 404)

    pin(hub, "rtx-4090", "0.35")
    s = hub.wait_ready(user, timeout=30)
    assert s["user_options"]["max_price"] == "0.40"
    assert hub.api("GET", "/gpulab/spot/queue").json()["queue"] == []


def test_refused_and_cancelled_spot_requests_hold_nothing(hub: Hub) -> None:
    user = hub.create_user()
    pin(hub, "rtx-4090", "0.60")
    free = hub.free("rtx-4090")
    r = hub.spawn(user, spot("0.40"))
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "spot price of rtx-4090 is 0.60" in message and "max_price 0.40" in message
    assert hub.server(user) is None and hub.free("rtx-4090") == free

    assert hub.spawn(user, spot("0.40", wait=True)).status_code == 202
    assert hub.api("DELETE", f"/gpulab/spot/queue/{user}").status_code == 200
    assert hub.api("DELETE", f"/gpulab/spot/queue/{user}").status_code == 404
    pin(hub, "rtx-4090", "0.30")
    time.sleep(1.5)  # a few ticks: the cancelled request must not start
    assert hub.server(user) is None and hub.free("rtx-4090") == free


BAD_SPOT_OPTIONS = [
    (spot("0.40", wait="maybe"), "wait", "true or false"),
    (spot("0.40", windows_only=3), "windows_only", "true or false"),
    ({"gpu": "rtx-4090", "wait": True}, "wait", "spot requests only"),
    ({"gpu": "rtx-4090", "windows_only": True}, "windows_only", "spot requests only"),
    (spot("free"), "max_price", "positive number"),
]


@pytest.mark.parametrize(("options", "field", "text"), BAD_SPOT_OPTIONS)
def test_bad_spot_options_name_the_field(hub: Hub, options: dict, field: str, text: str) -> None:
    user = hub.create_user()
    r = hub.spawn(user, options)
    assert r.status_code == 400, r.text
    assert f"{field}:" in r.json()["message"] and text in r.json()["message"]
    assert hub.server(user) is None
    assert hub.api("GET", "/gpulab/spot/queue").json()["queue"] == []


def test_prices_api_history_and_pinning_rules(hub: Hub) -> None:
    prices = hub.api("GET", "/gpulab/spot/prices?hours=24").json()
    assert prices["currency"] == "CNY" and prices["timezone"] == "Asia/Shanghai"
    by_slug = {t["slug"]: t for t in prices["gpu_types"]}
    assert set(by_slug) == {"rtx-4090", "a100-80g"}
    for t in by_slug.values():
        assert (
            Decimal(t["spot_floor_price"]) <= Decimal(t["price"]) <= Decimal(t["on_demand_price"])
        )
        assert t["history"] and t["history"][-1]["price"] == t["price"]

    # The periodic tick runs by itself (every 0.5 s in this hub).
    wait_for(
        lambda: hub.api("GET", "/gpulab/spot/prices").json()["last_tick_ms"] is not None,
        timeout=10,
        what="a market tick",
    )
    assert hub.api("GET", "/gpulab/spot/prices?hours=-1").status_code == 400
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "9.99"})
    assert r.status_code == 400 and "price:" in r.json()["message"]
    user = hub.create_user()
    token = hub.api("POST", f"/users/{user}/tokens", json={"expires_in": 600}).json()["token"]
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.50"}, token=token)
    assert r.status_code == 403
    r = hub.api("PUT", f"/gpulab/spot/settings/{user}", json={"webhook_url": "ftp://x"})
    assert r.status_code == 400 and "webhook_url:" in r.json()["message"]


def test_spawn_form_shows_spot_prices_and_queues_a_waiting_bid(hub: Hub) -> None:
    pin(hub, "rtx-4090", "0.55")
    name, secret = approved_user(hub, "form"), PASSWORD
    web = WebSession(hub)
    assert web.login(name, secret)

    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", web.get(f"/hub/spawn/{name}").text))
    assert "RTX 4090 simulated" in text and "spot now CNY 0.55 /h" in text
    assert "queue it and start it when a card is free" in text
    assert "Run only in low-price windows (18:00-09:00, weekends)" in text

    r = web.post(
        f"/hub/spawn/{name}",
        [
            ("gpu", "rtx-4090"),
            ("gpus", "1"),
            ("image", "base"),
            ("pricing", "spot"),
            ("max_price", "0.40"),
            ("wait", "true"),
        ],
    )
    page = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r.text))
    assert r.status_code == 200 and "Your queued request" in page, page
    assert [h.status_code for h in r.history] == [303]  # post, redirect, get: reload-safe
    assert "Queued as q-" in page and "Position 1 of 1 in the RTX 4090 queue" in page
    assert "spot price now CNY 0.55 /card-hour" in page and "max price CNY 0.40" in page
    assert "spawn-error-msg" not in r.text and "Spawn failed" not in page
    assert hub.server(name) is None
    queue = hub.api("GET", "/gpulab/spot/queue").json()["queue"]
    assert [(q["user"], q["max_price"]) for q in queue] == [(name, "0.40")]
    pin(hub, "rtx-4090", "0.40")
    assert hub.wait_ready(name, timeout=30)["user_options"]["pricing"] == "spot"


def test_many_queued_bids_race_for_two_cards_and_never_share_one(hub: Hub) -> None:
    pin(hub, "rtx-4090", "0.60")
    bids = ["0.35", "0.50", "0.38", "0.45", "0.31", "0.42"]
    users = [hub.create_user() for _ in bids]
    with ThreadPoolExecutor(len(users)) as ex:
        codes = list(
            ex.map(
                lambda ub: hub.spawn(ub[0], spot(ub[1], wait=True)).status_code,
                zip(users, bids, strict=True),
            )
        )
    assert codes == [202] * len(users)
    assert len(hub.api("GET", "/gpulab/spot/queue").json()["queue"]) == len(users)

    pin(hub, "rtx-4090", "0.40")  # four bids cover it; the two highest get the two cards
    by_bid = dict(zip(bids, users, strict=True))
    for bid in ("0.50", "0.45"):
        hub.wait_ready(by_bid[bid], timeout=30)
    time.sleep(1.5)
    running = [u for u in users if hub.server(u)]
    assert sorted(running) == sorted([by_bid["0.50"], by_bid["0.45"]])
    held = [hub.server(u)["state"]["allocation"]["uuids"][0] for u in running]
    assert len(set(held)) == 2 and hub.free("rtx-4090") == 0
    queue = hub.api("GET", "/gpulab/spot/queue").json()["queue"]
    assert sorted(q["max_price"] for q in queue) == ["0.31", "0.35", "0.38", "0.42"]

    # A card frees: the best remaining bid that covers the price (0.42) takes it.
    hub.stop_server(by_bid["0.50"])
    hub.wait_ready(by_bid["0.42"], timeout=30)
    assert hub.free("rtx-4090") == 0
    assert hub.server(by_bid["0.38"]) is None


def test_a_spot_server_switches_to_no_gpu_but_not_onto_spot(hub: Hub) -> None:
    hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.40"})
    user = hub.create_user()
    try:
        hub.spawn_ready(user, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.60"})
        r = hub.api("POST", f"/gpulab/users/{user}/switch", json={"gpu": "none"})
        assert r.status_code == 202, r.text
        assert r.json()["options"]["pricing"] == "on-demand"
        wait_for(
            lambda: (s := hub.server(user)) and s["ready"] and s["user_options"]["gpu"] == "none",
            timeout=60,
            what="the no-GPU server",
        )
        r = hub.api(
            "POST", f"/gpulab/users/{user}/switch", json={"gpu": "rtx-4090", "pricing": "spot"}
        )
        assert r.status_code == 409 and "spot" in r.json()["message"], r.text
        assert hub.server(user)["user_options"]["gpu"] == "none"
    finally:
        if hub.server(user):
            hub.stop_server(user)


def test_queued_request_shows_in_the_spawn_form_and_cancels_there(hub: Hub, browser) -> None:
    pin(hub, "rtx-4090", "0.55")
    name, secret = approved_user(hub, "queue"), PASSWORD
    page = browser.new_page()
    try:
        browser_log_in(page, hub, name, secret)
        page.goto(f"{hub.url}/hub/spawn/{name}")
        assert page.is_disabled('input[name="gpus"]')  # no-GPU mode (the default) has no cards
        page.check('input[name="gpu"][value="rtx-4090"]')
        assert page.is_enabled('input[name="gpus"]')
        page.check('input[name="pricing"][value="spot"]')
        page.fill("#gpulab-max-price", "0.40")
        page.check('input[name="wait"]')
        page.click('input[type="submit"], button[type="submit"]')
        panel = page.locator("#gpulab-queued")
        panel.wait_for(timeout=30_000)
        text = panel.inner_text()
        assert "Queued as q-" in text and "spot, max price CNY 0.40/card-hour" in text
        assert "Position 1 of 1" in text and "spot price now CNY 0.55/card-hour" in text
        assert page.locator(".spawn-error-msg").count() == 0
        # The form below shows the queued request's choices, not the previous server's, so
        # "Start" does not quietly turn the queued spot bid into something else.
        assert page.is_checked('input[name="gpu"][value="rtx-4090"]')
        assert page.is_checked('input[name="pricing"][value="spot"]')
        assert page.input_value("#gpulab-max-price") == "0.40"
        assert page.is_checked('input[name="wait"]')
        queue = hub.api("GET", "/gpulab/spot/queue").json()["queue"]
        assert [q["user"] for q in queue] == [name]
        # The form came back by a redirect, so reloading it does not post (and queue) again.
        page.reload()
        page.locator("#gpulab-queued").wait_for()
        assert hub.api("GET", "/gpulab/spot/queue").json()["queue"] == queue

        page.get_by_role("button", name="Cancel queued request").click()
        page.locator("#gpulab-queue-state", has_text="Cancelled: request q-").wait_for(
            timeout=10_000
        )
        assert hub.api("GET", "/gpulab/spot/queue").json()["queue"] == []
        page.reload()
        page.locator('input[name="gpu"]').first.wait_for()
        assert page.locator("#gpulab-queued").count() == 0
        pin(hub, "rtx-4090", "0.30")
        time.sleep(1.5)  # a few ticks: the cancelled request must not start
        assert hub.server(name) is None
    finally:
        page.close()


def test_webhook_secret_needs_the_users_own_credentials_not_the_servers_token(hub: Hub) -> None:
    user, other = hub.create_user(), hub.create_user()
    hub.spawn_ready(user, {"gpu": "none"})
    # Code in a notebook holds the server's token.
    server_token = (
        hub.kernel(user).execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
    )
    path = f"/gpulab/spot/settings/{user}"
    r = hub.api("GET", path, token=server_token)
    assert r.status_code == 403, r.text
    r = hub.api("PUT", path, json={"webhook_url": "http://127.0.0.1:9/x"}, token=server_token)
    assert r.status_code == 403, r.text
    # The server's token still reads the spot status the JupyterLab extension needs.
    assert hub.api("GET", f"/gpulab/spot/status/{user}", token=server_token).status_code == 200

    def token(name: str, **body) -> str:
        r = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 600, **body})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    mine = token(user)
    r = hub.api("GET", path, token=mine)
    assert r.status_code == 200 and len(r.json()["webhook_secret"]) >= 32, r.text
    secret = r.json()["webhook_secret"]
    # A token made for just this scope works too; another user's token does not.
    narrow = token(user, scopes=["custom:gpulab:spot-settings!user"])
    assert hub.api("GET", path, token=narrow).json()["webhook_secret"] == secret
    assert hub.api("GET", path, token=token(other)).status_code in (403, 404)
    assert hub.api("GET", path).json()["webhook_secret"] == secret  # admin


def test_window_only_server_is_reclaimed_when_its_low_price_window_ends(
    hub_factory,
) -> None:
    """A dedicated hub whose one low-price window (UTC, with seconds) ends shortly after start."""
    now = datetime.now(UTC)
    window_end = (now + timedelta(seconds=35)).replace(microsecond=0)  # the window has seconds
    window = f"{(now - timedelta(minutes=10)):%H:%M:%S}-{window_end:%H:%M:%S}"
    h = hub_factory(
        simulate="RTX-4090:1",
        extra_args=[
            "--SpotMarket.warning_seconds=2",
            "--SpotMarket.tick_interval=0.5",
            "--SpotMarket.timezone=UTC",
            "--SpotMarket.weekends_low=False",
            f"--SpotMarket.low_price_windows={window}",
        ],
    )
    assert h.api("GET", "/gpulab/spot/prices").json()["low_price_windows"] == [window]
    user = h.create_user()
    pin(h, "rtx-4090", "0.30")
    h.spawn_ready(user, spot("0.60", windows_only=True))
    assert h.free("rtx-4090") == 0
    assert time.time() < window_end.timestamp(), "the server started after the window"
    status = h.api("GET", f"/gpulab/spot/status/{user}").json()
    assert status["windows_only"] and status["low_price_window"] and not status["preemption"]

    # The window ends: the warning, with its reason, then the stop at the deadline.
    p = wait_for(
        lambda: h.api("GET", f"/gpulab/spot/status/{user}").json()["preemption"],
        timeout=window_end.timestamp() - time.time() + 10,
        interval=0.2,
        what="the warning at the window's end",
    )
    assert p["reason"] == "low-price-window-ended" and p["status"] == "warning"
    assert window_end.timestamp() - 0.1 <= p["warned_at"] <= window_end.timestamp() + 3
    assert p["deadline"] == pytest.approx(p["warned_at"] + 2, abs=0.01)
    wait_for(lambda: h.server(user) is None, timeout=20, what="the stop at the deadline")
    record = preemptions(h, user)[-1]
    assert record["status"] == "stopped" and record["stopped_at"] >= record["deadline"]
    assert h.free("rtx-4090") == 1
    assert h.api("GET", "/gpulab/spot/prices").json()["low_price_window"] is False


def test_a_preemption_whose_own_checkpoint_fails_is_not_compensated(hub: Hub) -> None:
    """Attack 03: a user's checkpoint that fails on its own (``exit 3``) must not turn a reclaim
    into a refund of the session. The record says why; billing holds no compensation."""
    from billing.client import Billing

    billing = Billing(hub)
    user = hub.create_user()
    r = hub.api(
        "PUT", f"/gpulab/spot/settings/{user}", json={"checkpoint_command": "echo half; exit 3"}
    )
    assert r.status_code == 200, r.text
    pin(hub, "rtx-4090", "0.30")
    hub.spawn_ready(user, spot("0.40"))
    with hub.kernel(user) as k:
        k.execute("x = sum(range(10))")  # some billed time a refund would cover
    pin(hub, "rtx-4090", "0.60")  # above the bid: warned, then reclaimed at the deadline
    wait_for(lambda: hub.server(user) is None, timeout=WARNING + 20, what="the reclaim")
    record = wait_for(
        lambda: (r := preemptions(hub, user)[-1])["compensation"] and r,
        timeout=30,
        interval=0.2,
        what="the compensation decision",
    )
    assert record["checkpoint"]["state"] == "failed" and record["checkpoint"]["exit_code"] == 3
    assert record["compensation"] == {
        "due": False,
        "reason": "no compensation: your checkpoint command exited 3",
    }
    assert record["stop_sent_at"] >= record["deadline"]
    wait_for(lambda: billing.usage(user)["servers"], 30, 0.5, "the session in billing")
    assert [c for s in billing.usage(user)["servers"] for c in s.get("compensations", [])] == []
