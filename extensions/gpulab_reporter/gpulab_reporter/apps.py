"""Which jupyter-server-proxy apps (e.g. Stable Diffusion WebUI) run in this server right now.

jupyter-server-proxy 4.x registers one Tornado handler per configured app that has a command, and
passes it a mutable ``state`` dict as handler kwargs; while the app's process is managed,
``state["proc"]`` is a simpervisor ``SupervisedProcess`` whose public attributes say what we need:
``name`` (the app's name), ``pid`` and ``running`` (False once it exited; simpervisor restarts a
crashed process as a new pid). We reach those dicts through Tornado's public routing API
(``Application.default_router`` -> nested ``RuleRouter`` -> ``Rule.target_kwargs``), so nothing
here imports jupyter-server-proxy or touches its handler classes: a server without it simply has
no apps. ``tests/e2e/test_billing_e2e.py`` runs a real app through a real hub, so an upgrade of
jupyter-server-proxy or simpervisor that changes this shape fails that test loudly.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tornado.routing import RuleRouter


@dataclass(frozen=True)
class AppRun:
    """One run of one app's process. ``run_id`` is unique per run (a restart is a new run)."""

    run_id: str
    name: str
    pid: int
    started: float  # Unix seconds: the process's start time where /proc tells it, else first seen


def _states(router: Any, seen: set[int]) -> list[dict[str, Any]]:
    out = []
    for rule in getattr(router, "rules", []):
        target = rule.target
        if isinstance(target, RuleRouter):
            if id(target) not in seen:
                seen.add(id(target))
                out.extend(_states(target, seen))
            continue
        state = (rule.target_kwargs or {}).get("state")
        if isinstance(state, dict):
            out.append(state)
    return out


def running_processes(web_app: Any) -> list[tuple[str, int]]:
    """(app name, pid) of every jupyter-server-proxy process running now."""
    found: dict[int, tuple[str, int]] = {}
    seen: set[int] = set()
    for router in (
        getattr(web_app, "default_router", None),
        getattr(web_app, "wildcard_router", None),
    ):
        if router is None:
            continue
        for state in _states(router, seen):
            proc = state.get("proc")  # a string for apps jupyter-server-proxy does not start
            name, pid = getattr(proc, "name", None), getattr(proc, "pid", None)
            if (
                getattr(proc, "running", False) is True
                and isinstance(name, str)
                and isinstance(pid, int)
            ):
                found[pid] = (name, pid)
    return sorted(found.values())


def process_start_time(pid: int) -> float | None:
    """A process's start as Unix seconds, from Linux's /proc; None elsewhere or if it is gone.

    Measured as the wall clock minus the process's age (uptime minus its start tick), both read
    at the same moment: exact to a clock tick (10 ms), where /proc/stat's boot time is whole
    seconds and drifts from the wall clock.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        return now - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class AppTracker:
    """Turns successive scans into runs that started and runs that stopped since the last scan."""

    def __init__(self, web_app: Any) -> None:
        self.web_app = web_app
        self.live: dict[tuple[str, int], AppRun] = {}

    def scan(self, now: float | None = None) -> tuple[list[AppRun], list[AppRun], list[AppRun]]:
        """(started, stopped, live) runs."""
        now = time.time() if now is None else now
        current = set(running_processes(self.web_app))
        started = []
        for name, pid in sorted(current - set(self.live)):
            t = process_start_time(pid)
            # Where /proc cannot tell (or tells nonsense), the run starts when first seen.
            t = now if t is None or t > now else t
            run_id = f"{name[:64]}-{pid}-{uuid.uuid4().hex[:8]}"
            self.live[(name, pid)] = run = AppRun(run_id, name, pid, t)
            started.append(run)
        stopped = [self.live.pop(key) for key in sorted(set(self.live) - current)]
        return started, stopped, list(self.live.values())
