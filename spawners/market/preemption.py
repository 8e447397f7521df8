"""What a spot server is told before it is reclaimed: signals, a signed webhook, a checkpoint.

- SIGUSR1 goes only to the server's processes that *catch* it (bit 10 of ``SigCgt`` in
  /proc/PID/status): SIGUSR1's default action terminates a process, so a kernel that did not opt
  in (``gpulab_spot.on_preempt``) must never receive it.
- The webhook is a JSON POST signed with HMAC-SHA256 over the exact body bytes::

      X-Gpulab-Event: preemption-warning | preemption-cancelled | preempted
      X-Gpulab-Delivery: <record id>
      X-Gpulab-Signature: sha256=<hex hmac of the body with the user's webhook secret>

- The checkpoint command runs with the server's environment in the user's home, its output kept
  in ``~/.gpulab/checkpoints/<UTC time>.log``. Its result says ``state``: ``running`` from the
  moment it starts (the hub records that at once, so the user sees it during the warning),
  then ``done`` (exit 0) or ``failed`` (another exit code, an error, a timeout).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

# Re-exported: the hub applies the same rule to local servers.
from gpulab.spawners.inside.agent import catches as catches
from gpulab.spawners.inside.agent import checkpoint_log
from gpulab.spawners.inside.agent import signal_opted_in as signal_opted_in
from gpulab.spawners.node.procs import server_processes as server_processes

SIGUSR1_BIT = 1 << (signal.SIGUSR1 - 1)


class Preemption(BaseModel):
    """One preemption, from the warning to its end (stopped, or cancelled)."""

    id: str
    owner: str  # "user/server"
    user: str
    server: str
    gpu_type: str
    reason: str
    status: str  # "warning" | "cancelled" | "stopped"
    price: str  # spot price when the warning went out
    max_price: str | None
    warned_at: float
    deadline: float
    signalled_pids: list[int] = []
    skipped_pids: list[int] = []  # server processes that do not catch SIGUSR1
    webhook: dict[str, Any] | None = None  # url, status code or error
    checkpoint: dict[str, Any] | None = None  # command, exit code, log path
    cancelled_at: float | None = None
    stopped_at: float | None = None

    def public(self) -> dict[str, Any]:
        out = self.model_dump()
        out["seconds_left"] = (
            max(0.0, round(self.deadline - time.time(), 1)) if self.status == "warning" else None
        )
        return out


# ---- signals ---------------------------------------------------------------------------------


# The rule itself (SigCgt, never the default action) lives in the agent module, which also runs
# inside containers: one rule for local servers and containers alike. Which processes belong to
# a local server is node knowledge (gpulab.spawners.node.procs).


# ---- webhook ---------------------------------------------------------------------------------


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def send_webhook(
    url: str, secret: str, event: str, delivery: str, payload: dict[str, Any], limit: float = 10
) -> dict[str, Any]:
    """POST the signed event; never raises (the result is recorded instead)."""
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError

    body = json.dumps({"event": event, **payload}, sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpulab-spot-market",
        "X-Gpulab-Event": event,
        "X-Gpulab-Delivery": delivery,
        "X-Gpulab-Signature": sign(body, secret),
    }
    result: dict[str, Any] = {"url": url, "event": event, "sent_at": time.time()}
    try:
        resp = await AsyncHTTPClient().fetch(
            url, method="POST", body=body, headers=headers, request_timeout=limit
        )
        result["status"] = resp.code
    except HTTPClientError as e:
        result["status"] = e.code
        result["error"] = str(e)
    except Exception as e:  # unreachable host, TLS, DNS: recorded, never fatal
        result["error"] = f"{type(e).__name__}: {e}"
    return result


# ---- checkpoint ------------------------------------------------------------------------------


def checkpoint_state(result: dict[str, Any]) -> str:
    """``running`` until an exit code or an error is known, then ``done`` or ``failed``."""
    if result.get("error"):
        return "failed"
    if "exit_code" not in result:
        return "running"
    return "done" if result["exit_code"] == 0 else "failed"


async def run_checkpoint(
    command: str,
    home: str,
    env: dict[str, str],
    limit: float,
    on_start: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``command`` with bash in ``home``; keep its output under ~/.gpulab/checkpoints/.

    ``on_start`` is called with the running result (command, log path, pid) once the process
    exists, so the caller can show "running" while it runs."""
    log_path = Path(checkpoint_log(home))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": command,
        "state": "running",
        "log": str(log_path),
        "started_at": time.time(),
    }
    # A local file: these writes are not worth a thread.
    log_path.write_bytes(f"$ {command}\n".encode())  # noqa: ASYNC240
    with log_path.open("ab") as log:  # noqa: ASYNC230
        proc = await asyncio.create_subprocess_exec(
            "/bin/bash",
            "-c",
            command,
            cwd=home,
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        if on_start is not None:
            on_start({**result, "pid": proc.pid})
        try:
            result["exit_code"] = await asyncio.wait_for(proc.wait(), limit)
        except TimeoutError:
            # The whole group, as in a container (preemption_agent): the command's children
            # must not outlive its time either.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
            result["exit_code"] = None
            result["error"] = f"timed out after {limit:.0f}s"
    result["finished_at"] = time.time()
    result["state"] = checkpoint_state(result)
    return result
