"""What a spot server is told before it is reclaimed: signals, a signed webhook, a checkpoint.

- SIGUSR1 goes only to the server's processes that *catch* it (bit 10 of ``SigCgt`` in
  /proc/PID/status): SIGUSR1's default action terminates a process, so a kernel that did not opt
  in (``gpulab_spot.on_preempt``) must never receive it.
- The webhook is a JSON POST signed with HMAC-SHA256 over the exact body bytes::

      X-Gpulab-Event: preemption-warning | preemption-cancelled | preempted
      X-Gpulab-Delivery: <record id>
      X-Gpulab-Signature: sha256=<hex hmac of the body with the user's webhook secret>

- The checkpoint command runs with the server's environment in the user's home, its output kept
  in ``~/.gpulab/checkpoints/<UTC time>.log``, run by the spawner where the server lives
  (GpuSpawnerMixin.gpulab_run_checkpoint; one agent, gpulab.spawners.inside.agent, for all). Its result says ``state``: ``running`` from the
  moment it starts (the hub records that at once, so the user sees it during the warning),
  then ``done`` (exit 0) or ``failed`` (another exit code, an error, a timeout).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import signal
import time
from typing import Any

from pydantic import BaseModel

# Re-exported: the rule for who gets SIGUSR1, and the checkpoint record's state, are the agent's.
from gpulab.spawners.inside.agent import catches as catches
from gpulab.spawners.inside.agent import checkpoint_state as checkpoint_state

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
# inside containers: one rule for local servers and containers alike. Each spawner signals its
# servers' processes where they live (GpuSpawnerMixin.gpulab_signal_processes).


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
