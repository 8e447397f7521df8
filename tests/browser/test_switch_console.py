"""Issue 22, the no-GPU switch as a person sees it in JupyterLab: no errors, files there at once.

Points of the issue this test covers (each fails on the code before the fix):

- "30+ 503 errors per no-GPU switch": while the server restarts, JupyterLab's own pollers
  (kernels, sessions, contents, terminals) and the extension's hit the proxy for a server that
  is not there. Now the tab leaves for the hub's own progress page (JupyterHub's spawn-pending
  page, on the hub's origin) and comes back to the same JupyterLab URL once the hub says the new
  server is ready: the browser console and the network log of the whole walk (log-in, JupyterLab,
  GPU -> no-GPU -> GPU) hold no error and no answer >= 400.
- "the file browser is empty right after a switch": a file made before the switch is listed as
  soon as JupyterLab is back (a few seconds, not the file browser's next refresh).
- the kernel of the notebook that was open runs on the new mode (run from the page itself).
"""

from __future__ import annotations

import json
import re

import pytest
from apps_helpers import Console as Errors
from harness import PASSWORD, REPO, SLOW, Hub, approved_user, browser_log_in
from playwright.sync_api import TimeoutError as PlaywrightTimeout

NOTEBOOK = "where.ipynb"
CELL = "import os; print('GPU=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
# "Right after": JupyterLab lists the folder when it starts; its periodic refresh is later.
AT_ONCE_MS = 5_000


@pytest.fixture
def switcher(hub: Hub):
    name = approved_user(hub, "switcher", PASSWORD)
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


SHOTS = REPO / "artifacts" / "screenshots"


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), animations="disabled")


def mode_text(page) -> str:
    return page.locator("#gpulab-status .jp-gpulab-mode").inner_text()


def wait_mode(page, expected: str) -> None:
    page.wait_for_function(
        "want => document.querySelector('#gpulab-status .jp-gpulab-mode')?.textContent === want",
        arg=expected,
        timeout=SLOW,
    )


def notebook_json() -> str:
    return json.dumps(
        {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "metadata": {},
                    "outputs": [],
                    "source": [CELL],
                }
            ],
            "metadata": {
                "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def run_cell(page) -> str:
    """Run the notebook's cell from the page; return what it printed."""
    panel = page.locator(".jp-NotebookPanel:visible")
    panel.wait_for(timeout=SLOW)
    # JupyterLab may ask which kernel to start for the notebook (its own dialog): the default.
    select = page.locator(".jp-Dialog", has_text="Select Kernel").locator(".jp-mod-accept")
    try:
        select.wait_for(timeout=5_000)
        select.click()
    except PlaywrightTimeout:
        pass
    # The kernel of the restored notebook is up (the status reads Idle).
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=SLOW)
    output = panel.locator(".jp-OutputArea-output")
    page.evaluate(
        "() => document.querySelectorAll('.jp-OutputArea-output').forEach(n => n.remove())"
    )
    panel.locator(".jp-Cell .cm-content").first.click()
    page.keyboard.press("Control+Enter")
    output.filter(has_text="GPU=").first.wait_for(timeout=SLOW)
    return output.filter(has_text="GPU=").first.inner_text().strip()


def switch(page, open_dialog, title: str) -> None:
    """Confirm a switch and follow it: through the hub's page, back into JupyterLab."""
    open_dialog()
    dialog = page.locator(".jp-Dialog")
    dialog.locator(".jp-Dialog-header", has_text=title).wait_for(timeout=SLOW)
    page.evaluate("delete document.body.dataset.gpulabSwitchSeconds")
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    # The tab waits on the hub's own page, not on the server that is restarting ...
    page.wait_for_url(re.compile(r"/hub/spawn-pending/"), timeout=SLOW)
    # ... and comes back to JupyterLab when the hub says the new server is ready.
    page.wait_for_url(re.compile(r"/user/[^/]+/lab"), timeout=SLOW)
    page.wait_for_function("document.body.dataset.gpulabSwitchSeconds !== undefined", timeout=SLOW)


def test_switch_without_console_errors_files_listed_kernel_on_new_mode(
    hub: Hub, switcher: str, browser
) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    page = context.new_page()
    errors = Errors(page)
    try:
        browser_log_in(page, hub, switcher, PASSWORD, timeout=SLOW)
        hub.spawn_ready(switcher, {"gpu": "a100-80g", "gpus": 1})
        with hub.kernel(switcher) as k:
            k.execute("open('made-before-the-switch.txt', 'w').write('hello')")
            k.execute(f"open({NOTEBOOK!r}, 'w').write({notebook_json()!r})")
        page.goto(hub.user_url(switcher, f"lab/tree/{NOTEBOOK}"), timeout=SLOW)
        wait_mode(page, "A100-80G x1 (simulated)")
        assert run_cell(page).startswith("GPU='GPU-")

        # ---- GPU -> no-GPU (the status bar's button) -------------------------------------------
        toggle = page.locator("#gpulab-status .jp-gpulab-toggle")
        switch(page, toggle.click, "Switch to no-GPU mode?")
        page.locator(".jp-DirListing-itemText", has_text="made-before-the-switch.txt").wait_for(
            timeout=AT_ONCE_MS
        )
        wait_mode(page, "No GPU")
        assert run_cell(page) == "GPU=''"
        shot(page, "switch-01-no-gpu-files-listed")

        # ---- no-GPU -> GPU (the chooser) -------------------------------------------------------
        def choose_gpu() -> None:
            page.locator("#gpulab-status .jp-gpulab-toggle").click()
            chooser = page.locator(".jp-Dialog")
            chooser.locator(".jp-gpulab-choose-type").select_option("a100-80g")
            chooser.locator(".jp-Dialog-button.jp-mod-accept").click()

        switch(page, choose_gpu, "Switch to A100-80G x1?")
        page.locator(".jp-DirListing-itemText", has_text="made-before-the-switch.txt").wait_for(
            timeout=AT_ONCE_MS
        )
        wait_mode(page, "A100-80G x1 (simulated)")
        uuid = hub.server(switcher)["state"]["allocation"]["uuids"][0]
        assert run_cell(page) == f"GPU={uuid!r}"
        shot(page, "switch-02-back-on-gpu")
        assert mode_text(page) == "A100-80G x1 (simulated)"
        assert errors.seen == [], "\n".join(errors.seen)
    except Exception:
        shot(page, "switch-failure")
        raise
    finally:
        context.close()
