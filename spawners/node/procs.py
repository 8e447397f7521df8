"""This node's processes, read from /proc: which belong to a server, and killing them safely.

Used by the allocator (orphan sweeps) and by the local spawner (a preemption warning's signals,
and the CPU time its observer measures).
A server's processes are found by the allocation id in their environment (``ENV_ALLOC``), and
a recorded pid is trusted only together with its start time, since pids are reused.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV_ALLOC = "GPULAB_ALLOCATION_ID"
ENV_HUB = "GPULAB_HUB_ID"


def pids() -> list[int]:
    """Every process this one can see, except itself."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def process_env(pid: int, keys: tuple[str, ...] = (ENV_ALLOC, ENV_HUB)) -> dict[str, str]:
    """The variables ``keys`` (gpulab's by default) in ``pid``'s environment; {} if gone.

    Only these are decoded: the rest of a stranger's environment is none of our business."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode(errors="replace") in keys:
            env[key.decode()] = value.decode(errors="replace")
    return env


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime), counted after the parenthesised command name, which may hold spaces.
    return int(stat.rpartition(")")[2].split()[19])


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


_BOOT = _boot_time()
_HZ = os.sysconf("SC_CLK_TCK")


def started_at(pid: int) -> float | None:
    """When ``pid`` started, as Unix time; None once it is gone (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    if fields[0] in ("Z", "X"):
        return None
    return _BOOT + int(fields[19]) / _HZ


def cpu_counter(pid: int) -> tuple[str, float] | None:
    """(a key naming this process for good: pid and start time, its CPU seconds so far) for
    ``pid``, or None once it is gone. The CPU is the kernel's own accounting (user + system, its
    reaped children's included), so nothing in the process can make it say less or more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    if fields[0] in ("Z", "X"):
        return None
    # Fields 14-17 (utime, stime, cutime, cstime) and 22 (starttime), counted from 1.
    ticks = sum(int(x) for x in fields[11:15])
    return f"{pid}:{fields[19]}", ticks / _HZ


def uid_of(pid: int) -> int | None:
    """The (real) owner of ``pid``, or None once it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def parents() -> dict[int, int]:
    """pid -> parent pid, for every visible process."""
    out = {}
    for pid in pids():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        out[pid] = int(stat.rpartition(")")[2].split()[1])
    return out


def server_processes(root_pid: int | None, alloc_id: str) -> list[int]:
    """The server process, its descendants (kernels, terminals) and anything else that carries
    the server's allocation id in its environment."""
    found: set[int] = set()
    if root_pid:
        children: dict[int, list[int]] = {}
        for pid, ppid in parents().items():
            children.setdefault(ppid, []).append(pid)
        stack = [root_pid]
        while stack:
            pid = stack.pop()
            if pid in found:
                continue
            found.add(pid)
            stack.extend(children.get(pid, []))
    for pid in pids():
        if process_env(pid).get(ENV_ALLOC) == alloc_id:
            found.add(pid)
    return sorted(p for p in found if Path(f"/proc/{p}").exists())


def allocation_ids_running(hub_id: str) -> set[str]:
    """The allocation ids that live processes of hub ``hub_id`` carry."""
    ids = set()
    for pid in pids():
        env = process_env(pid)
        if env.get(ENV_HUB) == hub_id and ENV_ALLOC in env:
            ids.add(env[ENV_ALLOC])
    return ids


def kill_recorded_pid(pid: int | None, start_time: int | None) -> int:
    """SIGKILL ``pid`` if it is still the process that started at ``start_time``; 1 if killed.

    Servers forked by the fork server never exec, so their /proc environ doesn't show the
    allocation id; the pid with its start time identifies them instead.
    """
    if not pid or start_time is None:
        return 0
    if process_start_time(pid) != start_time:
        return 0
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return 0
    return 1


def kill_allocation_processes(hub_id: str | None, alloc_id: str) -> int:
    """SIGKILL every process whose environment carries ``alloc_id`` (server and kernels), of
    hub ``hub_id`` only unless it is None. Returns how many were killed."""
    killed = 0
    for pid in pids():
        env = process_env(pid)
        if env.get(ENV_ALLOC) != alloc_id or (hub_id is not None and env.get(ENV_HUB) != hub_id):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed
