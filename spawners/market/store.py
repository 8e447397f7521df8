"""Small durable JSON files of the spot market in ``DATA_DIR/spot/``, and how orders look in them.

- ``state.json``: pinned prices, running spot servers' bids and the queue (:data:`STATE_FILE`);
- ``preemptions.jsonl``: every version of every preemption record, latest last;
- ``settings.json``: per-user webhook and checkpoint settings with webhook secrets (mode 0600).

Each write is atomic (temporary file, fsync, rename) or an fsynced append, so a SIGKILL leaves
either the old or the new record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpulab.spawners.market.core import Order

STATE_FILE = "state.json"
PREEMPTIONS_FILE = "preemptions.jsonl"
SETTINGS_FILE = "settings.json"


def write_json_atomic(path: Path, data: Any, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return default


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write((json.dumps(record) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return out
    for line in raw.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def order_to_json(o: Order) -> dict[str, Any]:
    """An order as stored: its bid as a decimal string (floats would round it)."""
    out = asdict(o)
    out["max_price"] = None if o.max_price is None else str(o.max_price)
    return out


def order_from_json(rec: dict[str, Any]) -> Order:
    rec = dict(rec)
    rec["max_price"] = None if rec.get("max_price") is None else Decimal(rec["max_price"])
    return Order(**rec)


def load_state(market_dir: Path) -> tuple[dict[str, Decimal], list[Order], list[dict[str, Any]]]:
    """The saved pins, bids of running spot servers, and queue entries (their orders decoded)."""
    state = read_json(market_dir / STATE_FILE, {})
    pins = {k: Decimal(v) for k, v in state.get("pins", {}).items()}
    bids = [order_from_json(rec) for rec in state.get("bids", [])]
    queue = [{**e, "order": order_from_json(e["order"])} for e in state.get("queue", [])]
    return pins, bids, queue


def save_state(
    market_dir: Path,
    pins: dict[str, Decimal],
    bids: Iterable[Order],
    queue: Iterable[dict[str, Any]],
) -> None:
    """Replace ``state.json`` with these pins, bids and queue entries."""
    write_json_atomic(
        market_dir / STATE_FILE,
        {
            "pins": {k: str(v) for k, v in pins.items()},
            "bids": [order_to_json(o) for o in bids],
            "queue": [{**e, "order": order_to_json(e["order"])} for e in queue],
        },
    )
