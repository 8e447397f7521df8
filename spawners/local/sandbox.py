"""Where one local server runs, and how the hub finds and ends every process of it.

Three levels, the strongest the node allows:

1. **hub runs as root with cgroups**: the server runs as its user's own account
   (:mod:`.accounts`) inside its own cgroup (:mod:`.cgroup`). Its processes are exactly the
   group's; a stop kills the group.
2. **root without a writable cgroup tree**: its own account; its processes are that account's
   processes (one server per user at a time on a node, so the account is the server).
3. **not root** (a laptop): the hub's own user; its processes are the server's process tree plus
   any process still carrying the server's allocation id (what the orphan sweep used before).

The server process joins the cgroup and drops to the account itself, before it runs any of the
user's code (:func:`gpulab.spawners.inside.launcher.enter_sandbox`), so nothing it starts can be
outside.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gpulab.spawners.activity import Proc
from gpulab.spawners.inside.launcher import ENV_CGROUP, ENV_RUN_AS
from gpulab.spawners.local.accounts import Account
from gpulab.spawners.local.cgroup import CgroupError, ServerCgroup
from gpulab.spawners.node.allocator import ENV_ALLOC


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


_BOOT = _boot_time()
_HZ = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, start time as Unix time) of a live process, else None (gone or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), _BOOT + int(fields[19]) / _HZ


def proc_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


@dataclass
class Sandbox:
    alloc_id: str
    account: Account | None = None
    cgroup: ServerCgroup | None = None

    def env(self) -> dict[str, str]:
        """What the server process needs to enter the sandbox itself."""
        env = {}
        if self.account is not None:
            a = self.account
            env[ENV_RUN_AS] = f"{a.uid}:{a.gid}:{a.name}"
        if self.cgroup is not None:
            env[ENV_CGROUP] = os.pathsep.join(self.cgroup.procs_files)
        return env

    def pids(self, server_pid: int | None) -> list[int]:
        """Every live process of this server, the server itself included."""
        if self.cgroup is not None and self.cgroup.exists():
            return [p for p in self.cgroup.pids() if proc_stat(p) is not None]
        if self.account is not None:
            return [p for p in _all_pids() if proc_uid(p) == self.account.uid and proc_stat(p)]
        return self._tree_and_marked(server_pid)

    def _tree_and_marked(self, server_pid: int | None) -> list[int]:
        stats = {p: s for p in _all_pids() if (s := proc_stat(p)) is not None}
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        found: set[int] = set()
        stack = [server_pid] if server_pid and server_pid in stats else []
        while stack:
            pid = stack.pop()
            if pid not in found:
                found.add(pid)
                stack.extend(children.get(pid, []))
        marker = f"{ENV_ALLOC}={self.alloc_id}".encode()
        found.update(p for p in stats if p not in found and _environ_has(p, marker))
        return sorted(found)

    def others(self, server_pid: int | None) -> list[Proc]:
        """The server's processes besides the single-user server itself (observed activity)."""
        out = []
        for pid in self.pids(server_pid):
            if pid == server_pid:
                continue
            st = proc_stat(pid)
            if st is not None:
                out.append(Proc(pid=pid, started=st[1], command=_comm(pid)))
        return out

    def kill_all(self, server_pid: int | None, timeout: float = 10.0) -> int:
        """End every process of this server, however it detached; blocking. Returns how many."""
        if self.cgroup is not None and self.cgroup.exists():
            try:
                n = self.cgroup.kill_all(timeout)
            finally:
                try:
                    self.cgroup.remove()
                except OSError:
                    pass
            return n
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while True:
            victims = [p for p in self.pids(server_pid) if p != os.getpid()]
            if not victims or time.monotonic() > deadline:
                break
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        return len(killed)

    def sweep_safe(self) -> bool:
        """Whether kill_all can be trusted to find everything (not just the process tree)."""
        return self.cgroup is not None or self.account is not None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


__all__ = ["ENV_CGROUP", "ENV_RUN_AS", "CgroupError", "Sandbox", "proc_stat"]
