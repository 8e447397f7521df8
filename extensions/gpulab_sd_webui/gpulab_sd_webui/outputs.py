"""Where generated images go: ``DATA_DIR/outputs/txt2img-images/YYYY-MM-DD/NNNNN-SEED.png``,
A1111's layout, in the user's own home."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

_NUMBERED = re.compile(r"^(\d{5,})-")


def txt2img_dir(data_dir: Path) -> Path:
    return data_dir / "outputs" / "txt2img-images"


def _next_number(folder: Path) -> int:
    numbers = [int(m.group(1)) for p in folder.iterdir() if (m := _NUMBERED.match(p.name))]
    return max(numbers, default=-1) + 1


def save_png(data_dir: Path, png: bytes, seed: int, day: str | None = None) -> Path:
    """Write ``png`` under today's folder with the next free number; never overwrites, and a
    reader never sees a half-written file."""
    folder = txt2img_dir(data_dir) / (day or time.strftime("%Y-%m-%d"))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{os.getpid()}-{seed}.png.tmp"
    tmp.write_bytes(png)
    try:
        number = _next_number(folder)
        while True:
            path = folder / f"{number:05d}-{seed}.png"
            try:
                # link() fails on an existing name, where rename() would replace it.
                os.link(tmp, path)
                return path
            except FileExistsError:
                number += 1
    finally:
        tmp.unlink(missing_ok=True)
