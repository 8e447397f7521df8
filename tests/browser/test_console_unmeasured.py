"""The operator's console shows a held card with no utilisation figure as "n/a", not as idle
(issue 24, F1: "cards by node with who holds each ... and whether it is busy").

A real hub's console page in headless Chromium. No card here lacks a utilisation figure (the
pool is simulated: NVML is what leaves it out on some real boards), so the console API's real
answer is taken and one card in it made such a card as the hub's API sends it (held,
``util_pct``/``idle_seconds`` JSON null, ``busy`` false; tests/unit/test_unmeasured_util.py checks
that the API does send that). Failed on the old page: the badge said "idle" and the summary
counted the card idle.

Screenshots go to $GPULAB_SCREENSHOTS (else the test's temp folder).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness import SLOW, Hub, browser_log_in

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")


@pytest.fixture(scope="module")
def unhub(module_hub_factory) -> Hub:
    return module_hub_factory("console-unmeasured", simulate="A100-80G:2")


def test_a_held_card_without_a_utilisation_figure_reads_na(browser, unhub: Hub, tmp_path) -> None:
    from playwright.sync_api import expect

    shots = Path(SHOTS) if SHOTS else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    password = (unhub.data_dir / "admin-password").read_text().strip()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        blind: dict = {}

        def unmeasured(route) -> None:
            body = route.fetch().json()
            card = body["cards"][0]
            card.update(
                state="held",
                user="ada",
                server="",
                since=body["time"] - 600,
                pricing="on_demand",
                price_per_hour="2.10",
                simulated=False,
                util_pct=None,
                idle_seconds=None,
                busy=False,
            )
            blind.update(card)
            route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

        page.route("**/hub/api/gpulab/admin/console*", unmeasured)
        browser_log_in(page, unhub, "admin", password, timeout=SLOW)
        page.goto(f"{unhub.url}/hub/gpulab/console")
        page.wait_for_function("() => document.querySelector('tr[data-uuid]') !== null")
        row = page.locator(f'tr[data-uuid="{blind["uuid"]}"]')
        badge = row.locator('[data-activity="unknown"]')
        expect(badge).to_have_text("n/a", timeout=SLOW)
        expect(row.locator('[data-activity="idle"]')).to_have_count(0)
        expect(row.locator(".gpulab-console-holder")).to_have_text("ada")
        expect(page.locator("#gpulab-console-summary")).to_contain_text(
            "1 held (0 busy, 0 idle, 1 n/a)"
        )
        page.screenshot(path=str(shots / "console-unmeasured.png"), full_page=True)
        assert errors == []
    finally:
        context.close()
