"""This node's processes, read from /proc: which belong to a server, and killing them safely.

Used by the allocator (orphan sweeps) and by the local spawner (a preemption warning's signals,
and the CPU time its observer measures).
A server's processes are found by the allocation id in their environment (``ENV_ALLOC``), and
a recorded pid is trusted only together with its start time, since pids are reused.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
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


def _stat(pid: int) -> tuple[bytes, list[bytes]] | None:
    """(command name, the fields after it) of /proc/PID/stat in one read; None once gone.

    Read as bytes: the command name is the process's own choice (any bytes but NUL, spaces and
    parentheses included), so it is cut out at the *last* parenthesis and never decoded here;
    the fields after it are the kernel's numbers. Field n of proc(5) is ``fields[n - 3]``."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    head, sep, tail = raw.rpartition(b")")
    if not sep:
        return None
    return head.partition(b"(")[2], tail.split()


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None once it is gone."""
    stat = _stat(pid)
    # Field 22 (starttime), counted after the parenthesised command name, which may hold spaces.
    return int(stat[1][19]) if stat is not None else None


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


_BOOT = _boot_time()
_HZ = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What the observer needs of one live process, from one read of /proc/PID/stat."""

    pid: int
    command: str  # its name (``comm``, what /proc/PID/comm says), undecodable bytes replaced
    started: float  # Unix time
    cpu_key: str  # names this process for good: pid and start time (pids are reused)
    cpu_seconds: float  # user + system, its reaped children's included (the kernel's accounting)


def proc_stat(pid: int) -> ProcStat | None:
    """``pid``'s name, start time and CPU seconds in one read; None once it is gone (a zombie
    counts as gone). Nothing in the process can make the kernel's accounting say less or more;
    its name it chooses, so a name that is no UTF-8 reads with replacement characters."""
    stat = _stat(pid)
    if stat is None or stat[1][0] in (b"Z", b"X"):
        return None
    comm, fields = stat
    # Fields 14-17 (utime, stime, cutime, cstime) and 22 (starttime), counted from 1.
    ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    start = int(fields[19])
    return ProcStat(
        pid=pid,
        command=comm.decode(errors="replace").strip(),
        started=_BOOT + start / _HZ,
        cpu_key=f"{pid}:{start}",
        cpu_seconds=ticks / _HZ,
    )


def started_at(pid: int) -> float | None:
    """When ``pid`` started, as Unix time; None once it is gone (a zombie counts as gone)."""
    stat = _stat(pid)
    if stat is None or stat[1][0] in (b"Z", b"X"):
        return None
    return _BOOT + int(stat[1][19]) / _HZ


def cpu_counter(pid: int) -> tuple[str, float] | None:
    """(a key naming this process for good: pid and start time, its CPU seconds so far) for
    ``pid``, or None once it is gone. The CPU is the kernel's own accounting (user + system, its
    reaped children's included), so nothing in the process can make it say less or more."""
    stat = proc_stat(pid)
    return (stat.cpu_key, stat.cpu_seconds) if stat is not None else None


def uid_of(pid: int) -> int | None:
    """The (real) owner of ``pid``, or None once it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def command_name(pid: int) -> str:
    """``pid``'s name ("" once gone); a name that is no UTF-8 reads with replacement characters
    (the process chooses it: it must not break whoever lists it)."""
    try:
        return Path(f"/proc/{pid}/comm").read_bytes().decode(errors="replace").strip()
    except OSError:
        return ""


def parents() -> dict[int, int]:
    """pid -> parent pid, for every visible process."""
    out = {}
    for pid in pids():
        stat = _stat(pid)
        if stat is not None:
            out[pid] = int(stat[1][1])
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
