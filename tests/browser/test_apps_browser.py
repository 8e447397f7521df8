"""A person in headless Chromium: sign up, click "Stable Diffusion WebUI" on the hub's home page,
land on the app with a simulated RTX 4090 the hub picked, and generate an image in it.

Set GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files (the README's pictures come from here).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests
from apps_helpers import apps_hub
from billing.client import Billing
from harness import PASSWORD, SLOW, Hub, WebSession, approve, browser_log_in, wait_for
from playwright.sync_api import expect

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")
SD_TILE = '.gpulab-app-tile[data-app="sd-webui"]'


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def bhub(module_hub_factory) -> Hub:
    return apps_hub(module_hub_factory, "apps-browser", cli=None, extra_args=[])


def sign_up_in_browser(page, hub: Hub, name: str) -> None:
    page.goto(f"{hub.url}/hub/signup")
    page.fill("input[name=username]", name)
    page.fill("input[name=signup_password]", PASSWORD)
    page.fill("input[name=signup_password_confirmation]", PASSWORD)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_load_state()


def launch_sd(page, hub: Hub, name: str) -> None:
    page.goto(f"{hub.url}/hub/home")
    tile = page.locator(SD_TILE)
    tile.wait_for(timeout=SLOW)
    # The tile says what a click starts: the cheapest free card with the VRAM, an RTX 4090.
    assert "RTX 4090" in tile.locator(".gpulab-plan").inner_text()
    shot(page, "home")
    tile.locator(".gpulab-launch").click()
    page.locator("#gpulab-launch-steps li").first.wait_for(timeout=SLOW)
    shot(page, "launch")
    page.wait_for_url(hub.user_url(name, "sd-webui/"), timeout=SLOW)


def generate(page) -> str:
    page.wait_for_selector("#generate:enabled", timeout=SLOW)
    page.fill("#prompt", "a lighthouse at dusk")
    page.click("#generate")
    page.wait_for_function(
        "document.getElementById('result').src.startsWith('data:image/png')", timeout=SLOW
    )
    return page.locator("#result").get_attribute("src")


def test_sign_up_click_the_tile_and_generate(bhub: Hub, browser) -> None:
    # The admin approves sign-ups (NativeAuthenticator): done through the admin's own page.
    names = ["sd" + os.urandom(3).hex() for _ in range(2)]
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in names]
    pages = [c.new_page() for c in contexts]
    try:
        for page, name in zip(pages, names, strict=True):
            sign_up_in_browser(page, bhub, name)
            approve(bhub, name)
            browser_log_in(page, bhub, name, PASSWORD, timeout=SLOW)

        first, second = pages
        launch_sd(first, bhub, names[0])
        assert first.title().startswith("Stable Diffusion WebUI")
        assert "tiny-sd" in first.locator("#model").inner_text()
        src = generate(first)
        assert len(src) > 200
        shot(first, "app")

        server = bhub.server(names[0])
        assert server["user_options"]["gpu"] == "rtx-4090"
        assert server["user_options"]["app"] == "sd-webui"

        # Back home: the running server, its app and price, and how long the launch took.
        first.goto(f"{bhub.url}/hub/home")
        first.wait_for_selector("#gpulab-server-details", timeout=SLOW)
        body = first.locator("#gpulab-server").inner_text()
        assert "Stable Diffusion WebUI on RTX 4090 x1" in body and "per hour" in body
        assert "was ready in" in first.locator("#gpulab-last-launch").inner_text()
        shot(first, "home-running")

        # A second person gets their own card (the second RTX 4090) and their own WebUI.
        launch_sd(second, bhub, names[1])
        generate(second)
        holders = sorted(c["holder"].split("/")[0] for c in bhub.pool()["gpus"] if c.get("holder"))
        assert holders == sorted(names)
        assert bhub.free("rtx-4090") == 0

        # The usage API counts the WebUI's app-seconds, by name.
        billing = Billing(bhub)

        def app_seconds():
            usage = billing.usage(names[0])
            return usage.get("apps", {}).get("sd-webui", 0) >= 1 and usage

        usage = wait_for(app_seconds, 60, 0.5, "app-seconds of sd-webui")
        assert usage["apps"]["sd-webui"] >= 1

        # The statement page, in the hub's look, with its chart.
        first.goto(f"{bhub.url}/services/billing/")
        first.wait_for_selector("svg", timeout=SLOW)
        assert "sd-webui" in first.content()
        shot(first, "statement")
    finally:
        for c in contexts:
            c.close()
        for name in names:
            if bhub.server(name) is not None:
                bhub.stop_server(name)


def test_home_page_refuses_with_the_reason_when_no_card_fits(bhub: Hub, browser) -> None:
    web = WebSession(bhub)
    name = "sdx" + os.urandom(3).hex()
    assert web.signup(name, PASSWORD).ok
    approve(bhub, name)
    # Every card that fits is busy.
    others = [bhub.create_user() for _ in range(3)]
    for o, gpu in zip(others, ["rtx-4090", "rtx-4090", "a100-80g"], strict=True):
        bhub.spawn_ready(o, {"gpu": gpu})
    context = browser.new_context()
    page = context.new_page()
    try:
        browser_log_in(page, bhub, name, PASSWORD, timeout=SLOW)
        page.goto(f"{bhub.url}/hub/home")
        tile = page.locator(SD_TILE)
        tile.wait_for(timeout=SLOW)
        assert "No free card" in tile.locator(".gpulab-plan").inner_text()
        tile.locator(".gpulab-launch").click()
        # A locator wait, not wait_for_function: the hub's CSP has no 'unsafe-eval', and
        # Playwright's polling of a string predicate evaluates it in the page (EvalError).
        expect(page.locator("#gpulab-launch-error")).to_contain_text("No free card", timeout=SLOW)
        assert "RTX 4090 0/2 free" in page.locator("#gpulab-launch-error").inner_text()
        assert bhub.server(name) is None
        r = requests.get(bhub.user_url(name, "sd-webui/"), timeout=30, allow_redirects=False)
        assert r.status_code in (302, 403, 404)
    finally:
        context.close()
        for o in others:
            bhub.stop_server(o)
