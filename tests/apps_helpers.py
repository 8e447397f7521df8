"""A hub ready for one-click apps: the tiny random-weight pipeline in its model store."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from billing.client import Billing
from harness import FAST_BILLING_ENV, VENV_BIN, Hub, wait_for


def make_tiny_model(hub: Hub) -> None:
    """The operator's step: the catalog's `tiny-sd` model into the hub's data dir."""
    done = subprocess.run(
        [str(VENV_BIN / "gpulab"), "models", "--make-tiny-sd", "--data-dir", str(hub.data_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tiny-sd" in done.stdout and "present" in done.stdout


def apps_hub(factory: Callable[..., Hub], name: str, model: bool = True, **settings) -> Hub:
    """A started hub (simulated RTX 4090 x2 and A100 x1) with the tiny model (unless ``model``
    is false: an empty model store) and billing up."""
    settings.setdefault("simulate", "RTX-4090:2,A100-80G:1")
    settings.setdefault("env", FAST_BILLING_ENV)
    hub = factory(name, start=False, **settings)
    if model:
        make_tiny_model(hub)
    hub.start()
    wait_for(Billing(hub).up, 30, 0.2, "the billing service")
    return hub


class Console:
    """What a developer console shows in red for one tab: console errors, page errors and
    answers >= 400 (the browser logs each of those as an error)."""

    def __init__(self, page) -> None:
        self.seen: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.seen.append(f"pageerror: {e}"))
        page.on("response", self._response)

    def _console(self, msg) -> None:
        if msg.type == "error":
            self.seen.append(f"console: {msg.text} ({msg.location.get('url', '')})")

    def _response(self, response) -> None:
        if response.status >= 400:
            self.seen.append(f"{response.status} {response.request.method} {response.url}")
