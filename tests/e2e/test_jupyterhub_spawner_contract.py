"""gpulab-local keeps JupyterHub's Spawner contract: JupyterHub's own spawner tests pass on it.

The installed ``jupyterhub/tests/test_spawner.py`` runs in a separate pytest, unchanged, with
``jupyterhub_contract_plugin`` making gpulab's GpuLocalSpawner the local-process spawner its tests
and its mock hub use (in no-GPU mode, on a fresh data dir). Nothing of JupyterHub's test code is
imported here: running their file is the point.

Two runs:

1. gpulab-local as configured by default: every test except those below.
2. ``wait_until_listening = False``, for the tests whose command is no server at all (a script
   that prints and sleeps, or a mocked Popen): by default gpulab's start() returns only once the
   server listens on its port, which such a command never does, and JupyterHub's
   LocalProcessSpawner returns at once. With the option off, gpulab-local does the same and
   these tests hold it to LocalProcessSpawner's process handling (popen_kwargs, SIGINT/SIGTERM
   escalation, poll after a hub restart). test_shell_cmd starts a real server, so it is in run 1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jupyterhub
import pytest
from conftest import require
from harness import REPO, passable_for_accounts, run_whole

from gpulab.spawners.local.spawner import GpuLocalSpawner
from gpulab.spawners.node.pool import GpuPool

# The plugin module lives at the top of tests/.
TESTS = Path(__file__).resolve().parent.parent
JUPYTERHUB_TESTS = Path(jupyterhub.__file__).resolve().parent / "tests"

# Deliberate differences: JupyterHub tests left out, and why.
DESELECTED = {
    "test_predefined_options_from_form[default]": (
        "gpulab's default options_from_form parses gpulab's own spawn form (gpu, gpus, image, "
        "datasets, pricing, ...) into its spawn options instead of passing the form data through "
        "unchanged; the test's 'passthrough' and 'simple' cases, which set options_from_form, run."
    ),
}

# Run 2 only (see the module docstring): their commands never listen on the server's port.
NOT_SERVERS = [
    "test_spawner",
    "test_stop_spawner_sigint_fails",
    "test_stop_spawner_stop_now",
    "test_spawner_poll",
    "test_popen_kwargs",
]

# Outcomes that count against the contract (a skip too: nothing here should need skipping).
NOT_PASSED = {"failed", "error", "errors", "skipped", "xfailed", "xpassed"}

PYTEST_INI = """\
[pytest]
# What JupyterHub's tests need: plain async tests, and module-scoped async fixtures (their mock
# hub) on the tests' loop.
asyncio_mode = auto
asyncio_default_fixture_loop_scope = module
asyncio_default_test_loop_scope = module
markers =
    ssl: JupyterHub's marker for tests that also run with internal SSL
# One stuck test fails alone, named, well inside the outer test's own limit.
timeout = 60
"""


def run_jupyterhub_tests(tmp_path: Path, name: str, **env: str) -> tuple[int, str]:
    """Run JupyterHub's test_spawner.py against gpulab-local; return pytest's code and output."""
    # Their async tests and fixtures need it; without it every one of them errors.
    require(importlib.util.find_spec("pytest_asyncio") is not None, "pytest-asyncio (.[test])")
    work = tmp_path / name
    (work / "data").mkdir(parents=True)
    passable_for_accounts(work / "data")  # homes of the servers' own accounts (a root hub)
    (work / "pytest.ini").write_text(PYTEST_INI)
    node_bin = REPO / "node_modules" / ".bin"  # configurable-http-proxy for their mock hub
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "PYTEST_"))},
        "GPULAB_DATA_DIR": str(work / "data"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), str(node_bin), os.defpath]),
        **env,
    }
    full_env.pop("SSL_ENABLED", None)
    done = run_whole(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(work / "pytest.ini"),
            "--rootdir",
            str(work),
            "--confcutdir",
            str(JUPYTERHUB_TESTS),
            "-p",
            "jupyterhub_contract_plugin",
            "-p",
            "no:cacheprovider",
            "-rfEs",
            "-q",
            str(JUPYTERHUB_TESTS / "test_spawner.py"),
        ],
        timeout=270,
        what="JupyterHub's spawner tests",
        cwd=work,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    return done.returncode, done.stdout


def counts(output: str) -> dict[str, int]:
    """pytest's closing line as {outcome: count}, e.g. {"passed": 40, "deselected": 6}."""
    last = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    assert last, output[-3000:]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last[-1])}


def test_jupyterhub_spawner_tests_pass_on_gpulab_local(tmp_path: Path, chp_installed) -> None:
    code, output = run_jupyterhub_tests(
        tmp_path,
        "default",
        GPULAB_CONTRACT_DESELECT=json.dumps([*DESELECTED, *NOT_SERVERS]),
    )
    assert code == 0, output[-6000:]
    result = counts(output)
    assert not NOT_PASSED & set(result), output[-6000:]
    assert result.get("deselected") == len(DESELECTED) + len(NOT_SERVERS), output[-6000:]
    assert result.get("passed", 0) >= 30, output[-6000:]
    # gpulab's spawner really ran their servers: its ledger and its per-server logs are there.
    data = tmp_path / "default" / "data"
    assert (data / "allocations.json").exists() and list((data / "logs").glob("*.log"))


def test_jupyterhub_process_tests_pass_without_the_listening_wait(tmp_path: Path) -> None:
    code, output = run_jupyterhub_tests(
        tmp_path,
        "no-wait",
        GPULAB_CONTRACT_WAIT="0",
        GPULAB_CONTRACT_ONLY=json.dumps(NOT_SERVERS),
    )
    assert code == 0, output[-6000:]
    result = counts(output)
    assert result.get("passed") == len(NOT_SERVERS), output[-6000:]
    assert not NOT_PASSED & set(result), output[-6000:]


def test_shell_cmd_and_popen_kwargs_start_servers_with_popen_not_the_fork_server() -> None:
    # A forked server runs no shell and is no Popen: either option means a new process.
    assert GpuLocalSpawner().uses_forkserver()
    assert not GpuLocalSpawner(use_forkserver=False).uses_forkserver()
    assert not GpuLocalSpawner(popen_kwargs={"umask": 0o077}).uses_forkserver()
    spawner = GpuLocalSpawner(shell_cmd=["bash", "-l", "-c"])
    assert not spawner.uses_forkserver()
    # As LocalProcessSpawner does: the whole command, quoted, is the shell's last argument.
    line = spawner.command_line()
    assert line[:3] == ["bash", "-l", "-c"] and len(line) == 4
    assert shlex.split(line[3]) == [*spawner.cmd, *spawner.get_args()]


@pytest.fixture
def no_pool_left():
    """The spawner below makes the process's GpuPool singleton; later tests on this worker must
    not inherit it (their own config would be ignored: 0 cards)."""
    yield
    GpuPool.clear_instance()


def test_clear_state_clears_everything_gpulab_saved(no_pool_left) -> None:
    spawner = GpuLocalSpawner(pid=12345)
    spawner.load_gpulab_state({"options": {"gpu": "none"}})
    spawner.mode_label = "No GPU"
    assert {"pid", "options", "mode_label"} <= set(spawner.get_state())
    spawner.clear_state()
    assert spawner.get_state() == {}
    assert (spawner.gpulab_request, spawner.mode_label, spawner.allocation) == (None, "", None)
    # A request rejected later still finds the stopped server's choices to put back.
    assert spawner._last_good_options()["gpu"] == "none"
