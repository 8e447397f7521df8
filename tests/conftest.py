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

from gpulab.spawners.storage.loopfs import unmount_below

REQUIRE_ALL = os.environ.get("GPULAB_REQUIRE_ALL") == "1"

# Docker fixtures (docker, test_image, broken_image, catalog) and the multi-engine Swarm
# (swarm_cluster) for the modules that ask for them; the test groups of a parallel run.
pytest_plugins = ["docker_helpers", "swarm_helpers", "xdist_helpers"]

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


@pytest.hookimpl(tryfirst=True)  # before anything reads the groups (xdist_helpers.py)
def pytest_collection_modifyitems(config, items):
    # `gpu` tests are the one kind that may skip under CI: no machine there has a GPU.
    if nvml_gpus() == 0:
        skip = pytest.mark.skip(reason="no NVIDIA GPU/driver on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    group_modules_with_shared_fixtures(items)


SHARED_SCOPES = {"module", "class", "package"}


def group_modules_with_shared_fixtures(items) -> None:
    """In a parallel run (``--dist loadgroup``), the tests of a module that shares a fixture
    between its tests (a module's hub, browser, billing service, Docker image) go to one worker,
    in order, so that the fixture is made once, as in a serial run; the other tests are handed
    out one by one. A module that names its own ``xdist_group`` (tests that must not run side by
    side with others of that group: the test swarm, grading) keeps it."""
    shared: set[str] = set()
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or item.get_closest_marker("xdist_group"):
            continue
        if any(d.scope in SHARED_SCOPES for defs in info.name2fixturedefs.values() for d in defs):
            shared.add(item.nodeid.split("::")[0])
    for item in items:
        module = item.nodeid.split("::")[0]
        if module in shared and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(module))


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
_ACCOUNTS = pytest.StashKey[dict[str, str]]()
ACCOUNT_PREFIX = "jupyter-"
# What the workers of a parallel run found and the ids of their hubs, gathered by the controller.
_WORKER_LEFTOVERS = pytest.StashKey[list[str]]()
_WORKER_HUB_IDS = pytest.StashKey[set[str]]()


def worker_id(config) -> str | None:
    """``gw0``... in a pytest-xdist worker; None in the controller of a parallel run or a serial
    one. (Not PYTEST_XDIST_WORKER: a pytest a test starts inherits that variable.)"""
    return getattr(config, "workerinput", {}).get("workerid")


def pytest_sessionstart(session) -> None:
    worker = worker_id(session.config)
    # A worker's marker extends its controller's (inherited: the controller sets it before it
    # starts them), so that the controller's final check recognises every worker's processes.
    inherited = os.environ.get(leftovers.SESSION_ENV)
    if worker and inherited:
        marker = f"{inherited}-{worker}"
    else:
        marker = uuid.uuid4().hex
    # Inherited by every process the session starts (see leftovers.py).
    os.environ[leftovers.SESSION_ENV] = marker
    session.stash[_LEFTOVER_STATE] = (marker, leftovers.snapshot())
    session.stash[_ACCOUNTS] = _gpulab_accounts()
    if os.geteuid() == 0 and worker is None:
        # pytest-xdist makes each worker's temp dir inside this one, which pytest makes 0700:
        # the users' accounts must pass through it (as homes_reachable below, for a serial run).
        session.config._tmp_path_factory.getbasetemp().chmod(0o711)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's
def pytest_testnodedown(node, error) -> None:
    """(Controller) a worker finished: keep what its own check found, and its hubs' ids."""
    output = getattr(node, "workeroutput", None) or {}
    name = getattr(getattr(node, "gateway", None), "id", "worker")
    stash = node.config.stash
    stash.setdefault(_WORKER_LEFTOVERS, []).extend(
        f"[{name}] {line}" for line in output.get("gpulab_leftovers", [])
    )
    stash.setdefault(_WORKER_HUB_IDS, set()).update(output.get("gpulab_hub_ids", []))


def _gpulab_accounts() -> dict[str, str]:
    """The per-user accounts now, and their homes."""
    return {p.pw_name: p.pw_dir for p in pwd.getpwall() if p.pw_name.startswith(ACCOUNT_PREFIX)}


def _remove_new_accounts(session, paths: list[str]) -> None:
    """The per-user accounts the session's hubs made (one per test user) go with it: a machine
    that runs the suite again and again must not fill up with them. Only those new since the
    session started *and* with their home in one of the session's folders (``paths``): another
    worker's, or anyone else's on a shared machine, are not the session's to remove."""
    if os.geteuid() != 0 or _ACCOUNTS not in session.stash:
        return
    userdel = shutil.which("userdel", path="/usr/sbin:/sbin") or shutil.which("userdel")
    dirs = [p.rstrip("/") + "/" for p in paths]
    before = session.stash[_ACCOUNTS]
    for name, home in sorted(_gpulab_accounts().items()):
        if name in before or not any(f"{home.rstrip('/')}/".startswith(d) for d in dirs):
            continue
        if userdel:
            subprocess.run([userdel, name], capture_output=True, check=False, timeout=60)


def _session_paths(session) -> list[str]:
    paths = [str(d) for d in harness.STARTED_DATA_DIRS]
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None and factory._basetemp is not None:
        paths.append(str(factory._basetemp))
    return paths


@pytest.hookimpl(trylast=True)  # after pytest's own finish hook has torn down session fixtures
def pytest_sessionfinish(session, exitstatus) -> None:
    if _LEFTOVER_STATE not in session.stash:
        return
    marker, before = session.stash[_LEFTOVER_STATE]
    hub_ids = set(session.config.stash.get(_WORKER_HUB_IDS, set()))
    for d in harness.STARTED_DATA_DIRS:
        try:
            hub_ids.add((d / "hub-id").read_text().strip())
        except OSError:
            pass
    paths = _session_paths(session)
    # A worker checks its own (its marker, hubs and temp dir); the controller, once every worker
    # is done, the whole run: every worker's marker extends its own, and their temp dirs are in
    # its own.
    found = leftovers.settle(leftovers.find(before, marker, hub_ids, paths), LEFTOVER_GRACE)
    leftovers.kill(found)
    for d in harness.STARTED_DATA_DIRS:
        unmount_below(d)  # the hubs' homes are loop-mounted images (issue 23)
    _remove_new_accounts(session, paths)
    lines = [str(p) for p in found] + leftovers.containers(hub_ids)
    if worker_id(session.config):
        # A worker's report would never reach the terminal: its controller reports it.
        session.config.workeroutput["gpulab_leftovers"] = lines
        session.config.workeroutput["gpulab_hub_ids"] = sorted(hub_ids)
        return
    lines = session.config.stash.get(_WORKER_LEFTOVERS, []) + lines
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
