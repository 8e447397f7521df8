"""``make run``'s terminal (issue 22): the install steps are quiet, their errors are not.

On a fresh machine ``make run`` printed 2,361 lines of Yarn's cache messages (and pip's, npm's,
webpack's) before ``gpulab up``, burying how to log in. Each install step now prints one line and
keeps its output in a log file, shown when the step fails. Nothing is installed here: the
Makefile's own ``quietly`` runs a stand-in step, and ``make -n`` shows what the real ones run.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harness import REPO


def make(*args: str, venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(REPO), f"VENV={venv}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def step(recipe: str) -> str:
    """A make rule ``step`` whose recipe runs ``recipe`` through the Makefile's ``quietly``."""
    return f"step: ; $(call quietly,making noise,noise,{recipe})"


def test_a_step_prints_one_line_and_keeps_its_output_in_a_log(tmp_path: Path) -> None:
    noise = "for i in $$(seq 2361); do echo YN0013: fetched package $$i; done"
    done = make("--eval", step(noise), "step", venv=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout + done.stderr == "make: making noise\n"
    log = tmp_path / "make-logs" / "noise.log"
    assert log.read_text().count("YN0013") == 2361


def test_a_failing_step_shows_its_last_lines_and_fails(tmp_path: Path) -> None:
    failing = "for i in $$(seq 500); do echo line $$i; done; echo 'error: no such package'; exit 3"
    done = make("--eval", step(failing), "step", venv=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "error: no such package" in out and "line 500" in out and "line 100\n" not in out
    assert f"FAILED: making noise (exit 3); all its output: {tmp_path}/make-logs/noise.log" in out


def test_every_install_step_of_make_run_goes_through_quietly(tmp_path: Path) -> None:
    # -B: every step, as on a fresh machine; -n: shown, not run.
    plan = make("-n", "-B", "run", venv=tmp_path)
    assert plan.returncode == 0, plan.stderr
    lines = [ln for ln in plan.stdout.splitlines() if ln.strip()]
    installs = [
        ln for ln in lines if re.search(r"\b(pip install|npm install|jlpm (install|build))", ln)
    ]
    assert len(installs) >= 5, lines
    for line in installs:
        assert re.search(rf">{re.escape(str(tmp_path))}/make-logs/[\w-]+\.log 2>&1", line), line
    # `gpulab up` makes the demo model itself, in its own data dir (--data-dir).
    assert lines[-1].strip() == f"{tmp_path}/bin/gpulab up", lines[-1]
    assert not any("--make-tiny-sd" in ln for ln in lines)
