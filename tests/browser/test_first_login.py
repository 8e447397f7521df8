"""A newcomer's first minutes in headless Chromium (issue 22, sign-up and landing).

A person signs up and is told the account waits for an administrator (the page used to show the
empty form again, with no word about it), tries to log in and is told it still waits; the admin
logs in, lands on the home page, sees "1 sign-up waits" there and in the navbar, follows it to
/hub/authorize (linked from nowhere before) and approves; the person logs in and lands on the
home page with the balance, the apps and the free cards (it was the raw "Server Options" form).
The browser's console shows no error on any of these pages.

Set GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from harness import PASSWORD, SLOW, Hub, browser_log_in


@pytest.fixture(scope="module")
def fhub(module_hub_factory) -> Hub:
    return module_hub_factory("first-login", simulate="RTX-4090:1,A100-80G:1")


def shot(page, name: str) -> None:
    shots = os.environ.get("GPULAB_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(shots) / f"first-login-{name}.png"), full_page=True)


def watched(context) -> tuple:
    """A page whose console errors (and uncaught exceptions) are collected."""
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(SLOW)
    return page, errors


def test_a_newcomer_signs_up_is_approved_and_lands_on_the_home_page(browser, fhub: Hub) -> None:
    name = f"newcomer{uuid.uuid4().hex[:6]}"
    person = browser.new_context(viewport={"width": 1280, "height": 900})
    page, errors = watched(person)

    page.goto(f"{fhub.url}/hub/signup")
    page.fill("input[name=username]", name)
    page.fill("input[name=signup_password]", PASSWORD)
    page.fill("input[name=signup_password_confirmation]", PASSWORD)
    page.click("#signup_submit")
    done = page.locator("#gpulab-signup-done")
    done.wait_for()
    assert "An administrator must approve it before you can log in" in done.inner_text()
    assert page.locator("input[name=signup_password]").count() == 0
    shot(page, "signed-up")

    page.click("#gpulab-signup-login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    page.press("input[name=password]", "Enter")
    page.wait_for_load_state()
    assert "waits for an administrator's approval" in page.locator(".login_error").inner_text()
    shot(page, "still-waiting")

    admin_context = browser.new_context(viewport={"width": 1280, "height": 900})
    admin, admin_errors = watched(admin_context)
    password = (fhub.data_dir / "admin-password").read_text().strip()
    browser_log_in(admin, fhub, "admin", password)
    admin.wait_for_url(f"{fhub.url}/hub/home")
    notice = admin.locator("#gpulab-signups-waiting")
    assert "1 sign-up waits for your approval" in notice.inner_text()
    assert "1 waiting" in admin.locator("#gpulab-nav-signups").inner_text()
    admin.locator("#gpulab-balance-amount").filter(has_text="CNY").wait_for()
    shot(admin, "admin-home")
    admin.click("#gpulab-nav-signups")
    admin.wait_for_url(f"{fhub.url}/hub/authorize")
    row = admin.locator(f"tr#{name}")
    shot(admin, "authorize")
    row.get_by_role("button", name="Approve").click()
    admin.locator(f"tr#{name}").get_by_role("button", name="Withdraw approval").wait_for()
    assert admin.locator("#gpulab-signups-waiting").count() == 0
    assert "waiting" not in admin.locator("#gpulab-nav-signups").inner_text()

    browser_log_in(page, fhub, name, PASSWORD)
    page.wait_for_url(f"{fhub.url}/hub/home")
    page.locator("#gpulab-balance-amount").filter(has_text="CNY").wait_for()
    page.locator("#gpulab-pool tbody tr").first.wait_for()
    page.locator("#gpulab-apps .btn").first.wait_for()
    assert page.locator("#gpulab-nav-signups").count() == 0
    shot(page, "home")
    page.goto(f"{fhub.url}/hub/")
    page.wait_for_url(f"{fhub.url}/hub/home")
    assert fhub.server(name) is None  # landing started nothing

    assert errors == [], errors
    assert admin_errors == [], admin_errors
    person.close()
    admin_context.close()
