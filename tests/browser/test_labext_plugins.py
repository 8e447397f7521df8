"""The extension's plugins all activate together, in real headless Chromium against a real hub.

The frontend is one JupyterLab plugin per feature (session, status bar, mode switch, datasets,
GPU panel, spot, early launcher) sharing the session through a token. This checks that on a
gpulab page every one of them is there (their widgets and commands), that the status bar's
button reaches the mode-switch plugin's command, and that the console shows no plugin that
failed to activate or any other gpulab error.
"""

from __future__ import annotations

import pytest
from harness import PASSWORD, SLOW, Hub, WebSession, approved_user, browser_log_in


@pytest.fixture
def lab_user(hub: Hub):
    name = approved_user(hub, "plugins", PASSWORD)
    assert WebSession(hub).login(name, PASSWORD)  # creates the hub user
    hub.spawn_ready(name, {"gpu": "none"})
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


def test_every_plugin_activates_without_errors(hub: Hub, lab_user: str, browser) -> None:
    page = browser.new_context(viewport={"width": 1400, "height": 820}).new_page()
    problems: list[str] = []

    def on_console(msg) -> None:
        text = msg.text
        if msg.type == "error" and (
            "gpulab" in text.lower() or "activate" in text or "No provider" in text
        ):
            problems.append(f"console.{msg.type}: {text}")

    page.on("console", on_console)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    try:
        browser_log_in(page, hub, lab_user, PASSWORD, timeout=SLOW)
        page.goto(hub.user_url(lab_user, "lab"), timeout=SLOW)
        # Session + status bar: the mode, price and balance.
        page.wait_for_function(
            "document.querySelector('#gpulab-status .jp-gpulab-mode')?.textContent === 'No GPU'",
            timeout=SLOW,
        )
        page.wait_for_function(
            "/^balance /.test(document.querySelector('#gpulab-status .jp-gpulab-balance')"
            "?.textContent || '')",
            timeout=SLOW,
        )
        # Datasets and GPU panels, and the early launcher.
        page.locator('.lm-TabBar-tab[data-id="gpulab-datasets"]').click()
        page.locator("#gpulab-datasets .jp-gpulab-dataset").first.wait_for(timeout=SLOW)
        page.locator('.lm-TabBar-tab[data-id="gpulab-gpus"]').click()
        page.locator("#gpulab-gpus").get_by_text("No GPU in this mode").wait_for(timeout=SLOW)
        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.wait_for(timeout=SLOW)
        # The mode-switch plugin's commands are in the palette, with the catalog's price (the
        # no-GPU one is disabled in no-GPU mode: there, not shown).
        page.keyboard.press("Control+Shift+C")
        palette = page.locator(".jp-ModalCommandPalette")
        palette.locator("input").fill("gpulab")
        palette.get_by_text("Switch to GPU...").first.wait_for(timeout=SLOW)
        palette.get_by_text("Switch to no-GPU mode (CNY 0.09/h)").first.wait_for(
            state="attached", timeout=SLOW
        )
        page.keyboard.press("Escape")
        # The status bar's button runs the mode-switch plugin's toggle: the GPU chooser.
        page.locator("#gpulab-status .jp-gpulab-toggle").click()
        dialog = page.locator(".jp-Dialog")
        dialog.locator(".jp-gpulab-chooser").wait_for(timeout=SLOW)
        dialog.locator(".jp-Dialog-button.jp-mod-reject").click()
        dialog.wait_for(state="detached", timeout=SLOW)
        assert not problems, problems
    finally:
        page.context.close()
