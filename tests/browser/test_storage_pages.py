"""Issue 23, "visible": a home's usage against its quota on the hub's pages, in headless Chromium.

Points of the issue this covers (each failed on the old pages: there was no Storage card, no admin
view and no storage figure anywhere, so every locator below timed out):

- the home page's Storage card shows used / quota with a bar and %, the free size and the price
  per GB-day, a plain notice at 80 % (warn) and 95 % (critical), and "not enforced" on a hub
  whose homes are plain folders;
- raising the quota shows the hub's price of the new size per day first (a confirm step), and
  only the confirmation changes it;
- an admin's view of the largest homes (``/hub/gpulab/storage``, linked from the navbar).

The figures are the hub's own measurement of a home the user filled from their own kernel. Set
GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import (
    FAST_BILLING_ENV,
    PASSWORD,
    SLOW,
    Hub,
    WebSession,
    approved_user,
    browser_log_in,
    catalog_with,
    wait_for,
)

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")
GiB = 2**30


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        path = str(Path(SHOTS) / f"{name}.png")
        page.screenshot(path=path, full_page=True, animations="disabled")


def tiny_catalog(folder: Path) -> Path:
    """The shipped catalog with a 64 MiB free home (tests fill it in seconds), CNY 2 per GB-day."""
    return catalog_with(folder, free_gb=0.0625, max_gb=4, price_per_gb_day="2.00")


@pytest.fixture(scope="module")
def vhub(module_hub_factory, tmp_path_factory) -> Hub:
    return module_hub_factory(
        "storage-pages",
        simulate="RTX-4090:1",
        catalog=tiny_catalog(tmp_path_factory.mktemp("storage-pages")),
        env=FAST_BILLING_ENV,
        extra_args=["--StorageAPI.cache_seconds=1"],
    )


def storage(hub: Hub, name: str) -> dict:
    r = hub.api("GET", f"/users/{name}/storage")
    assert r.status_code == 200, r.text
    return r.json()


def fill_to(hub: Hub, name: str, percent: float, tag: str) -> dict:
    """Write (from the user's own kernel) what brings the home to ``percent`` of its quota, as the
    hub measures it; the storage answer once it does."""
    now = storage(hub, name)
    want = int(now["home"]["quota_bytes"] * percent / 100)
    need = want - now["home"]["used_bytes"] - now["datasets_bytes"]
    assert need > 0, now
    code = (
        "import os\n"
        f"left = {need}\n"
        f"with open('fill-{tag}.bin', 'wb') as f:\n"
        "    while left > 0:\n"
        "        n = min(left, 1 << 20); f.write(os.urandom(n)); left -= n\n"
        "    f.flush(); os.fsync(f.fileno())\n"
        "print('ok')"
    )
    with hub.kernel(name) as k:
        assert k.execute(code, timeout=120).strip() == "ok"
    return wait_for(
        lambda: (s := storage(hub, name))["percent"] >= percent - 1 and s,
        30,
        0.5,
        f"{name}'s home at {percent} %",
    )


def open_page(browser, hub: Hub, name: str, password: str, path: str):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    browser_log_in(page, hub, name, password, timeout=SLOW)
    page.goto(f"{hub.url}{path}")
    return context, page, errors


def card_level(page) -> str:
    return page.locator("#gpulab-storage .gpulab-storage-bar").get_attribute("data-level")


def test_the_storage_card_prices_a_raise_and_shows_usage_and_notices(vhub: Hub, browser) -> None:
    hub = vhub
    name = approved_user(hub, "disk")
    context, page, errors = open_page(browser, hub, name, PASSWORD, "/hub/home")
    try:
        used = page.locator("#gpulab-storage-used")
        used.filter(has_text="of 64.0 MB").wait_for(timeout=SLOW)
        assert card_level(page) == "ok"
        assert page.locator("#gpulab-storage-notice").count() == 0
        details = page.locator("#gpulab-storage-details").inner_text()
        assert "0.0625 GB free; above it CNY 2.00 per GB a day, no request fees." in details
        assert "Your quota costs nothing." in details
        shot(page, "storage-home-0")

        # A bad size is refused by the hub, in its words, and changes nothing (the browser logs
        # the refused request itself).
        page.fill("#gpulab-storage-quota", "lots")
        page.click("#gpulab-storage-price")
        answer = page.locator("#gpulab-storage-answer")
        answer.filter(has_text="must be a number of GB").wait_for(timeout=SLOW)
        assert page.locator("#gpulab-storage-yes").count() == 0
        assert storage(hub, name)["home"]["quota_bytes"] == GiB // 16
        assert len(errors) == 1 and "status of 400" in errors[0], errors
        errors.clear()

        # Raising the quota: the hub's price for the size first, the change only once confirmed.
        page.fill("#gpulab-storage-quota", "0.125")
        page.click("#gpulab-storage-price")
        quote = page.locator("#gpulab-storage-quote")
        quote.wait_for(timeout=SLOW)
        # (0.125 - 0.0625) GB x CNY 2.00 a day, as the hub priced it (0.1250).
        text = quote.inner_text()
        assert "0.125 GB will cost CNY 0.13 a day (64.0 MB above the free 0.0625 GB)" in text, text
        assert storage(hub, name)["home"]["quota_bytes"] == GiB // 16  # nothing changed yet
        shot(page, "storage-home-confirm")
        page.click("#gpulab-storage-yes")
        answer.filter(has_text="Your quota is now 0.125 GB.").wait_for(timeout=SLOW)
        assert storage(hub, name)["home"]["quota_bytes"] == GiB // 8
        used.filter(has_text="of 128.0 MB").wait_for(timeout=SLOW)
        assert (
            "Your quota costs CNY 0.13 a day."
            in page.locator("#gpulab-storage-details").inner_text()
        )
        shot(page, "storage-home-raised")

        # The home as the hub measures it, filled from the user's own kernel.
        hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
        answer_now = storage(hub, name)
        page.reload()
        used.filter(has_text="of 128.0 MB").wait_for(timeout=SLOW)
        # A hub without quota enforcement says so; one with it says nothing more once started.
        loose = page.locator("#gpulab-storage-not-enforced, #gpulab-storage-not-yet").count()
        assert loose == (0 if answer_now["home"]["enforced"] else 1)
        assert (not answer_now["enforced"]) == (
            page.locator("#gpulab-storage-not-enforced").count() == 1
        )

        # ~85 %: a warning in plain words, the bar turns amber.
        s = fill_to(hub, name, 86, "a")
        assert 80 <= s["percent"] < 95, s
        page.reload()
        notice = page.locator("#gpulab-storage-notice")
        notice.wait_for(timeout=SLOW)
        assert notice.get_attribute("data-level") == "warn" and card_level(page) == "warn"
        assert f"Your home is {round(s['percent'])} % full" in notice.inner_text()
        shot(page, "storage-home-85")

        # ~96 %: critical, and what happens next is said.
        s = fill_to(hub, name, 97, "b")
        assert 95 <= s["percent"] < 100, s
        page.reload()
        notice.filter(has_text="Delete files").wait_for(timeout=SLOW)
        assert notice.get_attribute("data-level") == "critical" and card_level(page) == "critical"
        if s["home"]["enforced"]:
            assert "No space left on device" in notice.inner_text()
        shot(page, "storage-home-96")
        assert not errors, errors
    finally:
        context.close()
        if hub.server(name) is not None:
            hub.stop_server(name)


def test_the_admin_sees_the_largest_homes(vhub: Hub, browser) -> None:
    hub = vhub
    name = approved_user(hub, "big")
    assert WebSession(hub).login(name, PASSWORD)  # a first log-in makes the hub's user
    hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
    try:
        fill_to(hub, name, 90, "c")
    finally:
        hub.stop_server(name)
    listed = wait_for(
        lambda: (
            (h := hub.api("GET", "/storage").json()["homes"])
            and name in [r["user"] for r in h]
            and h
        ),
        30,
        0.5,
        "the list to have the new home",
    )
    admin_password = (hub.data_dir / "admin-password").read_text().strip()
    context, page, errors = open_page(browser, hub, "admin", admin_password, "/hub/home")
    try:
        page.click("#gpulab-nav-storage")
        page.wait_for_url(f"{hub.url}/hub/gpulab/storage", timeout=SLOW)
        row = page.locator(f'#gpulab-storage-homes tbody tr[data-home="{name}"]')
        row.wait_for(timeout=SLOW)
        cells = row.locator("td").all_inner_texts()
        assert cells[0] == name and cells[2] == "64.0 MB" and cells[3] in ("89 %", "90 %"), cells
        assert cells[6] in ("yes", "no") and cells[7]
        # Largest first, as the hub measured them.
        shown = page.locator("#gpulab-storage-homes tbody tr td:first-child").all_inner_texts()
        assert shown == [h["user"] or f"{h['name']} (no such user)" for h in listed], shown
        assert [h["used_bytes"] for h in listed] == sorted(
            (h["used_bytes"] for h in listed), reverse=True
        )
        summary = page.locator("#gpulab-storage-summary").inner_text()
        assert "homes" in summary and "per GB-day" in summary
        shot(page, "storage-admin")
        assert not errors, errors
    finally:
        context.close()


def test_jupyterlab_shows_the_home_in_the_status_bar(vhub: Hub, browser) -> None:
    """JupyterLab's status bar: "Home USED / QUOTA GB" from the hub's figure (read with the
    server's own token), amber with one warning at 80 %, red with an error at 95 %."""
    hub = vhub
    name = approved_user(hub, "lab")
    context, page, errors = open_page(browser, hub, name, PASSWORD, "/hub/home")
    try:
        hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
        s = fill_to(hub, name, 86, "lab-a")
        page.goto(hub.user_url(name, "lab"), timeout=SLOW)
        item = page.locator("#gpulab-storage-status")
        item.filter(has_text="/ 0.0625 GB").wait_for(timeout=SLOW)
        held = (s["home"]["used_bytes"] + s["datasets_bytes"]) / GiB
        assert item.inner_text() == f"Home {held:.4f}".rstrip("0") + " / 0.0625 GB"
        assert item.get_attribute("data-level") == "warn"
        assert "jp-gpulab-storage-warn" in (item.get_attribute("class") or "")
        assert "measured by the hub" in (item.get_attribute("title") or "")
        toast = page.get_by_text(f"Your home is {round(s['percent'])} % full")
        toast.first.wait_for(timeout=SLOW)
        assert toast.count() == 1  # one notification for the level
        shot(page, "storage-lab-85")

        s = fill_to(hub, name, 97, "lab-b")
        page.reload()
        item.wait_for(timeout=SLOW)
        page.wait_for_function(
            "() => document.querySelector('#gpulab-storage-status')?.dataset.level === 'critical'",
            timeout=SLOW,
        )
        page.get_by_text(f"Your home is {round(s['percent'])} % full").first.wait_for(timeout=SLOW)
        assert "jp-gpulab-storage-critical" in (item.get_attribute("class") or "")
        shot(page, "storage-lab-96")
        assert not [e for e in errors if "storage" in e.lower()], errors
    finally:
        context.close()
        if hub.server(name) is not None:
            hub.stop_server(name)
