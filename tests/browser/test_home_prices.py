"""Issue 22, "one price everywhere", on the hub's home page in headless Chromium.

Points of the issue this covers (each failed on the old page):

- picking an RTX 4090 on the JupyterLab tile left "Now: No GPU at CNY 0.09 per hour": the "Now:"
  line now follows the GPU choice and the Spot box (at the spot price in force, 0.51);
- the GPU dropdown offered types with 0 free cards: such a type is shown disabled, "0 free";
- after an error the tile forgot the chosen GPU, the Spot box and the price: they stay;
- a course student's home page said 0.68 per hour where billing charges the education price
  0.48: the tile and the free-cards table say 0.48 (education price), and so do the pool and
  catalog answers the JupyterLab switch dialog and no-GPU toggle read;
- the status bar said 0.68 to that student, and a spot server's tooltip the on-demand price
  while spot was 0.51: it says 0.48, and on spot "Price: CNY 0.51/h (spot, now)".

The prices on the page all come from the hub's plans (``launch_plan.plan_table``) and the one
price function billing rates by (``catalog/pricing.py``); tests/unit/test_one_price.py proves
that function agrees with billing. Set GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from course_helpers import make_course, token_for
from harness import FAST_BILLING_ENV, PASSWORD, SLOW, Hub, approved_user, browser_log_in, page_error

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")
LAB = '.gpulab-app-tile[data-app="jupyterlab"]'


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def phub(module_hub_factory) -> Hub:
    """Two simulated RTX 4090s and one A100 (which a test keeps busy), spot RTX 4090 at 0.51."""
    hub = module_hub_factory("home-prices", simulate="RTX-4090:2,A100-80G:1", env=FAST_BILLING_ENV)
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.51"})
    assert r.status_code == 200, r.text
    return hub


def open_home(browser, hub: Hub, name: str):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if page_error(m) else None)
    browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)
    page.goto(f"{hub.url}/hub/home")
    page.locator(f"{LAB} .gpulab-plan").wait_for(timeout=SLOW)
    return context, page, errors


def plan(page) -> str:
    return page.locator(f"{LAB} .gpulab-plan").inner_text()


def test_the_tile_follows_the_choices_and_keeps_them_after_an_error(phub: Hub, browser) -> None:
    # Someone holds the only A100: it has 0 free cards.
    holder = phub.create_user()
    phub.spawn_ready(holder, {"gpu": "a100-80g"})
    name = approved_user(phub, "price")
    context, page, errors = open_home(browser, phub, name)
    try:
        tile = page.locator(LAB)
        assert plan(page) == "Now: No GPU at CNY 0.09 per hour"
        # The A100 is offered disabled, saying it has no free card; the RTX 4090 says 2 free.
        a100 = tile.locator('.gpulab-gpu option[value="a100-80g"]')
        assert a100.is_disabled() and "0 free" in a100.inner_text()
        rtx = tile.locator('.gpulab-gpu option[value="rtx-4090"]')
        assert rtx.is_enabled() and "2 free" in rtx.inner_text()
        shot(page, "home-tile-default")

        # Picking the RTX 4090 moves the "Now:" line to it; ticking Spot to the spot price.
        tile.locator(".gpulab-gpu").select_option("rtx-4090")
        assert plan(page) == "Now: RTX 4090 at CNY 0.68 per hour"
        tile.locator(".gpulab-spot").check()
        assert plan(page) == "Now: RTX 4090 at CNY 0.51 per hour (spot price now)"
        # Your price per hour in the free-cards table is the on-demand one for this user.
        row = page.locator('#gpulab-pool tr[data-gpu="rtx-4090"]').inner_text()
        assert "CNY 0.68" in row and "CNY 0.51" in row
        assert not errors, errors
        shot(page, "home-tile-rtx-spot")

        # A launch the market refuses (a max price under the spot price, no queue): the error
        # shows and the tile keeps the GPU, the Spot box, the max price and the price.
        tile.locator(".gpulab-max-price").fill("0.10")
        tile.locator(".gpulab-launch").click()
        page.locator("#gpulab-launch-error").filter(has_text=re.compile(r"\S")).wait_for(
            timeout=SLOW
        )
        tile = page.locator(LAB)
        assert tile.locator(".gpulab-gpu").input_value() == "rtx-4090"
        assert tile.locator(".gpulab-spot").is_checked()
        assert tile.locator(".gpulab-max-price").input_value() == "0.10"
        assert plan(page) == "Now: RTX 4090 at CNY 0.51 per hour (spot price now)"
        assert phub.server(name) is None
        # And after the page's next refresh of the home data (every 5 s) too.
        with page.expect_response(lambda r: r.url.endswith("/home"), timeout=SLOW):
            pass
        assert page.locator(LAB).locator(".gpulab-gpu").input_value() == "rtx-4090"
        assert plan(page) == "Now: RTX 4090 at CNY 0.51 per hour (spot price now)"
        shot(page, "home-tile-after-error")
    finally:
        context.close()
        phub.stop_server(holder)


def test_a_course_student_sees_the_education_price(phub: Hub, browser) -> None:
    teacher = approved_user(phub, "teach")
    course = "prices101"
    make_course(phub, course, [teacher], gpu_types=["none", "rtx-4090"], images=["base"])
    student = phub.create_user(approved_user(phub, "stud"))  # a hub user before the first log-in
    r = phub.api("POST", f"/groups/{course}/users", json={"users": [student]})
    assert r.status_code == 200, r.text
    context, page, errors = open_home(browser, phub, student)
    try:
        tile = page.locator(LAB)
        tile.locator(".gpulab-gpu").select_option("rtx-4090")
        assert plan(page) == "Now: RTX 4090 at CNY 0.48 per hour (education price)"
        row = page.locator('#gpulab-pool tr[data-gpu="rtx-4090"]').inner_text()
        assert "CNY 0.48 (education)" in row and "0.68" not in row
        # Spot course sessions pay the spot price, as billing rates them.
        tile.locator(".gpulab-spot").check()
        assert plan(page) == "Now: RTX 4090 at CNY 0.51 per hour (spot price now)"
        assert not errors, errors
        shot(page, "home-student")
    finally:
        context.close()
    # The pool and catalog answers (the JupyterLab switch dialog's and no-GPU toggle's prices)
    # give the student their own prices too; another user the on-demand ones.
    token = token_for(phub, student)
    for path in ("/gpulab/pool", "/gpulab/catalog"):
        yours = phub.api("GET", path, token=token).json()["your_prices"]
        assert yours["gpu_types"]["rtx-4090"]["price_per_hour"] == "0.48"
        assert yours["no_gpu"] == {"price_per_hour": "0.05", "price_kind": "education"}
    other = token_for(phub, teacher)
    yours = phub.api("GET", "/gpulab/pool", token=other).json()["your_prices"]
    assert yours["gpu_types"]["rtx-4090"] == {"price_per_hour": "0.68", "price_kind": "on-demand"}


def status_bar(browser, hub: Hub, name: str, shot_name: str) -> tuple[str, str]:
    """(price text, tooltip) of the gpulab status bar in ``name``'s JupyterLab, once the spot
    status (on spot) has been read."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)
        page.goto(hub.user_url(name, "lab"), timeout=SLOW)
        item = page.locator("#gpulab-status")
        # The tooltip's price line is there once the status (and on spot its price) is read.
        page.locator('#gpulab-status[title*="Price: CNY"]').wait_for(timeout=SLOW)
        if SHOTS:
            page.locator(".jp-Launcher").first.wait_for(timeout=SLOW)
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(SHOTS) / f"{shot_name}.png"))
        return item.locator(".jp-gpulab-price").inner_text(), item.get_attribute("title")
    finally:
        context.close()


