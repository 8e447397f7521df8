"""Storage billing end to end: a real hub measures real homes, its billing service meters them
(issue 23, part D).

Points of issue 23 covered (each test fails on the code before part D: billing charged nothing
for storage, had no storage line, and nothing stopped a user in storage debt):

- "billing meters GB-days from what the hub measures (not what the user reports), shows it on
  the statement as its own line": a user above the free size is charged, per piece of time the
  hub's measurements cover, exactly what the catalog's price per GB-day says for those bytes
  (computed here from the recorded pieces, not hard-coded); the statement (JSON, CSV, page)
  has a Storage line per day and the balance went down by it; a free-tier user pays 0.
- "never counted twice, never skipped": billing SIGKILLed mid-interval (twice) and restarted by
  the hub charges the elapsed time once: the charged pieces tile the time with no gap and no
  overlap, and the ledger holds each once.
- "the enforcer's money rules apply to it": a user whose storage takes the balance below zero
  cannot start a server (402) nor raise their quota (402); lowering it is allowed; nothing in
  the home is deleted.
- "No request fees": only bytes x time is charged (the pieces say so; the statement says so).
- Bytes parked in an unfinished upload (outside the home) are billed like the home's own.
"""

from __future__ import annotations

import itertools
import os
import time
from datetime import datetime
from decimal import Decimal

import pytest
from billing.client import Billing, user_token
from harness import (
    FAST_BILLING_ENV,
    PASSWORD,
    REPO,
    Hub,
    approved_user,
    browser_log_in,
    catalog_with,
    wait_for,
)

from gpulab.billing_service.rating import GIB, US_PER_DAY, round_div

MiB = 2**20
FREE_GB = "0.0625"  # 64 MiB
MAX_GB = "4"
# A price that makes seconds visible: 0.4375 GB above the free size costs 0.004375 a second.
PRICE = "864.00"
INTERVAL = 2.0  # billing reads the hub's storage scan every ~2 s here
SHOTS = REPO / "artifacts" / "screenshots"


def tiny_catalog(folder):
    return catalog_with(
        folder, free_gb=Decimal(FREE_GB), max_gb=Decimal(MAX_GB), price_per_gb_day=PRICE
    )


@pytest.fixture(scope="module")
def sbhub(module_hub_factory, tmp_path_factory) -> Hub:
    hub = module_hub_factory(
        "billing-storage",
        simulate="RTX-4090:1",
        catalog=tiny_catalog(tmp_path_factory.mktemp("billing-storage-catalog")),
        # The interval through its setting (the managed service gets it from the hub).
        env={**FAST_BILLING_ENV, "GPULAB_BILLING_STORAGE_INTERVAL": str(INTERVAL)},
        extra_args=["--StorageAPI.cache_seconds=0"],
    )
    wait_for(Billing(hub).up, 60, 0.2, "the billing service")
    return hub


def with_home(hub: Hub, name: str | None = None) -> str:
    """A user whose home exists (made by their first start, as for everyone)."""
    name = hub.create_user(name)
    hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
    hub.stop_server(name)
    return name


def set_quota(hub: Hub, name: str, gb: str, token: str | None = None):
    return hub.api("POST", f"/users/{name}/storage", token=token, json={"quota_gb": float(gb)})


def raise_quota(hub: Hub, name: str, gb: str, token: str | None = None):
    """Raise (or lower) the quota of a home no server uses. Where the kernel refuses online resizing (this
    runner: no CAP_SYS_RESOURCE) a home image grows offline, and a server that has just stopped
    may still hold it for a moment (409, "in use"): asked again until it is free."""

    def done():
        r = set_quota(hub, name, gb, token)
        return r if r.status_code != 409 else None

    r = wait_for(done, 30, 1.0, f"{name}'s home to be free to grow")
    assert r.status_code == 200, r.text
    return r


def pieces(billing: Billing, name: str) -> list[dict]:
    r = billing.get(f"api/v1/users/{name}/storage", params={"from": "2000-01-01"})
    assert r.status_code == 200, r.text
    return r.json()["pieces"]


