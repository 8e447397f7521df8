"""Shared fixtures: one real hub for the suite, hub factories, a fresh user per test, the CI
strictness switch, and the end-of-session check that nothing the suite started still runs.

This directory is pytest's rootdir conftest, so it is on sys.path for every test module below it
(unit/, e2e/, browser/, docker/): they import ``harness``, ``docker_helpers``, ``billing.*``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import harness
import leftovers
import pytest
from harness import CHROMIUM, CHROMIUM_ARGS, REPO, Hub, HubFactory

REQUIRE_ALL = os.environ.get("GPULAB_REQUIRE_ALL") == "1"

# Docker fixtures (docker, test_image, broken_image, catalog) and the multi-engine Swarm
# (swarm_cluster) for the modules that ask for them.
pytest_plugins = ["docker_helpers", "swarm_helpers"]

# Users' servers live at NAME.localhost (hub_config/origin.py): resolve those names as browsers do.
harness.resolve_localhost_names()


def require(condition: bool, what: str) -> None:
    """Skip when a service is missing, except under CI (GPULAB_REQUIRE_ALL=1), where it fails."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"{what} is required (GPULAB_REQUIRE_ALL=1) but missing")
    pytest.skip(f"{what} is missing")


def nvml_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    # `gpu` tests are the one kind that may skip under CI: no machine there has a GPU.
    if nvml_gpus() == 0:
        skip = pytest.mark.skip(reason="no NVIDIA GPU/driver on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def chp_installed() -> None:
    require(
        (REPO / "node_modules" / ".bin" / "configurable-http-proxy").exists()
        or shutil.which("configurable-http-proxy") is not None,
        "configurable-http-proxy (make install)",
    )


@pytest.fixture
def hub_factory(tmp_path_factory, chp_installed):
    """``hub_factory(name, **settings)``: a started Hub (settings as for ``Hub``), stopped when
    the test ends. ``start=False`` returns it unstarted; ``on_stop=f`` runs ``f(hub)`` after."""
    factory = HubFactory(tmp_path_factory.mktemp)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def module_hub_factory(tmp_path_factory, chp_installed):
    """As ``hub_factory``, for hubs shared by a module: stopped after its last test."""
    factory = HubFactory(tmp_path_factory.mktemp)
    yield factory
    factory.close()


@pytest.fixture(scope="session")
def hub(tmp_path_factory, chp_installed) -> Hub:
    """One real hub with a simulated pool of 2 A100-80G and 2 RTX 4090, shared by the suite."""
    factory = HubFactory(tmp_path_factory.mktemp)
    # A generous spawn-page wait, so that a loaded CI machine still takes the direct path.
    yield factory(
        "hub",
        simulate="A100-80G:2,RTX-4090:2",
        extra_args=["--GpuLocalSpawner.ready_redirect_wait=20"],
    )
    factory.close()


@pytest.fixture
def user(hub: Hub):
    """A new user on the shared hub; their server is stopped after the test."""
    name = hub.create_user()
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's package) under Playwright, one per test module."""
    require(shutil.which(CHROMIUM) is not None or Path(CHROMIUM).exists(), "chromium (apt)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "playwright (pip install -e '.[test]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


# ---- nothing outlives the session ----------------------------------------------------------------

# How long a process the session started may take to exit once its fixtures are torn down.
LEFTOVER_GRACE = 5.0
# The session's marker and its snapshot of the machine's processes at the start.
_LEFTOVER_STATE = pytest.StashKey[tuple[str, set]]()
# The per-user accounts (jupyter-NAME) that existed before the session.
_ACCOUNTS = pytest.StashKey[set[str]]()
ACCOUNT_PREFIX = "jupyter-"


def pytest_sessionstart(session) -> None:
    marker = uuid.uuid4().hex
    # Inherited by every process the session starts (see leftovers.py).
    os.environ[leftovers.SESSION_ENV] = marker
    session.stash[_LEFTOVER_STATE] = (marker, leftovers.snapshot())
    session.stash[_ACCOUNTS] = _gpulab_accounts()


def _gpulab_accounts() -> set[str]:
    return {p.pw_name for p in pwd.getpwall() if p.pw_name.startswith(ACCOUNT_PREFIX)}


def _remove_new_accounts(session) -> None:
    """The per-user accounts the session's hubs made (one per test user) go with it: a machine
    that runs the suite again and again must not fill up with them."""
    if os.geteuid() != 0 or _ACCOUNTS not in session.stash:
        return
    userdel = shutil.which("userdel", path="/usr/sbin:/sbin") or shutil.which("userdel")
    for name in sorted(_gpulab_accounts() - session.stash[_ACCOUNTS]):
        if userdel:
            subprocess.run([userdel, name], capture_output=True, check=False, timeout=60)


@pytest.hookimpl(trylast=True)  # after pytest's own finish hook has torn down session fixtures
def pytest_sessionfinish(session, exitstatus) -> None:
    if _LEFTOVER_STATE not in session.stash:
        return
    marker, before = session.stash[_LEFTOVER_STATE]
    data_dirs = list(harness.STARTED_DATA_DIRS)
    hub_ids = set()
    for d in data_dirs:
        try:
            hub_ids.add((d / "hub-id").read_text().strip())
        except OSError:
            pass
    paths = [str(d) for d in data_dirs]
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None and factory._basetemp is not None:
        paths.append(str(factory._basetemp))
    found = leftovers.settle(leftovers.find(before, marker, hub_ids, paths), LEFTOVER_GRACE)
    leftovers.kill(found)
    _remove_new_accounts(session)
    lines = [str(p) for p in found] + leftovers.containers(hub_ids)
    if not lines:
        return
    text = "Still running after the session (now killed or removed):\n" + "\n".join(
        f"  {line}" for line in lines
    )
    report = pytest.TestReport(
        nodeid="tests/conftest.py::leftover processes",
        location=("tests/conftest.py", 0, "leftover processes"),
        keywords={},
        outcome="failed",
        longrepr=text,
        when="teardown",
    )
    # Shown in the ERRORS section and counted in the last line, as a failed teardown would be.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.stats.setdefault("error", []).append(report)
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# A root hub runs each server as its user's own account, whose home is in the test's data dir:
# pytest's own temp root (/tmp/pytest-of-root) is private (0700, reset at every session start),
# so sessions run as root use a temp root of their own that those accounts may pass through
# (0711: no listing).
SHARED_TMP = Path("/tmp/gpulab-pytest")


def pytest_configure(config) -> None:
    # A suite started in the background (`cmd &` in a script: CI, tools/fresh-ci) inherits SIGINT
    # ignored, and every server and kernel it starts would inherit that too, so stopping them with
    # SIGINT, as JupyterHub does, would do nothing. Start them as a terminal would.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.geteuid() != 0 or config.option.basetemp:
        return
    SHARED_TMP.mkdir(mode=0o711, exist_ok=True)
    SHARED_TMP.chmod(0o711)
    for old in SHARED_TMP.iterdir():  # runs of other days
        if time.time() - old.stat().st_mtime > 12 * 3600:
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = tempfile.mkdtemp(prefix="run-", dir=SHARED_TMP)


@pytest.fixture(scope="session", autouse=True)
def homes_reachable(tmp_path_factory) -> None:
    if os.geteuid() == 0:
        tmp_path_factory.getbasetemp().chmod(0o711)
