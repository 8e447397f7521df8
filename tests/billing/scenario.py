"""Build realistic event streams (hub + reporter) for store-level tests and the benchmark."""

from __future__ import annotations

import uuid
from typing import Any


def eid() -> str:
    return uuid.uuid4().hex


def server_start(user: str, t: float, gpu: str = "a100-80g", gpus: int = 1, server: str = ""):
    return {
        "id": eid(),
        "kind": "server_start",
        "user": user,
        "server": server,
        "t": t,
        "gpu": gpu,
        "gpus": gpus if gpu != "none" else 0,
        "pricing": "on-demand",
        "options": {"image": "base", "gpu": gpu, "datasets": []},
    }


def server_stop(user: str, t: float, server: str = ""):
    return {"id": eid(), "kind": "server_stop", "user": user, "server": server, "t": t}


def kernel(kind: str, user: str, kid: str, t: float, server: str = ""):
    return {
        "id": eid(),
        "kind": kind,
        "user": user,
        "server": server,
        "t": t,
        "kernel": kid,
        "name": "python3",
    }


def app(kind: str, user: str, run: str, t: float, name: str = "sd-webui", server: str = ""):
    return {
        "id": eid(),
        "kind": kind,
        "user": user,
        "server": server,
        "t": t,
        "app": run,
        "name": name,
    }


def heartbeat(
    user: str, t: float, kernels: list[str], server: str = "", apps: list[str] | None = None
):
    ev = {
        "id": eid(),
        "kind": "heartbeat",
        "user": user,
        "server": server,
        "t": t,
        "kernels": kernels,
    }
    if apps is not None:  # reporters that predate apps send no "apps" at all
        ev["apps"] = apps
    return ev


def session_events(
    user: str,
    t0: float,
    kernels: list[tuple[float, float]],
    *,
    gpu: str = "a100-80g",
    gpus: int = 1,
    stop_at: float | None = None,
    hb: float = 10.0,
    server: str = "",
) -> list[dict[str, Any]]:
    """A server started at t0 with kernels alive over (start, end) offsets, heartbeats every hb."""
    out = [server_start(user, t0, gpu, gpus, server)]
    ids = [f"{user}-{server}-{t0}-{i}" for i in range(len(kernels))]
    end = max([e for _, e in kernels] + [0.0])
    for kid, (a, b) in zip(ids, kernels, strict=True):
        out.append(kernel("kernel_start", user, kid, t0 + a, server))
        out.append(kernel("kernel_stop", user, kid, t0 + b, server))
    t = hb
    while t <= end + hb:
        alive = [kid for kid, (a, b) in zip(ids, kernels, strict=True) if a <= t <= b]
        out.append(heartbeat(user, t0 + t, alive, server))
        t += hb
    if stop_at is not None:
        out.append(server_stop(user, t0 + stop_at, server))
    return out