def day_amounts(ps: list[dict]) -> dict[str, int]:
    """Each day's amount in micro-units, computed here from the pieces and the catalog's price:
    bytes x microseconds x price per GB-day / (GB x microseconds per day), rounded once a day."""
    price = int(Decimal(PRICE) * 1_000_000)
    exact: dict[str, int] = {}
    for p in ps:
        us = round(p["to"] * 1e6) - round(p["from"] * 1e6)
        exact[p["date"]] = exact.get(p["date"], 0) + p["billable_bytes"] * us * price
    return {d: round_div(e, GIB * US_PER_DAY) for d, e in exact.items()}


def assert_tiled(ps: list[dict]) -> None:
    """The pieces follow each other with no gap and no overlap."""
    for a, b in itertools.pairwise(ps):
        assert b["from"] == a["to"], f"gap or overlap between {a} and {b}"
        assert b["to"] > b["from"]


def ledger_storage(billing: Billing, name: str) -> list[tuple[str, int]]:
    with billing.db() as db:
        return db.execute(
            "SELECT idempotency_key, amount_micro FROM ledger WHERE user = ? AND kind = 'storage'",
            (name,),
        ).fetchall()


def test_storage_above_the_free_size_is_charged_for_the_time_measured(sbhub) -> None:
    hub, billing = sbhub, Billing(sbhub)
    name = with_home(hub)
    billing.credit(name, "1000.00", kind="topup")  # one day of the new size must be payable
    t0 = time.time()
    raise_quota(hub, name, "0.5")
    billable = int(Decimal("0.5") * GIB) - int(Decimal(FREE_GB) * GIB)
    time.sleep(0.1)

    def covered(seconds: float):
        ps = pieces(billing, name)
        return ps if ps and ps[-1]["to"] - ps[0]["from"] >= seconds else None

    ps = wait_for(lambda: covered(12), 60, 0.5, "12 s of storage charged")
    assert_tiled(ps)
    assert {p["billable_bytes"] for p in ps} == {billable}
    assert {Decimal(p["price_per_gb_day"]) for p in ps} == {Decimal(PRICE)}
    # Held from the first scan after the raise, never before it.
    assert t0 - 0.5 <= ps[0]["from"] <= t0 + 3 * INTERVAL
    # The charge: exactly what the pieces cost at the catalog's price, day by day.
    expected = day_amounts(ps)
    charged = {}
    for p in ps:
        charged[p["date"]] = charged.get(p["date"], 0) + p["charged"]["micro"]
    assert charged == expected and sum(expected.values()) > 0
    seconds = ps[-1]["to"] - ps[0]["from"]
    per_second = Decimal(billable) / GIB * Decimal(PRICE) / 86400
    assert abs(Decimal(sum(expected.values())) / 10**6 - per_second * Decimal(seconds)) < Decimal(
        "0.00001"
    )
    # The ledger holds each piece once (its key), and the balance went down by exactly that.
    entries = ledger_storage(billing, name)
    assert len({k for k, _ in entries}) == len(entries)
    assert -sum(a for _, a in entries) >= sum(expected.values())

    def agreed():
        # Charges keep coming: the statement and the balance are read until they agree.
        u = billing.usage(name)
        bal = billing.balance(name)["balance"]["micro"]
        spent = u["total"]["amount"]["micro"] + u["storage"]["total"]["micro"]
        return u if bal == 10_000_000 + 1_000_000_000 - spent else None

    usage = wait_for(agreed, 30, 0.3, "the balance to match the statement")
    # The statement has its own Storage line, in JSON and in the CSV.
    (day,) = [d for d in usage["storage"]["days"] if d["date"] == ps[-1]["date"]]
    assert Decimal(day["gb_days"]) > 0 and usage["storage"]["free_gb"] == FREE_GB
    csv = billing.get("statement.csv", params={"user": name, "from": "2000-01-01"}).text
    rows = [line for line in csv.splitlines() if ",storage," in line]
    assert rows and "GB-days" in rows[-1], csv


def test_a_free_tier_user_pays_nothing_for_storage(sbhub) -> None:
    hub, billing = sbhub, Billing(sbhub)
    name = with_home(hub)
    # Scans come and go: the home is measured (the meter moves) and nothing is charged.
    t = time.time()

    def measured_since():
        x = billing.get(f"api/v1/users/{name}/storage").json()
        at = x["home"] and datetime.fromisoformat(x["home"]["measured_at"].replace("Z", "+00:00"))
        return x if at and at.timestamp() > t else None

    r = wait_for(measured_since, 30, 0.5, "a measurement of the free home")
    assert r["home"]["billable_bytes"] == 0
    time.sleep(3 * INTERVAL)
    assert pieces(billing, name) == [] and ledger_storage(billing, name) == []
    usage = billing.usage(name)
    assert usage["storage"]["days"] == [] and usage["storage"]["total"]["micro"] == 0


