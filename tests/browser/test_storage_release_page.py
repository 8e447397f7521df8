"""A person warned that their home will be released sees it on the hub's home page, with the date
(issue 23, "users are warned before"), in headless Chromium with a clean console.

Failed on the code before part F: no warning was ever given, so the home page had nothing to show.
Set GPULAB_SCREENSHOTS=DIR to keep the page as a PNG file.
"""

from __future__ import annotations

import calendar
import os
import time
from pathlib import Path

from apps_helpers import Console
from harness import PASSWORD, REPO, approved_user, browser_log_in, wait_for
from playwright.sync_api import expect

DAY = 86400.0
SHOTS = os.environ.get("GPULAB_SCREENSHOTS")


def test_a_warned_user_sees_the_release_date_on_the_home_page(hub_factory, browser, tmp_path):
    """Points: the warning on the home page (the storage card's release line, from the storage
    API's ``release``) with the keeper's date; the console stays clean."""
    text = (REPO / "catalog" / "catalog.toml").read_text()
    text = text.replace("keep_days = 90\n", "keep_days = 3\n")
    text = text.replace("warn_days = [14, 3]\n", "warn_days = [2, 1]\n")
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(text)
    clock = tmp_path / "clock"
    clock.write_text("0")
    hub = hub_factory(
        "release-page",
        simulate="RTX-4090:1",
        catalog=catalog,
        extra_args=[
            "--StorageKeeper.interval=0.3",
            f"--StorageKeeper.clock_offset_file={clock}",
        ],
    )
    name = approved_user(hub, "rel")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    console = Console(page)
    browser_log_in(page, hub, name, PASSWORD)  # a hub user from the first log-in on
    hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
    hub.stop_server(name)

    def warned() -> bool:
        r = hub.api("GET", f"/gpulab/users/{name}/notices")
        return any(n["kind"] == "storage-release" for n in r.json()["notices"])

    wait_for(lambda: (hub.data_dir / "storage" / "keeper.json").exists(), 60, what="a round")
    clock.write_text(str(1.2 * DAY))
    wait_for(warned, 60, what="the warning")
    # Warned at day 1.2 (a round late) for the 2-day warning: the release moves to day 3.2.
    release = hub.api("GET", f"/users/{name}/storage").json()["release"]
    at = calendar.timegm(time.strptime(release["at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert abs(at - (time.time() + 3.2 * DAY)) < 120, release  # real clock + 1.2 d + 2 d
    assert release["days_left"] == 2
    release_day = release["at"][:10]

    try:
        page.goto(f"{hub.url}/hub/home")
        line = page.locator("#gpulab-storage-release")
        expect(line).to_be_visible(timeout=30_000)
        expect(line).to_contain_text(release_day)
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(SHOTS) / "home-release-warning.png"), full_page=True)
        assert console.seen == []
    finally:
        page.close()
