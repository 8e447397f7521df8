"""Issue 24, "users see their GPU working", in headless Chromium against a real hub: JupyterLab's
status bar shows the server's card as the hub measures it ("GPU 87% · simulated" while a kernel
burns CPU on a simulated card), the GPU panel shows the card, and once it has sat idle for
``GpuNudge.idle_minutes`` the item turns into "GPU idle …" and a notification offers the no-GPU
switch at the prices billing uses ("switch to no-GPU mode and pay CNY 0.09/h instead of 2.10"),
whose button opens the existing switch dialog; the hub's home page says the same on the server's
card. Every locator below timed out on the old extension and hub (no GPU item, no nudge, no
``/gpu`` API). Set GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from harness import PASSWORD, SLOW, Hub, approved_user, browser_log_in

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")
NUDGE = "switch to no-GPU mode and pay CNY 0.09/h instead of 2.10"
BUSY_LOOP = "import time\nt0 = time.time()\nwhile time.time() - t0 < {seconds}:\n    pass\n"


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), animations="disabled")


@pytest.fixture(scope="module")
def lhub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "labext-gpu",
        simulate="A100-80G:1",
        extra_args=[
            "--CardSampler.interval=0.5",
            "--ActivityObserver.interval=0.5",
            "--GpuNudge.idle_minutes=0.3",
        ],
    )


def test_the_status_bar_shows_the_gpu_working_then_the_idle_nudge(lhub: Hub, browser) -> None:
    hub = lhub
    name = approved_user(hub, "gpu")
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)
        hub.spawn_ready(name, {"gpu": "a100-80g", "gpus": 1}, timeout=120)
        item = page.locator("#gpulab-gpu-status")
        with hub.kernel(name) as k:
            # A kernel burning CPU: the simulated card reads busy, as the hub observes it.
            k.send(BUSY_LOOP.format(seconds=45))
            page.goto(hub.user_url(name, "lab"), timeout=SLOW)
            # (At least 15 %: a loaded CI machine gives the loop only part of a core.)
            page.wait_for_function(
                "() => { const m = /^GPU (\\d+)% · simulated$/.exec("
                "document.querySelector('#gpulab-gpu-status')?.textContent || '');"
                " return m !== null && Number(m[1]) >= 15; }",
                timeout=SLOW,
            )
            assert "Measured by the hub" in (item.get_attribute("title") or "")
            # The item opens the GPU panel: the card, simulated, said plainly.
            item.click()
            panel = page.locator("#gpulab-gpus")
            panel.get_by_text("these GPUs are simulated").wait_for(timeout=SLOW)
            panel.get_by_text("Utilisation", exact=True).wait_for(timeout=SLOW)
            panel.get_by_text("Simulated card: no per-process figures.").wait_for(timeout=SLOW)
            shot(page, "lab-gpu-busy")

        # The loop ended with the kernel: the card sits idle, and after idle_minutes the nudge.
        item.filter(has_text=re.compile(r"^GPU idle ")).wait_for(timeout=SLOW)
        assert "jp-gpulab-gpu-idle" in (item.get_attribute("class") or "")
        toast = page.locator(".Toastify__toast", has_text=NUDGE)
        toast.first.wait_for(timeout=SLOW)
        assert toast.count() == 1  # once per idle episode, not at every poll
        panel.locator(".jp-gpulab-nudge", has_text=NUDGE).wait_for(timeout=SLOW)
        shot(page, "lab-gpu-idle-nudge")

        # The notification's button is the existing switch, with its own confirmation.
        toast.get_by_role("button", name="Switch to no-GPU mode…").click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(timeout=SLOW)
        assert "Switch to no-GPU mode?" in dialog.inner_text()
        assert "CNY 2.10/h → CNY 0.09/h" in dialog.inner_text()
        shot(page, "lab-gpu-switch-dialog")
        dialog.locator(".jp-Dialog-button.jp-mod-reject").click()
        dialog.wait_for(state="detached", timeout=SLOW)
        # Cancelled: nothing changed, the server still holds its card.
        assert hub.server(name)["state"]["options"]["gpu"] == "a100-80g"

        # The hub's home page says it on the server's card too.
        page.goto(f"{hub.url}/hub/home", timeout=SLOW)
        line = page.locator("#gpulab-gpu-line")
        line.filter(has_text=NUDGE).wait_for(timeout=SLOW)
        assert line.inner_text().startswith("GPU idle for ")
        shot(page, "home-gpu-idle-line")
        assert not [e for e in errors if "gpu" in e.lower()], errors
    finally:
        context.close()
        if hub.server(name) is not None:
            hub.stop_server(name)