# Run in the user's own server: its own token (readable by any code there) tries to hand billing
# storage figures, to make it pull, and to post a storage "event".
FORGE = """
import json, os, urllib.request, urllib.error
base = os.environ["GPULAB_BILLING_URL"] + "api/v1/"
token = os.environ["JUPYTERHUB_API_TOKEN"]
user = os.environ["JUPYTERHUB_USER"]
figures = {"used_bytes": 0, "quota_bytes": 0, "datasets_bytes": 0, "measured_at": 1e10}
event = {"id": "forged-storage", "kind": "storage", "user": user, "server": "", "t": 1, **figures}
out = []
for method, path, body in (
    ("POST", "storage/pull", {"homes": [{"user": user, **figures}]}),
    ("POST", f"users/{user}/storage", figures),
    ("PUT", f"users/{user}/storage", figures),
    ("POST", "events", {"events": [event]}),
):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method,
                                 headers={"Authorization": "token " + token})
    try:
        out.append(urllib.request.urlopen(req, timeout=30).status)
    except urllib.error.HTTPError as e:
        out.append(e.code)
print(json.dumps(out))
"""


def test_a_users_server_cannot_hand_billing_storage_figures(sbhub) -> None:
    hub, billing = sbhub, Billing(sbhub)
    name = with_home(hub)
    billing.credit(name, "1000.00", kind="topup")
    raise_quota(hub, name, "0.5")
    hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
    wait_for(lambda: len(pieces(billing, name)) >= 1, 60, 0.5, "storage charges")
    with hub.kernel(name) as k:
        codes = k.execute(FORGE, timeout=120).strip().splitlines()[-1]
    assert codes == "[403, 405, 405, 400]", codes
    # The charge still follows the hub's measurement, at the raised quota.
    level = int(Decimal("0.5") * GIB) - int(Decimal(FREE_GB) * GIB)
    ps = wait_for(
        lambda: (x := pieces(billing, name))[-1]["to"] > time.time() - 2 * INTERVAL and x,
        30,
        0.5,
        "a charge after the attempt",
    )
    assert {p["billable_bytes"] for p in ps} == {level}
    hub.stop_server(name)


def test_billing_killed_mid_interval_charges_the_elapsed_time_once(sbhub) -> None:
    hub, billing = sbhub, Billing(sbhub)
    name = with_home(hub)
    billing.credit(name, "1000.00", kind="topup")
    raise_quota(hub, name, "0.5")
    before = wait_for(lambda: len(ps := pieces(billing, name)) >= 2 and ps, 60, 0.3, "charges")
    # SIGKILL mid-interval (a read may be under way), twice; the hub restarts the service.
    old = billing.kill()
    billing.wait_restarted(old)
    time.sleep(INTERVAL * 0.6)
    old = billing.kill()
    t_killed = time.time()
    billing.wait_restarted(old)
    after = wait_for(
        lambda: (ps := pieces(billing, name))[-1]["to"] > t_killed + INTERVAL and ps,
        90,
        0.5,
        "charges after the restart",
    )
    assert after[: len(before)] == before  # nothing charged before was changed
    assert_tiled(after)  # no gap across the kills, no overlap
    charged = {}
    for p in after:
        charged[p["date"]] = charged.get(p["date"], 0) + p["charged"]["micro"]
    assert charged == day_amounts(after)
    entries = ledger_storage(billing, name)
    assert len({k for k, _ in entries}) == len(entries)
    assert -sum(a for _, a in entries) == sum(charged.values())


