"""Screenshots for the Chromium tests: with GPULAB_SCREENSHOTS=DIR set, ``shot(page, NAME)``
keeps the whole page as DIR/NAME.png (a person looks at them; the tests do not read them)."""

from __future__ import annotations

import os
from pathlib import Path

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")


def shot(page, name: str) -> None:
    """The whole page, animations stopped, when GPULAB_SCREENSHOTS names a folder; else nothing."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(
            path=str(Path(SHOTS) / f"{name}.png"), full_page=True, animations="disabled"
        )
