"""Which checkpoint a job's attempt resumed from, as the hub shows it (issue 26: "preemption that
does not lose the run"; ``Attempt.resumed_from``).

The real job runner (spawners/inside/jobrunner.py) runs a command with a checkpoint in the job's
folder and prints its ``[gpulab] resuming from PATH`` line; the hub reads it from its own copy of
the output (the server's log as the spawner keeps it, or the attempt's archive:
hub_config/jobs/logs.py), never from the user's home. The path is the user's own text: shown only,
with control and format characters dropped and its length capped, and a line the user's command
prints afterwards does not replace the runner's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from gpulab.hub_config.jobs import logs
from gpulab.spawners.jobs.model import Attempt

RUNNER = Path(__file__).resolve().parents[2] / "spawners" / "inside" / "jobrunner.py"


def run_job(home: Path, command: str, job_id: int = 7) -> bytes:
    """The real runner's output (stdout and stderr, as the server's log has them)."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "GPULAB_JOB_ID": str(job_id),
        "GPULAB_JOB_ATTEMPT": "2",
        "GPULAB_JOB_COMMAND": command,
    }
    done = subprocess.run(
        [sys.executable, str(RUNNER)],
        env=env,
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout
    return done.stdout


def checkpoint(home: Path, name: str, job_id: int = 7) -> str:
    folder = home / ".gpulab" / "jobs" / str(job_id) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"weights")
    return str(folder / name)


def running_attempt() -> Attempt:
    return Attempt(n=2, started_at=100.0, running_at=100.0, servers=["job-7"])


def test_the_runners_resume_line_fills_resumed_from_while_it_runs(tmp_path: Path) -> None:
    """The checkpoint GPULAB_RESUME named, read from the head of the running server's log; a
    line the user's command prints later (a forged one) changes nothing."""
    home = tmp_path / "home"
    home.mkdir()
    path = checkpoint(home, "step-00000020.pt")
    out = run_job(home, "echo training; echo '[gpulab] resuming from /etc/shadow'")
    assert f"[gpulab] resuming from {path}".encode() in out, out
    log = tmp_path / "logs" / "alice.job-7.log"
    log.parent.mkdir()
    log.write_bytes(out)
    attempt = running_attempt()
    spawner = SimpleNamespace(log_path=log)
    assert asyncio.run(logs.note_resumed(attempt, spawner, now=101.0)) is True
    assert attempt.resumed_from == path
    assert attempt.to_api()["resumed_from"] == path
    # Set once: a later pass does not read it again.
    assert asyncio.run(logs.note_resumed(attempt, spawner, now=102.0)) is False


def test_a_fresh_start_is_an_empty_resumed_from_and_unknown_is_none(tmp_path: Path) -> None:
    """No checkpoint yet: the runner says it starts fresh ("", as GPULAB_RESUME); before the
    runner said anything (or past the watch time) nothing is filled."""
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "job.log"
    log.write_bytes(b"")
    attempt = running_attempt()
    spawner = SimpleNamespace(log_path=log)
    assert asyncio.run(logs.note_resumed(attempt, spawner, now=101.0)) is False
    assert attempt.resumed_from is None
    log.write_bytes(run_job(home, "echo fresh"))
    late = logs.RESUME_WATCH_SECONDS + 101.0
    assert asyncio.run(logs.note_resumed(attempt, spawner, now=late)) is False
    assert asyncio.run(logs.note_resumed(attempt, spawner, now=101.0)) is True
    assert attempt.resumed_from == ""


def test_an_ended_attempt_gets_it_from_its_archive(tmp_path: Path) -> None:
    """An attempt that ended before a pass saw the line: the hub's archive of its output."""
    home = tmp_path / "home"
    home.mkdir()
    path = checkpoint(home, "step-00000040.pt")
    log_dir = tmp_path / "jobs" / "7"
    log_dir.mkdir(parents=True)
    logs.attempt_file(log_dir, 2).write_bytes(run_job(home, "exit 0"))
    attempt = running_attempt()
    assert asyncio.run(logs.archived_resume(log_dir, attempt)) == path
    assert asyncio.run(logs.archived_resume(log_dir, Attempt(n=3, started_at=1.0))) is None


def test_the_users_path_is_shown_without_control_characters_and_capped(tmp_path: Path) -> None:
    """The path is the user's own: terminal escapes, a bidi override, a carriage return and
    bytes that are not UTF-8 are not shown as such; a very long name is cut with an ellipsis."""
    home = tmp_path / "home"
    home.mkdir()
    checkpoint(home, "step-1\x1b[31m\u202etp.evil\r\x07.pt")
    out = run_job(home, "true")
    got = logs.resumed_from_in(out)
    assert got is not None and got.endswith("/step-1[31mtp.evil.pt"), got
    assert all(ch.isprintable() for ch in got), got
    long = logs.resumed_from_in(b"[gpulab] resuming from /x/" + b"a" * 5000 + b"\xff\n")
    assert long is not None and len(long) == logs.RESUME_MAX_CHARS and long.endswith("\u2026")
    assert logs.resumed_from_in(b"[gpulab] resuming from /x/\xffb\n") == "/x/\ufffdb"
    assert logs.resumed_from_in(b"step 1 loss 0.5\n") is None