def test_storage_debt_refuses_starts_and_raises_and_deletes_nothing(sbhub) -> None:
    hub, billing = sbhub, Billing(sbhub)
    name = with_home(hub)
    home = hub.data_dir / "users" / name
    kept = home / "thesis.txt"
    kept.write_text("keep me")
    billing.credit(name, "1000.00", kind="topup")
    raise_quota(hub, name, "1")
    # Leave 0.05: storage (0.0082 a second) takes the balance below zero within seconds.
    now = billing.balance(name)["balance"]["micro"]
    billing.credit(name, str(Decimal(50_000 - now) / 10**6), kind="adjustment")
    wait_for(lambda: billing.balance(name)["balance"]["micro"] < 0, 60, 0.5, "storage debt")
    info = billing.balance(name)
    assert info["storage"]["billable_bytes"] == GIB - int(Decimal(FREE_GB) * GIB)
    assert any("storage" in w and "nothing is deleted" in w for w in info["warnings"]), info
    r = hub.spawn(name, {"gpu": "none"})
    assert r.status_code == 402, r.text
    r = set_quota(hub, name, "2")
    assert r.status_code == 402 and "quota_gb" in r.text, r.text
    # Lowering the quota is always allowed (it stops the charge); nothing was deleted.
    r = set_quota(hub, name, FREE_GB)
    assert r.status_code == 200, r.text
    assert kept.read_text() == "keep me"
    assert hub.server(name) is None
    # Back at the free size the debt stops growing.
    wait_for(
        lambda: billing.get(f"api/v1/users/{name}/storage").json()["home"]["billable_bytes"] == 0,
        30,
        0.5,
        "the free size to be measured",
    )
    time.sleep(2 * INTERVAL)
    a = billing.balance(name)["balance"]["micro"]
    time.sleep(3 * INTERVAL)
    assert billing.balance(name)["balance"]["micro"] == a


def test_the_statement_page_shows_a_storage_line_per_day(sbhub, browser) -> None:
    hub, billing = sbhub, Billing(sbhub)
    name = approved_user(hub, "st")
    hub.create_user(name)  # in the hub's own table before the first log-in, to start a server
    hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
    hub.stop_server(name)
    billing.credit(name, "1000.00", kind="topup")
    token = user_token(hub, name)
    raise_quota(hub, name, "0.5", token=token)
    wait_for(lambda: len(pieces(billing, name)) >= 3, 60, 0.5, "storage charges")
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    browser_log_in(page, hub, name, PASSWORD)
    page.goto(billing.base)
    row = page.locator("#servers tr.storage").first
    row.wait_for()
    text = row.inner_text()
    usage = billing.usage(name, token)
    day = usage["storage"]["days"][-1]
    assert f"Storage above {FREE_GB} GB free" in text and "GB-days" in text, text
    assert f"CNY {PRICE}/GB-day" in text
    assert page.locator("#storage-total").inner_text() != ""
    assert "no request fees" in page.locator("#servers tfoot").inner_text()
    assert day["amount"]["micro"] > 0
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "statement-storage.png"), full_page=True)
    assert errors == []
    page.close()
    # The admin's view: storage revenue of every home, next to revenue per GPU type.
    page = browser.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    browser_log_in(page, hub, "admin", (hub.data_dir / "admin-password").read_text().strip())
    page.goto(f"{billing.base}?user={name}")
    shown = page.locator("#storage-revenue")
    shown.wait_for()
    overview = billing.get("api/v1/admin/overview").json()
    assert Decimal(shown.inner_text()) >= Decimal(day["amount"]["display"]) > 0
    assert overview["storage_revenue"]["micro"] >= day["amount"]["micro"]
    # The user's charges in the period count their storage too.
    charges = page.locator("#users tr", has_text=name).locator("td").nth(2).inner_text()
    assert Decimal(charges) >= Decimal(day["amount"]["display"])
    page.screenshot(path=str(SHOTS / "statement-storage-admin.png"), full_page=True)
    assert errors == []
    page.close()


@pytest.fixture(scope="module")
def slow_meter_hub(module_hub_factory, tmp_path_factory) -> Hub:
    """Billing reads the hub's storage scan once an hour here: only a quota change makes it read
    in between."""
    hub = module_hub_factory(
        "billing-storage-slow",
        catalog=tiny_catalog(tmp_path_factory.mktemp("billing-storage-slow-catalog")),
        env={**FAST_BILLING_ENV, "GPULAB_BILLING_STORAGE_INTERVAL": "3600"},
        extra_args=["--StorageAPI.cache_seconds=60"],
    )
    wait_for(Billing(hub).up, 60, 0.2, "the billing service")
    return hub


