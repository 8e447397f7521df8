"""Issue 25, published ports "listed and revocable on the home page": the home page's Published
ports card in headless Chromium, on a real root hub with a real app in the user's server.

A person starts a web app in their server, tries a port nothing listens on (the hub's refusal
shown, naming the port), publishes theirs for logged-in users and opens the address in another
tab (the app, through the hub's log-in hop), publishes a second one with a link, and revokes the
first (its row goes, its address answers 404). On the old home page there was no such card, so
every locator below timed out. Screenshots go to GPULAB_SCREENSHOTS=DIR when it is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests
from apps_helpers import Console
from browser_helpers import shot
from harness import PASSWORD, Hub, approved_user, browser_log_in, free_port, wait_for, write_in_home
from playwright.sync_api import expect

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="local servers as users need root")


def serve(hub: Hub, name: str, port: int, text: str) -> None:
    """``python -m http.server`` in ``name``'s server, serving a page that says ``text``."""
    with hub.kernel(name) as k:
        home = Path(k.execute("import os; print(os.getcwd())").strip())
        write_in_home(
            home, f"site{port}/index.html", f"<!doctype html><title>demo</title><h1>{text}</h1>"
        )
        k.execute(
            "import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-m', 'http.server', '{port}', '--bind',"
            f" '127.0.0.1', '--directory', 'site{port}'], start_new_session=True,"
            " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
        )

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/", timeout=2).ok
        except requests.RequestException:
            return False

    wait_for(up, 30, what=f"{name}'s web app on {port}")


def test_a_user_publishes_opens_and_revokes_ports_on_the_home_page(hub: Hub, browser) -> None:
    name = approved_user(hub, "ports")
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    console = Console(page)
    try:
        browser_log_in(page, hub, name, PASSWORD)
        hub.spawn_ready(name, {"gpu": "none"})
        first, second, nothing = free_port(), free_port(), free_port()
        serve(hub, name, first, "Hello from my demo")
        serve(hub, name, second, "The second demo")
        page.goto(f"{hub.url}/hub/home")
        card = page.locator("#gpulab-ports")
        expect(card.get_by_role("heading", name="Published ports")).to_be_visible()
        shot(page, "ports-empty")

        # A port nothing listens on: the hub's refusal, naming the port.
        page.fill("#gpulab-ports-port", str(nothing))
        page.click("#gpulab-ports-publish")
        expect(page.locator("#gpulab-ports-answer")).to_contain_text(
            f"port: nothing listens on port {nothing}"
        )
        # Not a number: the page says what is allowed, without asking the hub.
        page.fill("#gpulab-ports-port", "eighty")
        page.click("#gpulab-ports-publish")
        expect(page.locator("#gpulab-ports-answer")).to_contain_text("a number from 1024 to 65535")
        console.seen[:] = [e for e in console.seen if "/ports" not in e]  # the 409 above

        page.fill("#gpulab-ports-port", str(first))
        page.click("#gpulab-ports-publish")
        row = card.locator(f"tr[data-port='{first}']")
        expect(row).to_contain_text("Anyone logged in")
        link = row.get_by_role("link")
        expect(link).to_have_text(f"http://{name}.localhost:{hub.port}/ports/{first}/")

        page.fill("#gpulab-ports-port", str(second))
        page.select_option("#gpulab-ports-access", "public")
        page.click("#gpulab-ports-publish")
        second_row = card.locator(f"tr[data-port='{second}']")
        expect(second_row).to_contain_text("Anyone with the link")
        expect(second_row.get_by_role("link")).to_contain_text("_gpulab_secret=")
        shot(page, "ports-two-published")

        # The owner opens the first in a new tab: through the hub's log-in hop, to the app.
        with context.expect_page() as opened:
            link.click()
        tab = opened.value
        Console(tab)
        expect(tab.get_by_role("heading", name="Hello from my demo")).to_be_visible(timeout=60_000)
        assert tab.url == f"http://{name}.localhost:{hub.port}/ports/{first}/"
        shot(tab, "ports-opened")
        tab.close()

        row.get_by_role("button", name=f"Revoke port {first}").click()
        expect(row).to_have_count(0)
        expect(page.locator("#gpulab-ports-answer")).to_contain_text(
            f"Port {first} is no longer published"
        )
        shot(page, "ports-revoked")
        gone = requests.get(f"http://{name}.localhost:{hub.port}/ports/{first}/", timeout=30)
        assert gone.status_code in (302, 404) and "Hello from my demo" not in gone.text
        assert not console.seen, console.seen
    finally:
        context.close()
        if hub.server(name) is not None:
            hub.stop_server(name)
