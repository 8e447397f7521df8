"""A local server's checkpoint command, run by the same agent that runs it in containers.

The hub starts :mod:`gpulab.spawners.inside.agent` as a subprocess (``python -I -m ...``, from
``/`` rather than the user's home, so nothing the user put there is imported) with the server's
environment. The agent runs the command with bash in the home, keeps its output in
``~/.gpulab/checkpoints/<UTC time>.log`` and kills the command's process group at the limit; one
implementation for local servers and containers alike.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from gpulab.spawners.agent_reports import CheckpointReport
from gpulab.spawners.inside import agent
from gpulab.spawners.inside.agent import checkpoint_log, checkpoint_state

# Seconds the agent may take beyond the command's limit to start and report: past that it is
# stuck itself and is killed.
AGENT_MARGIN = 30.0


async def run_checkpoint(
    command: str,
    home: str,
    env: dict[str, str],
    limit: float,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run ``command`` with bash in ``home`` and environment ``env``, through the agent
    (``preexec_fn`` puts it where the server runs: its cgroup and its user's account).

    ``on_start`` is called with the running result (command, log path, the command's pid) once
    the command runs, so the caller can show "running" while it runs; ``on_result`` with the
    result as soon as the agent reports it, before the agent has exited and been reaped. The
    result adds ``exit_code`` (None when killed at ``limit``, with ``error``), ``finished_at``
    and ``state`` (done or failed)."""
    log = checkpoint_log(home)
    result: dict[str, Any] = {
        "command": command,
        "state": "running",
        "log": log,
        "started_at": time.time(),
    }
    spec = json.dumps(
        {"command": command, "home": home, "log": log, "limit": limit, "report_start": True}
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-m",
        agent.__name__,
        "checkpoint",
        spec,
        cwd="/",
        env=env,
        preexec_fn=preexec_fn,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stdout = proc.stdout

    async def read_result() -> dict[str, Any] | None:
        async for line in stdout:
            # The agent runs as the user: what it prints is checked before it is recorded.
            try:
                report = CheckpointReport.model_validate_json(line).model_dump(exclude_unset=True)
            except ValueError:
                continue
            if "exit_code" in report:
                final = {**result, **report, "state": checkpoint_state(report)}
                if on_result is not None:
                    on_result(final)
                return final
            if report.get("pid") and on_start is not None:
                on_start({**result, "pid": report["pid"]})
        return None

    try:
        # stderr is read alongside: an agent blocked on a full pipe would never report.
        final, err = await asyncio.wait_for(
            asyncio.gather(read_result(), proc.stderr.read()), limit + AGENT_MARGIN
        )
        code = await proc.wait()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        final, code, err = None, None, b"it did not report in time"
    if final is not None and code == 0:
        return final
    tail = err.decode(errors="replace").strip()[-500:]
    result["exit_code"] = None
    result["error"] = f"the checkpoint agent failed (exit code {code}): {tail}"
    result["finished_at"] = time.time()
    result["state"] = checkpoint_state(result)
    return result
