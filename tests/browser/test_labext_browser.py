"""The JupyterLab extension in a real headless Chromium (Debian's), against a real hub.

A new user signs up, is approved, logs in through the hub's form, and works in JupyterLab on a
simulated A100: reads the status bar, moves to no-GPU mode and back with the toggle and the
"Switch to GPU..." chooser (files and env checked with a real kernel), and mounts a dataset from
the Datasets panel. Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from harness import PASSWORD, REPO, SLOW, Hub, approved_user, browser_log_in, show_panel

SHOTS = REPO / "artifacts" / "screenshots"
# Nothing here is a timed assert: SLOW (harness) is how long JupyterLab may take to load.


@pytest.fixture
def renter(hub: Hub):
    """A person who signed up on the hub and was approved by the admin."""
    name = approved_user(hub, "renter", PASSWORD)
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


def shot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), animations="disabled")
    return path


def log_in(page, hub: Hub, name: str) -> None:
    browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)


def mode_text(page) -> str:
    return page.locator("#gpulab-status .jp-gpulab-mode").inner_text()


def wait_mode(page, expected: str) -> None:
    page.wait_for_function(
        "want => document.querySelector('#gpulab-status .jp-gpulab-mode')?.textContent === want",
        arg=expected,
        timeout=SLOW,
    )


def confirm_switch(page, expect_in_body: str, shot_name: str = "") -> float:
    """Check the confirmation, click Switch, wait for the reload; return click-to-usable seconds."""
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=SLOW)
    assert expect_in_body in dialog.inner_text()
    if shot_name:
        shot(page, shot_name)
    # The reloaded page sets this marker once JupyterLab is restored; clear the old one.
    page.evaluate("delete document.body.dataset.gpulabSwitchSeconds")
    t0 = time.monotonic()
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    # Through the hub's page that follows the restart, back into JupyterLab.
    page.wait_for_url(re.compile(r"/hub/spawn-pending/"), timeout=SLOW)
    page.wait_for_url(re.compile(r"/user/[^/]+/lab"), timeout=SLOW)
    page.wait_for_function("document.body.dataset.gpulabSwitchSeconds !== undefined", timeout=SLOW)
    wall = time.monotonic() - t0
    seconds = float(page.evaluate("document.body.dataset.gpulabSwitchSeconds"))
    print(f"click to usable JupyterLab: {seconds:.1f}s (page) / {wall:.1f}s (test clock)")
    return seconds


def test_status_bar_toggle_and_datasets_in_the_browser(hub: Hub, renter: str, browser) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    page = context.new_page()
    try:
        log_in(page, hub, renter)
        hub.spawn_ready(renter, {"gpu": "a100-80g", "gpus": 1})
        with hub.kernel(renter) as k:
            k.execute("open('train.py', 'w').write('print(\"epoch 1\")')")

        page.goto(hub.user_url(renter, "lab"), timeout=SLOW)
        wait_mode(page, "A100-80G x1 (simulated)")
        status = page.locator("#gpulab-status")
        assert "CNY 2.10/h" in status.inner_text()
        assert "session ≤ CNY 0." in status.inner_text()
        # Billing runs with the session hub: the balance (the trial credit, less what was
        # charged so far), and how long it lasts while billing charges this server.
        page.wait_for_function(
            "/^balance CNY \\d+\\.\\d\\d( \\(.+ left\\))?$/.test("
            "document.querySelector('#gpulab-status .jp-gpulab-balance')?.textContent || '')",
            timeout=SLOW,
        )
        # The cost of the session moves while one watches.
        cost = page.locator("#gpulab-status .jp-gpulab-cost").inner_text()
        page.wait_for_function(
            "c => document.querySelector('#gpulab-status .jp-gpulab-cost').textContent !== c",
            arg=cost,
            timeout=SLOW,
        )
        # GPU panel: the simulated state, said clearly.
        show_panel(page, "gpulab-gpus")
        page.locator("#gpulab-gpus").get_by_text("these GPUs are simulated").wait_for(timeout=SLOW)
        shot(page, "01-gpu-session")

        # Command palette offers the switch with its price.
        page.keyboard.press("Control+Shift+C")
        page.keyboard.type("no-GPU")
        palette = page.locator(".lm-CommandPalette-content")
        palette.get_by_text("Switch to no-GPU mode (CNY 0.09/h)").wait_for(timeout=SLOW)
        page.keyboard.press("Escape")

        # An open document with unsaved changes: the switch must save it first.
        show_panel(page, "filebrowser")
        page.locator(".jp-DirListing-itemText", has_text="train.py").dblclick()
        editor = page.locator(".jp-FileEditor .cm-content")
        editor.click()
        page.keyboard.press("Control+End")
        page.keyboard.type("\n# epoch 2 unsaved")
        page.locator(".lm-DockPanel-tabBar .jp-mod-dirty").wait_for(timeout=SLOW)

        # ---- to no-GPU with the status-bar button ----------------------------------------------
        page.locator("#gpulab-status .jp-gpulab-toggle").click()
        to_cpu = confirm_switch(page, "CNY 2.10/h → CNY 0.09/h", "02-confirm-no-gpu")
        wait_mode(page, "No GPU")
        assert "CNY 0.09/h" in page.locator("#gpulab-status").inner_text()
        show_panel(page, "gpulab-gpus")
        page.locator("#gpulab-gpus").get_by_text("No GPU in this mode").wait_for(timeout=SLOW)
        shot(page, "03-no-gpu-after-switch")
        saved = 'print("epoch 1")\n# epoch 2 unsaved'
        with hub.kernel(renter) as k:
            assert k.execute("print(open('train.py').read())").strip() == saved
            env = k.execute("import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))")
            assert env.strip() == "''"

        # ---- back to a GPU with the chooser ----------------------------------------------------
        page.locator("#gpulab-status .jp-gpulab-toggle").click()
        chooser = page.locator(".jp-Dialog")
        chooser.wait_for(timeout=SLOW)
        options = chooser.locator(".jp-gpulab-choose-type option")
        labels = options.all_inner_texts()
        assert any(t.startswith("A100-80G (simulated) — ") and "CNY 2.10/h" in t for t in labels)
        chooser.locator(".jp-gpulab-choose-type").select_option("a100-80g")
        shot(page, "04-gpu-chooser")
        chooser.locator(".jp-Dialog-button.jp-mod-accept").click()
        page.locator(".jp-Dialog").get_by_text("Switch to A100-80G x1?").wait_for(timeout=SLOW)
        to_gpu = confirm_switch(page, "CNY 0.09/h → CNY 2.10/h")
        wait_mode(page, "A100-80G x1 (simulated)")
        uuids = hub.server(renter)["state"]["allocation"]["uuids"]
        with hub.kernel(renter) as k:
            assert k.execute("print(open('train.py').read())").strip() == saved
            env = k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
            assert env.strip() == uuids[0]

        # ---- mount a dataset from the Datasets panel -------------------------------------------
        show_panel(page, "gpulab-datasets")
        card = page.locator('.jp-gpulab-dataset[data-slug="sklearn-toy"]')
        card.wait_for(timeout=SLOW)
        assert "not mounted" in card.inner_text() and "BSD-3-Clause" in card.inner_text()
        card.locator(".jp-gpulab-mount").click()
        mount = confirm_switch(page, "The price stays CNY 2.10/h.")
        show_panel(page, "gpulab-datasets")
        card = page.locator('.jp-gpulab-dataset[data-slug="sklearn-toy"]')
        card.locator(".jp-gpulab-mounted").wait_for(timeout=SLOW)
        shot(page, "05-datasets-panel")
        card.locator(".jp-gpulab-open").click()
        page.locator(".jp-DirListing-content").get_by_text("iris.csv").wait_for(timeout=SLOW)
        shot(page, "06-dataset-in-file-browser")
        with hub.kernel(renter) as k:
            assert k.execute("print(open('train.py').read())").strip() == saved
            rows = k.execute("print(len(open('datasets/sklearn-toy/iris.csv').readlines()))")
            assert int(rows) == 151
        print(
            f"switch timings (click to usable JupyterLab): to no-GPU {to_cpu:.1f}s, "
            f"to GPU {to_gpu:.1f}s, mount {mount:.1f}s"
        )
    except Exception:
        shot(page, "failure")
        raise
    finally:
        context.close()


def test_switch_without_a_free_gpu_says_so_and_changes_nothing(
    hub: Hub, renter: str, browser
) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    page = context.new_page()
    others = []
    try:
        log_in(page, hub, renter)
        hub.spawn_ready(renter, {"gpu": "none"})
        page.goto(hub.user_url(renter, "lab"), timeout=SLOW)
        wait_mode(page, "No GPU")
        server_id = page.evaluate(
            "fetch(location.pathname.split('lab')[0] + 'gpulab/api/ping')"
            ".then(r => r.json()).then(s => s.server_id)"
        )

        # The chooser lists 2 free A100s; someone else takes both before the user confirms.
        page.locator("#gpulab-status .jp-gpulab-toggle").click()
        chooser = page.locator(".jp-Dialog")
        chooser.locator(".jp-gpulab-choose-type").select_option("a100-80g")
        other = hub.create_user()
        others.append(other)
        hub.spawn_ready(other, {"gpu": "a100-80g", "gpus": 2})
        chooser.locator(".jp-Dialog-button.jp-mod-accept").click()
        page.locator(".jp-Dialog").get_by_text("Switch to A100-80G x1?").wait_for(timeout=SLOW)
        page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()
        error = page.locator(".jp-Dialog").filter(has_text="Nothing was changed")
        error.wait_for(timeout=SLOW)
        assert "free" in error.inner_text()
        shot(page, "07-no-free-gpu")
        # The page had let go of the server before asking: it loads again, on the same server.
        with page.expect_navigation(timeout=SLOW):
            error.locator(".jp-Dialog-button").last.click()
        wait_mode(page, "No GPU")

        # Every card taken: the chooser is not even offered.
        other = hub.create_user()
        others.append(other)
        hub.spawn_ready(other, {"gpu": "rtx-4090", "gpus": 2})
        page.locator("#gpulab-status .jp-gpulab-toggle").click()
        none_free = page.locator(".jp-Dialog").filter(has_text="No GPU is free right now")
        none_free.wait_for(timeout=SLOW)
        assert "0 of 2 free" in none_free.inner_text()
        none_free.locator(".jp-Dialog-button").last.click()

        # Nothing changed: same server process, same mode.
        assert mode_text(page) == "No GPU"
        ping = page.evaluate(
            "fetch(location.pathname.split('lab')[0] + 'gpulab/api/ping')"
            ".then(r => r.json()).then(s => s.server_id)"
        )
        assert ping == server_id
        assert hub.server(renter)["state"]["options"]["gpu"] == "none"
    except Exception:
        shot(page, "failure")
        raise
    finally:
        context.close()
        for other in others:
            if hub.server(other) is not None:
                hub.stop_server(other)