def test_the_status_bar_shows_the_price_billing_charges(phub: Hub, browser) -> None:
    """Filed: the status bar said 0.68 to a course student billed 0.48, and a spot server's
    tooltip said "Price: CNY 0.68/h (spot)" while spot was 0.51."""
    name = approved_user(phub, "spotbar")
    phub.create_user(name)
    phub.spawn_ready(name, {"gpu": "rtx-4090", "pricing": "spot"})
    try:
        # The tooltip waits for the hub's spot price: the on-demand price never shows.
        page_price, title = status_bar(browser, phub, name, "statusbar-spot")
        assert page_price == "spot CNY 0.51/h (max 0.68)"
        assert "Price: CNY 0.51/h (spot, now)" in title, title
        assert "0.68/h (spot)" not in title
    finally:
        phub.stop_server(name)

    teacher = approved_user(phub, "teach")
    make_course(phub, "bar101", [teacher], gpu_types=["none", "rtx-4090"], images=["base"])
    student = phub.create_user(approved_user(phub, "stud"))
    r = phub.api("POST", "/groups/bar101/users", json={"users": [student]})
    assert r.status_code == 200, r.text
    phub.spawn_ready(student, {"gpu": "rtx-4090"})
    try:
        page_price, title = status_bar(browser, phub, student, "statusbar-student")
        assert page_price == "CNY 0.48/h" and "Price: CNY 0.48/h (on-demand)" in title, title
    finally:
        phub.stop_server(student)
