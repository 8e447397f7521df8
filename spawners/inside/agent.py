"""The steps of a preemption warning that run where the server's processes live.

One implementation for every spawner. For a server in a container the hub can neither see the
container's processes (a hub in its own container, as in docker-compose.yml) nor read its home
volume, so the Docker spawner runs this file inside the container with
``docker exec ... python3 -c <this file's source> signal|checkpoint SPEC``, as the server's user.
The local spawner runs the checkpoint the same way, as ``python -I -m gpulab.spawners.inside.agent
checkpoint SPEC`` with the server's environment, and applies :func:`signal_opted_in` to the
server's own processes. Hence: standard library only, nothing newer than Python 3.8 at run time
(annotations are never evaluated), and no import of gpulab.

- ``signal``: SIGUSR1 to every process of the container that *catches* it (bit 10 of ``SigCgt``
  in /proc/PID/status), the same rule as for local servers; prints ``{"signalled", "skipped"}``.
- ``checkpoint SPEC`` (JSON: command, home, log, limit, optional report_start): runs the command
  with bash in the home, its output appended to the log, killed (with its process group) at the
  limit. Prints the result (``exit_code``, None when killed at the limit, with ``error``;
  ``finished_at``; ``state`` done or failed), preceded with ``report_start`` by a
  ``{"state": "running", "pid"}`` line once the command runs (the local spawner reads it while
  the command runs; ``docker exec`` output is read only at the end, where nothing but the
  result is expected).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHECKPOINT_DIR = ".gpulab/checkpoints"


def catches(pid: int, signum: int = signal.SIGUSR1) -> bool:
    """Whether ``pid`` has a handler installed for ``signum`` (its SigCgt mask)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except (OSError, ValueError):
        pass
    return False


def signal_opted_in(pids: list[int]) -> tuple[list[int], list[int]]:
    """SIGUSR1 to each pid that catches it. Returns (signalled, skipped)."""
    signalled, skipped = [], []
    for pid in pids:
        if not catches(pid):
            skipped.append(pid)
            continue
        try:
            os.kill(pid, signal.SIGUSR1)
            signalled.append(pid)
        except (ProcessLookupError, PermissionError):
            skipped.append(pid)
    return signalled, skipped


def other_processes() -> list[int]:
    """Every process this one can see but itself: in a container, the container's processes."""
    me = os.getpid()
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me)


def checkpoint_name(now: float | None = None) -> str:
    """A checkpoint log's name: its UTC start time."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + ".log"


def checkpoint_log(home: str, now: float | None = None) -> str:
    """Where a checkpoint's output goes: ``~/.gpulab/checkpoints/<UTC time>.log``."""
    return f"{home.rstrip('/')}/{CHECKPOINT_DIR}/{checkpoint_name(now)}"


def checkpoint_state(result: dict[str, Any]) -> str:
    """``running`` until an exit code or an error is known, then ``done`` or ``failed``."""
    if result.get("error"):
        return "failed"
    if "exit_code" not in result:
        return "running"
    return "done" if result["exit_code"] == 0 else "failed"


def run_checkpoint_here(
    command: str,
    home: str,
    log: str,
    limit: float,
    on_start: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run ``command`` with bash in ``home`` (this process's environment), output to ``log``.

    ``on_start`` gets the command's pid once it runs. Returns ``exit_code`` (None when killed at
    the limit, with ``error``), ``finished_at`` and ``state``."""
    path = Path(log)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(f"$ {command}\n".encode())
    result: dict[str, Any] = {}
    with path.open("ab") as out:
        proc = subprocess.Popen(
            ["/bin/bash", "-c", command],
            cwd=home,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if on_start is not None:
            on_start(proc.pid)
        try:
            result["exit_code"] = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            # The whole group: a command's children must not outlive its time either.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            result["exit_code"] = None
            result["error"] = f"timed out after {limit:.0f}s"
    result["finished_at"] = time.time()
    result["state"] = checkpoint_state(result)
    return result


def _print_json(obj: dict[str, Any]) -> None:
    # Flushed: the local spawner reads the "running" line while the command still runs.
    print(json.dumps(obj), flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["signal"]:
        signalled, skipped = signal_opted_in(other_processes())
        print(json.dumps({"signalled": signalled, "skipped": skipped}))
        return 0
    if argv[:1] == ["checkpoint"] and len(argv) == 2:
        spec = json.loads(argv[1])
        result = run_checkpoint_here(
            spec["command"],
            spec["home"],
            spec["log"],
            spec["limit"],
            on_start=(
                (lambda pid: _print_json({"state": "running", "pid": pid}))
                if spec.get("report_start")
                else None
            ),
        )
        _print_json(result)
        return 0
    print("usage: agent signal | checkpoint SPEC", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
