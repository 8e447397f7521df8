"""Run a callback when gpulab is about to reclaim this spot server.

The hub sends SIGUSR1, at the start of the warning period, to the server's processes that have a
handler for it; :func:`on_preempt` installs one. Python runs the callback in the main thread.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = ["on_preempt", "preemption_status"]

_callbacks: list[Callable[[dict[str, Any]], Any]] = []


def preemption_status(timeout: float = 2.0) -> dict[str, Any] | None:
    """This server's spot status from the hub (deadline, reason), or None if unreachable."""
    api = os.environ.get("JUPYTERHUB_API_URL")
    token = os.environ.get("JUPYTERHUB_API_TOKEN")
    user = os.environ.get("JUPYTERHUB_USER")
    if not (api and token and user):
        return None
    server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    url = f"{api}/gpulab/spot/status/{user}?server={server}"
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def _info() -> dict[str, Any]:
    info: dict[str, Any] = {"signal": "SIGUSR1", "reason": None, "deadline": None}
    status = preemption_status()
    record = (status or {}).get("preemption") or {}
    if record.get("status") == "warning":
        info.update(
            reason=record.get("reason"),
            deadline=record.get("deadline"),
            seconds_left=record.get("seconds_left"),
        )
    return info


def _handler(signum: int, frame: Any) -> None:
    info = _info()
    for callback in list(_callbacks):
        callback(info)


def on_preempt(callback: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """Call ``callback(info)`` when the hub warns that this server will be reclaimed.

    Usable as a decorator. Several callbacks run in the order they were added. Installing the
    handler is what tells the hub this process wants the signal.
    """
    _callbacks.append(callback)
    signal.signal(signal.SIGUSR1, _handler)
    return callback
