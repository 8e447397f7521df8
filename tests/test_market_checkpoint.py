"""One checkpoint runner: a local server's checkpoint runs through the agent that containers run,
with the same record (running, then done/failed with the exit code and the log path)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from gpulab.spawners.inside import agent
from gpulab.spawners.local.checkpoint import run_checkpoint


def test_local_checkpoint_runs_in_the_home_with_the_servers_environment(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # Nothing in the user's home is imported by the agent (isolated mode, started from /).
    planted = home / "gpulab" / "spawners" / "inside"
    planted.mkdir(parents=True)
    for d in (home / "gpulab", home / "gpulab" / "spawners", planted):
        (d / "__init__.py").write_text("")
    marker = home / "planted-agent-ran"
    (planted / "agent.py").write_text(f"open({str(marker)!r}, 'w')\n")
    started: list[dict] = []
    reported: list[dict] = []
    env = {"PATH": os.environ["PATH"], "GPULAB_GPU_TYPE": "rtx-4090", "PYTHONPATH": str(home)}
    result = asyncio.run(
        run_checkpoint(
            "echo saving on $GPULAB_GPU_TYPE in $PWD; exit 3",
            str(home),
            env,
            limit=30,
            on_start=started.append,
            on_result=reported.append,
        )
    )
    [running] = started
    assert reported == [result]  # known before the agent was reaped
    assert running["state"] == "running" and running["pid"] > 0
    assert running["log"] == result["log"] and "exit_code" not in running
    assert result["exit_code"] == 3 and result["state"] == "failed" and "error" not in result
    assert result["log"].startswith(f"{home}/.gpulab/checkpoints/")
    assert result["started_at"] <= result["finished_at"]
    assert not marker.exists()
    assert (
        open(result["log"]).read()
        == f"$ echo saving on $GPULAB_GPU_TYPE in $PWD; exit 3\nsaving on rtx-4090 in {home}\n"
    )


def test_agent_reports_running_then_the_result(tmp_path) -> None:
    """The agent's own protocol: the result alone (as docker exec reads it), or after a
    "running" line when asked (as the local spawner reads it while the command runs)."""
    spec = {"command": "true", "home": str(tmp_path), "log": str(tmp_path / "c.log"), "limit": 5}
    bare = subprocess.run(
        [sys.executable, "-I", "-m", agent.__name__, "checkpoint", json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout.splitlines()
    assert len(bare) == 1 and json.loads(bare[0])["state"] == "done"  # docker exec reads this
    spec["report_start"] = True
    out = subprocess.run(
        [sys.executable, "-I", "-m", agent.__name__, "checkpoint", json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout.splitlines()
    first, last = json.loads(out[0]), json.loads(out[-1])
    assert first["state"] == "running" and first["pid"] > 0
    assert last["exit_code"] == 0 and last["state"] == "done"
