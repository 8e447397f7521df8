"""Issue 22, "bad input is never silently fixed" and "messages a person can read", in headless
Chromium on the home page's app tile and the spawn form.

Points of the issue this covers (each failed on the old pages):

- a max price of ``abc`` on the tile was dropped (a number field hands it over as "") and the
  server started at the default price: now the tile says, in plain words, what is wrong, and
  nothing starts;
- a max price of 9 for an RTX 4090 (0.68/h) started at once: the tile and the form now ask the
  person to confirm it, and start it once confirmed;
- a routine refusal (a max price under the spot price) showed the API's text (``max_price``,
  ``"wait": true in the API``): the tile and the form show the plain sentence.

Set GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from harness import PASSWORD, SLOW, Hub, approved_user, browser_log_in, wait_for

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")
LAB = '.gpulab-app-tile[data-app="jupyterlab"]'
API_WORDS = ("max_price", '"wait"', "in the API", 'gpu: "none"', "Invalid launch option")


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def mhub(module_hub_factory) -> Hub:
    hub = module_hub_factory("plain-messages", simulate="RTX-4090:2,A100-80G:1")
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.51"})
    assert r.status_code == 200, r.text
    return hub


def open_page(browser, hub: Hub, name: str, path: str):
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)
    page.goto(f"{hub.url}{path}")
    return context, page, console


def unexpected(console: list[str]) -> list[str]:
    """Console errors other than Chromium's line for a refusal the test asked for (4xx)."""
    refusal = re.compile(r"status of (400|409)")
    return [line for line in console if not refusal.search(line)]


def launch_error(page) -> str:
    error = page.locator("#gpulab-launch-error")
    error.filter(has_text=re.compile(r"\S")).wait_for(timeout=SLOW)
    return error.inner_text()


def spot_tile(page, max_price: str):
    tile = page.locator(LAB)
    tile.locator(".gpulab-gpu").select_option("rtx-4090")
    tile.locator(".gpulab-spot").check()
    tile.locator(".gpulab-max-price").fill(max_price)
    tile.locator(".gpulab-launch").click()
    return tile


def test_the_tile_refuses_unreadable_prices_and_confirms_absurd_ones(mhub: Hub, browser) -> None:
    name = approved_user(mhub, "tile")
    context, page, console = open_page(browser, mhub, name, "/hub/home")
    try:
        page.locator(f"{LAB} .gpulab-plan").wait_for(timeout=SLOW)
        spot_tile(page, "abc")
        text = launch_error(page)
        assert "The max price must be a positive number" in text and "“abc”" in text, text
        assert not any(w in text for w in API_WORDS), text
        assert mhub.server(name) is None
        shot(page, "tile-max-price-abc")

        # A routine refusal: under the spot price, and no queue asked for.
        spot_tile(page, "0.01")
        page.locator("#gpulab-launch-error").filter(has_text="did not start").wait_for(timeout=SLOW)
        text = page.locator("#gpulab-launch-error").inner_text()
        assert text.startswith("Your spot server did not start"), text
        assert not any(w in text for w in API_WORDS), text
        assert mhub.server(name) is None
        shot(page, "tile-spot-refused")

        # Nine times... thirteen times on-demand: asked, not taken.
        spot_tile(page, "9")
        yes = page.locator("#gpulab-confirm-yes")
        yes.wait_for(timeout=SLOW)
        text = page.locator("#gpulab-launch-error").inner_text()
        assert "more than ten times" in text and "CNY 9.00" in text, text
        assert not any(w in text for w in API_WORDS), text
        assert mhub.server(name) is None
        shot(page, "tile-confirm-max-price")
        yes.click()
        server = mhub.wait_ready(name, timeout=SLOW / 1000)
        assert server["user_options"]["max_price"] == "9"
        assert server["user_options"]["confirm_max_price"] is True
        assert not unexpected(console), console
    finally:
        context.close()
        if mhub.server(name):
            mhub.stop_server(name)


def test_the_form_says_it_plainly_and_confirms_on_the_next_start(mhub: Hub, browser) -> None:
    name = approved_user(mhub, "form")
    context, page, console = open_page(browser, mhub, name, f"/hub/spawn/{name}")
    try:
        page.locator('input[name="gpu"][value="rtx-4090"]').check()
        page.locator('input[name="pricing"][value="spot"]').check()
        page.locator("#gpulab-max-price").fill("0.01")
        page.locator("#spawn_form button[type=submit]").click()
        error = page.locator(".spawn-error-msg")
        error.wait_for(timeout=SLOW)
        text = error.inner_text()
        assert "Your spot server did not start" in text, text
        assert not any(w in text for w in API_WORDS), text
        shot(page, "form-spot-refused")

        page.locator("#gpulab-max-price").fill("9")
        page.locator("#spawn_form button[type=submit]").click()
        page.locator(".spawn-error-msg").filter(has_text="ten times").wait_for(timeout=SLOW)
        text = page.locator(".spawn-error-msg").inner_text()
        assert not any(w in text for w in API_WORDS), text
        # The form kept what was typed, so that confirming it starts what was asked for.
        assert page.locator("#gpulab-max-price").input_value() == "9"
        assert page.locator('input[name="gpu"][value="rtx-4090"]').is_checked()
        assert mhub.server(name) is None
        shot(page, "form-confirm-max-price")
        page.locator("[data-gpulab-confirm]").check()
        page.locator("#spawn_form button[type=submit]").click()
        server = wait_for(
            lambda: (s := mhub.server(name)) and s["ready"] and s, SLOW / 1000, what="the server"
        )
        assert server["user_options"]["max_price"] == "9"
        assert not unexpected(console), console
    finally:
        context.close()
        if mhub.server(name):
            mhub.stop_server(name)


def test_jupyterlab_switch_refusal_is_said_plainly(mhub: Hub, browser) -> None:
    """The JupyterLab switch dialog showed the hub's API text for a GPU type that filled up
    meanwhile (``no-GPU mode (gpu: "none") is always available``): now the plain sentence."""
    name = approved_user(mhub, "lab")
    holder = mhub.create_user()
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    page = context.new_page()
    try:
        browser_log_in(page, mhub, name, PASSWORD, timeout=SLOW)
        mhub.spawn_ready(name, {"gpu": "none"})
        page.goto(mhub.user_url(name, "lab"), timeout=SLOW)
        toggle = page.locator("#gpulab-status .jp-gpulab-toggle")
        toggle.wait_for(timeout=SLOW)
        toggle.click()
        chooser = page.locator(".jp-Dialog")
        chooser.locator(".jp-gpulab-choose-type").select_option("a100-80g")
        chooser.locator(".jp-Dialog-button.jp-mod-accept").click()
        confirm = page.locator(".jp-Dialog", has_text="Switch to A100-80G x1?")
        confirm.wait_for(timeout=SLOW)
        # Someone else takes the only A100 while the person reads the confirmation.
        mhub.spawn_ready(holder, {"gpu": "a100-80g"})
        confirm.locator(".jp-Dialog-button.jp-mod-accept").click()
        refusal = page.locator(".jp-Dialog", has_text="Nothing was changed")
        refusal.wait_for(timeout=SLOW)
        text = refusal.inner_text()
        assert "Not enough a100-80g cards are free right now" in text, text
        assert "without a GPU" in text and 'gpu: "none"' not in text, text
        shot(page, "lab-switch-refused")
        assert mhub.server(name)["user_options"]["gpu"] == "none"
    finally:
        context.close()
        for user in (name, holder):
            if mhub.server(user):
                mhub.stop_server(user)
