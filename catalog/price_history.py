"""The spot price history: every price change per GPU type, shared by the market and billing.

The price history is an append-only JSON-lines file, one line per price change::

    {"t": 1764460800.125, "gpu_type": "a100-80g", "price": "0.90"}

Each line is written and fsynced before the new price takes effect, so after a SIGKILL the file
still says which price was in force at every second (a torn last line is skipped on reading).
The hub's spot market writes it; billing reads it (through :class:`PriceHistory` or
:func:`price_at`) to rate each spot second. It sits with the catalog because both processes use
it and neither owns the other.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpulab.catalog import settings

PRICES_FILE = "spot-prices.jsonl"


def market_dir(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / "spot"


class PriceHistory:
    """Every spot price change per GPU type, in memory and on disk."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._times: dict[str, list[float]] = {}
        self._prices: dict[str, list[Decimal]] = {}
        self._lock = threading.Lock()
        self._loaded_size = 0
        self.reload()

    def reload(self) -> None:
        """Read lines appended since the last read (by another process, or before a restart)."""
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._loaded_size)
                    data = f.read()
            except FileNotFoundError:
                return
            end = data.rfind(b"\n") + 1  # a line without its newline is still being written
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                    self._add(rec["gpu_type"], float(rec["t"]), Decimal(rec["price"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn line from a crash mid-write
            self._loaded_size += end

    def _add(self, gpu_type: str, t: float, price: Decimal) -> None:
        times = self._times.setdefault(gpu_type, [])
        prices = self._prices.setdefault(gpu_type, [])
        if times and t < times[-1]:
            t = times[-1]  # the clock stepped back: keep the history ordered
        times.append(t)
        prices.append(price)

    def record(self, gpu_type: str, t: float, price: Decimal) -> bool:
        """Store ``price`` as in force from ``t`` on. Returns False (writes nothing) if unchanged."""
        current = self.latest(gpu_type)
        if current is not None and current == price:
            return False
        line = json.dumps({"t": round(t, 3), "gpu_type": gpu_type, "price": str(price)}) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            with open(self.path, "ab") as f:
                f.write(line.encode())
                f.flush()
                os.fsync(f.fileno())
                self._loaded_size = f.tell()
            self._add(gpu_type, round(t, 3), price)
        return True

    def latest(self, gpu_type: str) -> Decimal | None:
        prices = self._prices.get(gpu_type)
        return prices[-1] if prices else None

    def price_at(self, gpu_type: str, t: float) -> Decimal | None:
        """The price in force at ``t`` (the last change at or before it); None before the first."""
        times = self._times.get(gpu_type, [])
        i = bisect.bisect_right(times, t)
        return self._prices[gpu_type][i - 1] if i else None

    def window(self, gpu_type: str, start: float, end: float) -> list[tuple[float, Decimal]]:
        """Read-only: the change in force at ``start`` (if any) and every change before ``end``.

        Billing cuts a billed interval at these times; the lock keeps a concurrent ``reload`` in
        another thread from showing a time whose price is not appended yet.
        """
        with self._lock:
            times = self._times.get(gpu_type, [])
            prices = self._prices.get(gpu_type, [])
            lo = max(bisect.bisect_right(times, start) - 1, 0)
            hi = bisect.bisect_left(times, end)
            return list(zip(times[lo:hi], prices[lo:hi], strict=True))

    def changes(self, gpu_type: str, since: float) -> list[dict[str, Any]]:
        """Changes after ``since``, led by the price already in force at ``since``."""
        times = self._times.get(gpu_type, [])
        prices = self._prices.get(gpu_type, [])
        i = bisect.bisect_right(times, since)
        start = max(i - 1, 0)
        return [{"t": times[k], "price": str(prices[k])} for k in range(start, len(times))]


_HISTORIES: dict[Path, PriceHistory] = {}


def history_for(data_dir: str | os.PathLike) -> PriceHistory:
    """The (cached) price history of a data dir, with lines written since the last call."""
    path = (market_dir(data_dir) / PRICES_FILE).resolve()
    hist = _HISTORIES.get(path)
    if hist is None:
        hist = _HISTORIES[path] = PriceHistory(path)
    else:
        hist.reload()
    return hist


def price_at(gpu_type: str, t: float, data_dir: str | os.PathLike | None = None) -> Decimal:
    """The spot price per card-hour of ``gpu_type`` in force at Unix time ``t``.

    This is billing's seam: rate each spot second ``t`` at ``price_at(gpu_type, t)``. Works in the
    hub process and in any other process on the node (it reads the history file in the data dir,
    default ``$GPULAB_DATA_DIR``). Raises :class:`LookupError` when no price was in force at ``t``.
    """
    data_dir = data_dir or settings.get("GPULAB_DATA_DIR")
    price = history_for(data_dir).price_at(gpu_type, t)
    if price is None:
        raise LookupError(f"no spot price recorded for {gpu_type} at or before t={t}")
    return price
