"""Where one local server runs, and how the hub finds and ends every process of it.

Three levels, the strongest the node allows:

1. **hub runs as root with cgroups**: the server runs as its user's own account
   (:mod:`.accounts`) inside its own cgroup (:mod:`.cgroup`). Its processes are exactly the
   group's; a stop kills the group (and once the group is gone, the server has no process:
   the account's other servers, e.g. a training job's, are never touched).
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
import shutil
import signal
import stat
import time
from dataclasses import dataclass

from gpulab.spawners.activity import Proc
from gpulab.spawners.inside.launcher import ENV_CGROUP, ENV_RUN_AS, ENV_UMASK
from gpulab.spawners.local.accounts import Account
from gpulab.spawners.local.cgroup import CgroupError, ServerCgroup
from gpulab.spawners.node import procs

# The node's temp folder (where a server's processes make theirs: its environment sets no
# TMPDIR), and the folders there that belong to one server: jupyter-server-proxy's Unix socket
# folders (mkdtemp, one per app that listens on {unix_socket}).
TEMP_DIRS = ("/tmp",)
TEMP_PREFIXES = ("jupyter-server-proxy-",)


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
            env[ENV_UMASK] = "022"
        if self.cgroup is not None:
            env[ENV_CGROUP] = os.pathsep.join(self.cgroup.procs_files)
        return env

    def _found(self, server_pid: int | None) -> list[int]:
        """The pids of this server, some perhaps gone or zombies already."""
        if self.cgroup is not None:
            # A server's processes are its group's; a group already emptied and removed (the
            # stop's first sweep) has none. Never the whole account then: the user's other
            # servers (a training job's among them) run as the same account.
            return self.cgroup.pids() if self.cgroup.exists() else []
        if self.account is not None:
            return [p for p in procs.pids() if procs.uid_of(p) == self.account.uid]
        return procs.server_processes(server_pid, self.alloc_id)

    def pids(self, server_pid: int | None) -> list[int]:
        """Every live process of this server, the server itself included."""
        return [p for p in self._found(server_pid) if procs.started_at(p) is not None]

    def sample(self, server_pid: int | None) -> tuple[list[Proc], list[tuple[str, float]]]:
        """What the activity observer sees of this server, each process's /proc/PID/stat read
        once: (its processes besides the single-user server itself, the CPU counter of every
        live process, the server's included: ``procs.cpu_counter``'s (key, seconds))."""
        others: list[Proc] = []
        cpu: list[tuple[str, float]] = []
        for pid in self._found(server_pid):
            stat = procs.proc_stat(pid)
            if stat is None:
                continue
            cpu.append((stat.cpu_key, stat.cpu_seconds))
            if pid != server_pid:
                others.append(Proc(pid=pid, started=stat.started, command=stat.command))
        return others, cpu

    def others(self, server_pid: int | None) -> list[Proc]:
        """The server's processes besides the single-user server itself (observed activity)."""
        return self.sample(server_pid)[0]

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

    def remove_temp_dirs(self, temp_dirs: tuple[str, ...] = TEMP_DIRS) -> list[str]:
        """Remove the folders this server's account left in the node's temp folder (those of
        ``TEMP_PREFIXES``), once its processes are gone; returns their paths.

        Root acts in a folder every account writes to, so only on names: an entry counts only
        if it is a real directory (not a link) owned by this account, and it is removed by
        ``shutil.rmtree`` relative to the temp folder's descriptor (which never follows a link).
        """
        if self.account is None or self.account.uid == 0:
            return []
        removed = []
        for temp in temp_dirs:
            try:
                fd = os.open(temp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                for name in os.listdir(fd):
                    if not name.startswith(TEMP_PREFIXES):
                        continue
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if not stat.S_ISDIR(st.st_mode) or st.st_uid != self.account.uid:
                        continue
                    shutil.rmtree(name, dir_fd=fd)
                    removed.append(os.path.join(temp, name))
            finally:
                os.close(fd)
        return removed


__all__ = ["ENV_CGROUP", "ENV_RUN_AS", "CgroupError", "Sandbox"]
