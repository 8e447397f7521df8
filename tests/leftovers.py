"""What a test session leaves running: its processes and containers still there at the end.

In a parallel run (pytest-xdist) each worker is a session of its own, with its own marker
(``CONTROLLER-gwN``), temp dir and hubs, and checks only those: another worker's live servers are
never blamed. The controller then checks the whole run once more, machine-wide, after every
worker has finished: any process carrying its marker or a worker's, or naming the run's temp dir.

conftest.py takes a snapshot of the machine's processes when the session starts and, once every
fixture is torn down, asks ``find`` for the processes that are new *and* the session's own. Other
people's processes on a shared machine are never blamed, even those started meanwhile: a process
is the session's when it

- carries the session's marker in its environment (``SESSION_ENV``, set in the pytest process and
  inherited by every hub, proxy, billing service, PostgreSQL cluster and browser it starts), or
- carries the id of a hub the session started (``GPULAB_HUB_ID``: servers and kernels, whose
  environment the hub builds from scratch), or
- names one of the session's temp dirs in its command line or working directory (fork servers and
  the servers they fork, which never exec: their environment is the fork server's).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gpulab.spawners.node.procs import process_env

SESSION_ENV = "GPULAB_TEST_SESSION"
HUB_ENV = "GPULAB_HUB_ID"
LABEL_HUB = "org.gpulab.hub-id"

# What a leftover is, by its command line (first match wins); the report names it so.
KINDS = [
    ("gpulab.spawners.local.forkserver", "fork server, or a server it forked"),
    ("configurable-http-proxy", "configurable-http-proxy"),
    ("jupyterhub-singleuser", "single-user server"),
    ("gpulab.spawners.inside", "single-user server"),
    ("billing_service", "billing service"),
    ("gpulab_billing", "billing service"),
    ("ipykernel", "kernel"),
    ("postgres", "PostgreSQL"),
    ("chrom", "Chromium"),
    ("playwright", "Playwright driver"),
    (" up ", "hub"),
    ("jupyterhub", "hub"),
]


@dataclass(frozen=True)
class Leftover:
    pid: int
    start: int  # clock ticks after boot: with the pid, tells this process from a later one
    cmdline: str
    kind: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.kind}): {self.cmdline}"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode(errors="replace")  # names: any bytes
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    return fields[0], int(fields[1]), int(fields[19])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def snapshot() -> set[tuple[int, int]]:
    """(pid, start time) of every process now."""
    out = set()
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            out.add((pid, st[2]))
    return out


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _environ(pid: int) -> dict[str, str]:
    return process_env(pid, (SESSION_ENV, HUB_ENV))


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def _kind(cmdline: str) -> str:
    for needle, kind in KINDS:
        if needle in f"{cmdline} ":
            return kind
    return "process"


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        st = _stat(pid)
        if st is None:
            break
        pid = st[1]
    return out


def of_session(value: str | None, marker: str) -> bool:
    """Whether a process's ``SESSION_ENV`` is ``marker``'s: the marker itself, or one of its
    pytest-xdist workers' (``MARKER-gw0``: a parallel run's controller checks them all)."""
    return value is not None and (value == marker or value.startswith(f"{marker}-"))


def find(
    before: set[tuple[int, int]], marker: str, hub_ids: set[str], paths: list[str]
) -> list[Leftover]:
    """The session's processes running now that were not there when it started (not zombies)."""
    mine = _ancestors()
    dirs = [p.rstrip("/") + "/" for p in paths]
    found = []
    for pid in _pids():
        st = _stat(pid)
        if st is None or pid in mine or (pid, st[2]) in before or st[0] in ("Z", "X"):
            continue
        cmdline = _cmdline(pid)
        if not cmdline:  # a kernel thread, or gone meanwhile
            continue
        env = _environ(pid)
        where = f"{cmdline} {_cwd(pid)}/"
        if (
            of_session(env.get(SESSION_ENV), marker)
            or env.get(HUB_ENV) in hub_ids
            or any(d in where for d in dirs)
        ):
            found.append(Leftover(pid, st[2], cmdline, _kind(cmdline)))
    return found


def still_running(leftovers: list[Leftover]) -> list[Leftover]:
    out = []
    for p in leftovers:
        st = _stat(p.pid)
        if st is not None and st[2] == p.start and st[0] not in ("Z", "X"):
            out.append(p)
    return out


def settle(leftovers: list[Leftover], grace: float) -> list[Leftover]:
    """Those of ``leftovers`` still running after ``grace`` seconds (a process that was already
    on its way out, e.g. a proxy its hub had just stopped, is not a leftover)."""
    deadline = time.monotonic() + grace
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.1)
        leftovers = still_running(leftovers)
    return leftovers


def kill(leftovers: list[Leftover]) -> None:
    for p in still_running(leftovers):
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def containers(hub_ids: set[str]) -> list[str]:
    """Remove the containers and volumes of the session's hubs that are still there; a line for
    each. Nothing when Docker is absent or unreachable."""
    if not hub_ids:
        return []
    try:
        import docker

        client = docker.from_env(version="auto", timeout=10)
        client.ping()
    except Exception:
        return []
    found = []
    for ident in sorted(hub_ids):
        label = {"label": f"{LABEL_HUB}={ident}"}
        for c in client.containers.list(all=True, filters=label):
            found.append(f"container {c.short_id} {c.name} ({c.status}) of hub {ident}")
            c.remove(force=True)
        for v in client.volumes.list(filters=label):
            found.append(f"volume {v.name} of hub {ident}")
            v.remove(force=True)
    return found
