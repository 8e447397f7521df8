"""Open documents saved periodically on spot servers, in Debian's Chromium (Playwright).

A hub whose spot market saves every 4 s (``SpotMarket.save_interval``; 15 min by default): a
notebook edited and left unsaved on a spot server is on disk within a few seconds, with no
warning and no user action. On an on-demand server the same edit stays unsaved (JupyterLab's
own autosave, every 2 minutes, is far beyond the wait).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
from conftest import require
from harness import PASSWORD, SLOW, Hub, approved_user, browser_log_in, wait_for, write_in_home

INTERVAL = 4


@pytest.fixture(scope="module")
def save_hub(module_hub_factory) -> Hub:
    require(
        importlib.util.find_spec("jupyterlab_gpulab") is not None,
        "the jupyterlab_gpulab extension (make install)",
    )
    return module_hub_factory(
        "labext-spot-save",
        simulate="RTX-4090:1",
        extra_args=[f"--SpotMarket.save_interval={INTERVAL}", "--SpotMarket.tick_interval=0.5"],
    )


def notebook(source: str) -> str:
    return json.dumps(
        {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": "c1",
                    "metadata": {},
                    "outputs": [],
                    "source": [source],
                }
            ],
            "metadata": {
                "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def edit_unsaved(page, hub: Hub, name: str, path: Path) -> None:
    """Open the notebook in JupyterLab and type into its cell, without saving."""
    page.goto(hub.user_url(name, f"lab/tree/{path.name}"), timeout=SLOW)
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click(timeout=SLOW)
    page.keyboard.press("Control+End")
    page.keyboard.type("  # tuned")
    tab = page.locator(".lm-DockPanel-tabBar .jp-mod-dirty", has_text=path.name)
    tab.wait_for(timeout=SLOW)


def cell_source(path: Path) -> str:
    return "".join(json.loads(path.read_text())["cells"][0]["source"])


def test_spot_notebook_is_saved_periodically_but_not_on_demand(save_hub: Hub, browser) -> None:
    hub = save_hub
    name = approved_user(hub, "saver", PASSWORD)
    assert hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.40"}).ok
    home = hub.data_dir / "users" / name
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    page = context.new_page()
    try:
        browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)

        # Spot: saved within an interval (plus the page's 1 s check), no warning involved.
        hub.spawn_ready(name, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.60"})
        nb = write_in_home(home, "train.ipynb", notebook("lr = 0.1"))
        edit_unsaved(page, hub, name, nb)
        edited = time.monotonic()
        wait_for(
            lambda: cell_source(nb) == "lr = 0.1  # tuned",
            timeout=2 * INTERVAL + 5,
            interval=0.2,
            what="the periodic save of the edited notebook",
        )
        print(f"spot: saved {time.monotonic() - edited:.1f}s after the edit (interval {INTERVAL}s)")
        page.locator(".lm-DockPanel-tabBar .jp-mod-dirty", has_text=nb.name).wait_for(
            state="detached"
        )
        assert int(page.evaluate("document.body.dataset.gpulabSpotSaves")) >= 1
        assert not hub.api("GET", "/gpulab/spot/preemptions").json()["preemptions"]

        # On demand: the same edit stays unsaved past several intervals.
        hub.stop_server(name)
        hub.spawn_ready(name, {"gpu": "none"})
        nb2 = write_in_home(home, "eval.ipynb", notebook("batch = 8"))
        edit_unsaved(page, hub, name, nb2)
        time.sleep(2 * INTERVAL + 2)
        assert cell_source(nb2) == "batch = 8"
        dirty = page.locator(".lm-DockPanel-tabBar .jp-mod-dirty", has_text="eval.ipynb")
        assert dirty.count() == 1
        assert page.evaluate("document.body.dataset.gpulabSpotSaves") is None
    finally:
        context.close()
        if hub.server(name):
            hub.stop_server(name)