def test_a_quota_raised_and_lowered_between_billings_reads_is_billed(slow_meter_hub) -> None:
    """Attack (issue 23, "make the platform pay for your storage"): raise the quota, use it, and
    lower it again before billing's next periodic read (an hour here, ten minutes by default), so
    that billing never sees the larger quota. The hub asks billing to read right after a change
    and right before a lowering, so the time at the larger quota is charged; without that, no
    piece of it is. The hub's scan is cached for a minute here: the read after the change still
    sees the new quota."""
    hub, billing = slow_meter_hub, Billing(slow_meter_hub)
    name = with_home(hub)
    billing.credit(name, "1000.00", kind="topup")
    raise_quota(hub, name, "0.5")
    t_raised = time.time()
    held = 3.0
    time.sleep(held)  # the time held at the larger quota is what is measured, not a wait
    raise_quota(hub, name, FREE_GB)  # lowered (asked again while the home is "in use")
    t_lowered = time.time()
    billable = int(Decimal("0.5") * GIB) - int(Decimal(FREE_GB) * GIB)
    ps = pieces(billing, name)
    high = [p for p in ps if p["billable_bytes"] == billable]
    assert high, f"the larger quota was never billed: {ps}"
    seconds = sum(p["to"] - p["from"] for p in high)
    assert held - 0.5 <= seconds <= t_lowered - t_raised + 1.0, (seconds, ps)
    assert sum(p["charged"]["micro"] for p in high) > 0


def test_bytes_parked_in_an_unfinished_upload_are_billed(sbhub) -> None:
    """Red team (issue 23, "billing meters GB-days from what the hub measures"): a user at the
    free size starts a 60 MiB upload, sends all but its last byte (it lives outside the home
    image, never billed), then fills the home with 30 MiB more: 90 MiB held on 64 MiB free, and
    billing showed ``billable_bytes`` 0. The hub's scan now reports the pending bytes
    (``uploads_bytes``) and billing bills max(quota, used + datasets + uploads) - free.

    Fails on the old code: the hub's scan row had no ``uploads_bytes`` and billing's pieces
    stayed at 0 billable bytes while the upload was pending."""
    hub, billing = sbhub, Billing(sbhub)
    name = hub.create_user()
    billing.credit(name, "1000.00", kind="topup")
    size = 60 * MiB
    r = hub.api("POST", f"/users/{name}/uploads", json={"path": "parked.bin", "size": size})
    assert r.status_code == 201, r.text
    up = r.json()
    for at in range(0, size - 1, 8 * MiB):
        n = min(8 * MiB, size - 1 - at)
        r = hub.api(
            "PATCH",
            f"/users/{name}/uploads/{up['id']}",
            data=bytes([7]) * n,
            headers={"Upload-Offset": str(at), "Content-Type": "application/offset+octet-stream"},
        )
        assert r.status_code == 200 and not r.json()["complete"], r.text
    home = hub.data_dir / "users" / name
    filler = home / "filler.bin"
    filler.write_bytes(b"\1" * (30 * MiB))
    os.chown(filler, os.stat(home).st_uid, os.stat(home).st_gid)
    free = int(Decimal(FREE_GB) * GIB)

    rows = [h for h in hub.api("GET", "/storage").json()["homes"] if h["user"] == name]
    assert len(rows) == 1 and rows[0]["uploads_bytes"] >= size - 1, rows
    assert rows[0]["quota_bytes"] == free and rows[0]["used_bytes"] < free, rows
    held = rows[0]["used_bytes"] + rows[0]["uploads_bytes"]

    def billed_above_the_quota():
        ps = pieces(billing, name)
        return ps if ps and ps[-1]["billable_bytes"] > 0 else None

    ps = wait_for(billed_above_the_quota, 60, 0.5, "the pending upload's bytes to be billed")
    assert ps[-1]["billable_bytes"] >= held - free - MiB, (held - free, ps[-1])
    assert billing.get(f"api/v1/users/{name}/storage").json()["home"]["billable_bytes"] > 0
    # Cancelled and cleaned up: back to the free size, billed 0 again.
    assert hub.api("DELETE", f"/users/{name}/uploads/{up['id']}").status_code == 204
    filler.unlink()
    wait_for(
        lambda: billing.get(f"api/v1/users/{name}/storage").json()["home"]["billable_bytes"] == 0,
        30,
        0.5,
        "the free size to be measured again",
    )
