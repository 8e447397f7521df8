"""This server's place on the spot market, from the hub's ``GET /hub/api/gpulab/spot/status/USER``.

The hub's answer is turned into one small shape the frontend understands, defensively (a hub
of another version, or one without a spot market, must not break the page):

- ``{"spot": False, "pricing": "on-demand"}``: this server is not a spot server; nothing to show;
- ``{"spot": True, "available": False, "reason": ...}``: the hub did not answer usably;
- ``{"spot": True, "available": True, "price", "max_price", "currency", "time", "preemption",
  "queued", ...}``: the current spot price per card-hour, this server's bid, the hub's clock
  (the page counts down from ``deadline - time``, so a wrong client clock does not matter) and
  the latest preemption of this server, if any.
"""

from __future__ import annotations

import os
from decimal import Decimal, InvalidOperation
from typing import Any

PREEMPTION_STATES = ("warning", "cancelled", "stopped")


def _money(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        out = Decimal(str(value).strip())
    except InvalidOperation:
        return None
    return str(out) if out.is_finite() and out >= 0 else None


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _home_relative(path: str | None, home: str | None) -> str | None:
    """``/srv/users/ada/.gpulab/checkpoints/X.log`` -> ``~/.gpulab/checkpoints/X.log``: the hub
    writes host paths, the user knows the file by its place in their home."""
    if not path:
        return None
    if home and path.startswith(home.rstrip("/") + "/"):
        return "~/" + path[len(home.rstrip("/")) + 1 :]
    marker = "/.gpulab/checkpoints/"
    if marker in path:
        return "~" + path[path.index(marker) :]
    return path


def _checkpoint(data: Any, home: str | None) -> dict[str, Any] | None:
    """The user's checkpoint command as the hub records it: running from its start, then its
    result."""
    if not isinstance(data, dict):
        return None
    exit_code = data.get("exit_code")
    error = _text(data.get("error"))
    if data.get("state") in ("running", "done", "failed"):
        state = data["state"]  # the hub says how far it got (running from its start)
    elif isinstance(exit_code, int) and not isinstance(exit_code, bool) and not error:
        state = "done" if exit_code == 0 else "failed"
    elif error:
        state = "failed"
    else:
        state = "running"
    return {
        "state": state,
        "exit_code": exit_code if isinstance(exit_code, int) else None,
        "error": error,
        "command": _text(data.get("command")),
        "log": _home_relative(_text(data.get("log")), home),
    }


def _preemption(data: Any, home: str | None) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        return None
    status = data.get("status")
    deadline = _number(data.get("deadline"))
    if status not in PREEMPTION_STATES or deadline is None or not _text(data.get("id")):
        return None
    seconds_left = _number(data.get("seconds_left"))
    signalled = data.get("signalled_pids")
    return {
        "id": data["id"],
        "status": status,
        "reason": _text(data.get("reason")) or "",
        "price": _money(data.get("price")),
        "max_price": _money(data.get("max_price")),
        "warned_at": _number(data.get("warned_at")),
        "deadline": deadline,
        "seconds_left": None if seconds_left is None else max(0.0, seconds_left),
        "cancelled_at": _number(data.get("cancelled_at")),
        "stopped_at": _number(data.get("stopped_at")),
        "signalled": len(signalled) if isinstance(signalled, list) else 0,
        "checkpoint": _checkpoint(data.get("checkpoint"), home),
    }


def unavailable(reason: str) -> dict[str, Any]:
    return {"spot": True, "available": False, "reason": reason}


def not_spot(pricing: str) -> dict[str, Any]:
    return {"spot": False, "pricing": pricing}


def normalize_spot(
    data: Any, default_currency: str = "", home: str | None = None
) -> dict[str, Any]:
    """The hub's spot status -> the page's shape; an answer without a readable hub clock or
    price is "unavailable" (the countdown needs the clock)."""
    home = os.path.expanduser("~") if home is None else home
    if not isinstance(data, dict):
        return unavailable("the hub answered something that is not a JSON object")
    hub_time = _number(data.get("time"))
    if hub_time is None:
        return unavailable("the hub's answer has no clock (time)")
    price = _money(data.get("price"))
    if price is None and data.get("running") is not False:
        return unavailable("the hub's answer has no readable spot price")
    queued = data.get("queued")
    return {
        "spot": True,
        "available": True,
        "running": data.get("running") is not False,
        "gpu_type": _text(data.get("gpu_type")),
        "price": price,
        "max_price": _money(data.get("max_price")),
        # What this server costs per hour now, as the hub priced it (billing's own price
        # function: the spot price in force, never above the bid, times the cards).
        "price_per_hour": _money(data.get("price_per_hour")),
        "currency": _text(data.get("currency")) or default_currency,
        "low_price_window": data.get("low_price_window") is True,
        "warning_seconds": _number(data.get("warning_seconds")),
        "time": hub_time,
        "preemption": _preemption(data.get("preemption"), home),
        "queued": queued.get("id") if isinstance(queued, dict) else None,
        # The page saves open documents with changes this often while on spot (0/None: off).
        "save_interval_seconds": _number(data.get("save_interval_seconds")),
    }
