"""Browser benchmark: click "Start" to JupyterLab's launcher, gpulab vs stock JupyterHub.

Real headless Chromium (Debian's ``chromium``) driven by Playwright, against two real hubs on
loopback. Each round signs in a fresh user on each hub, then times from the click that starts the
server (stock: "Start My Server" on /hub/home; gpulab: "Start" on its spawn form, with an A100
(simulated) and a dataset chosen) until JupyterLab's launcher is visible. JupyterLab's own page
load is part of both figures.

    .venv/bin/python benchmarks/browser_spawn.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CHROMIUM_ARGS, Hub
from spawn import pct, start_stock, stock_hub

# The launcher's Notebook card: the launcher is usable, not just its frame drawn.
LAUNCHER = '.jp-LauncherCard[data-category="Notebook"]'


def sign_in(page, hub: Hub, name: str, password: str) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url("**/hub/**", timeout=60_000)


def round_stock(browser, hub: Hub) -> float:
    name = f"s{uuid.uuid4().hex[:8]}"
    page = browser.new_context().new_page()
    sign_in(page, hub, name, "any-password")  # DummyAuthenticator
    page.goto(f"{hub.url}/hub/home")
    return time_click_to_launcher(page, "#start", hub, name)


def time_click_to_launcher(page, selector: str, hub: Hub, name: str) -> float:
    """Click, wait for JupyterLab's launcher, then clean up; return the seconds in between."""
    t0 = time.perf_counter()
    page.click(selector)
    page.wait_for_selector(LAUNCHER, timeout=120_000)
    elapsed = time.perf_counter() - t0
    page.context.close()
    hub.stop_server(name)
    return elapsed


def round_gpulab(browser, hub: Hub) -> float:
    name, password = f"g{uuid.uuid4().hex[:8]}", "correct-horse-battery"
    page = browser.new_context().new_page()
    page.goto(f"{hub.url}/hub/signup")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.fill("#password_confirmation_input", password)
    page.click("#signup_submit")
    sign_in(page, hub, name, password)
    page.goto(f"{hub.url}/hub/spawn/{name}")
    page.check('input[name="gpu"][value="a100-80g"]')
    page.check('input[name="datasets"][value="sklearn-toy"]')
    return time_click_to_launcher(page, 'button[type="submit"]', hub, name)


def main() -> int:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="gpulab-browser-bench-"))
    stock = stock_hub(base)
    gpulab = Hub(base / "gpulab" / "data", simulate="A100-80G:2", env={"GPULAB_OPEN_SIGNUP": "1"})
    results: dict[str, list[float]] = {"stock": [], "gpulab": []}
    try:
        start_stock(stock)
        gpulab.start()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            round_stock(browser, stock)  # warm-up: caches, first JupyterLab build of assets
            round_gpulab(browser, gpulab)
            for i in range(args.rounds):
                results["stock"].append(round_stock(browser, stock))
                results["gpulab"].append(round_gpulab(browser, gpulab))
                print(
                    f"  round {i + 1}/{args.rounds}: stock {results['stock'][-1]:.2f}s  "
                    f"gpulab {results['gpulab'][-1]:.2f}s",
                    flush=True,
                )
            browser.close()
    finally:
        stock.stop()
        gpulab.stop()

    print(f"\nclick Start -> JupyterLab launcher visible, {args.rounds} rounds, headless Chromium")
    s50, g50 = statistics.median(results["stock"]), statistics.median(results["gpulab"])
    print(f"  stock   p50 {s50:.2f}s  p95 {pct(results['stock'], 0.95):.2f}s")
    print(f"  gpulab  p50 {g50:.2f}s  p95 {pct(results['gpulab'], 0.95):.2f}s")
    print(f"  ratio p50 {g50 / s50:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
