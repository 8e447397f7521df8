"""The SSH gateway's tiny helper: become one user's process, then run what their session asked.

Run by the gateway (as root) as ``python -I enter.py SPEC_JSON``, one per shell, command or SFTP
session, before anything of the user's runs. Standard library only (it starts in a fresh
interpreter, without site-packages, so it costs little). In this order:

1. the server's cgroup (``cgroup``: the ``cgroup.procs`` files the hub named, under
   ``/sys/fs/cgroup``): this process joins it first, so everything the user starts from here on
   is the server's (billed and observed like a kernel, ended by the server's stop);
2. the server's mount and IPC namespaces (``ns_pid``: the server's process, which must be in
   that cgroup when its namespaces are opened and still after, so a reused pid is refused): the
   user sees the files, ``/tmp`` and ``/dev/shm`` of their server; or, with no server (a file
   transfer, ``scratch``), a mount namespace of its own made by the launcher's own code
   (``launcher``: the path of ``gpulab/spawners/inside/launcher.py``, loaded by path since this
   runs without site-packages): small private tmpfs ``/tmp`` and ``/dev/shm`` (``/var/tmp``,
   ``/run/lock`` inside that ``/tmp``), the other homes detached, and a ``/proc`` showing the
   account's processes only, so a transfer writes nothing on the host outside the home and sees
   nobody else's processes; its ``cgroup`` is then the user's transfer cgroup (limits of its own);
3. a session of its own; with a terminal (``tty``: its stdin), that terminal as the controlling
   one, owned by the account;
4. the account (``uid``/``gid``, no supplementary groups): after this nothing is root;
5. as the account, the home as the working folder (root never opens a path the user controls),
   then ``execve`` of ``argv`` with the hub's environment (``env``).

Without ``uid`` (a ``docker exec`` client run for a container server) steps 1, 2 and 4 are
skipped: the client runs as the gateway and the container decides who the user is. A gateway not
run as root (a hub on a laptop) skips them too, for a server of its own account only. On a node
without cgroups the server's process is recognised by its account instead.
"""

import ctypes
import ctypes.util
import fcntl
import importlib.util
import json
import os
import stat
import sys
import termios

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CGROUP_ROOT = "/sys/fs/cgroup/"


def fail(message: str) -> None:
    sys.stderr.write(f"gpulab-ssh: {message}\r\n")
    sys.stderr.flush()
    os._exit(126)


def cgroup_pids(procs_file: str) -> set[int]:
    with open(procs_file) as f:
        return {int(x) for x in f.read().split()}


def check_cgroup_path(path: str) -> str:
    norm = os.path.normpath(path)
    if norm != path or not norm.startswith(CGROUP_ROOT) or not norm.endswith("/cgroup.procs"):
        fail(f"not a cgroup.procs file: {path!r}")
    return norm


def is_servers(pid: int, procs: list[str], uid: int) -> bool:
    """``pid`` is the server's: in its cgroup, or (a node without cgroups) its account's."""
    if procs:
        return pid in cgroup_pids(procs[0])
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1]) == uid
    except OSError:
        pass
    return False


def enter_server(spec: dict) -> None:
    procs = [check_cgroup_path(p) for p in spec.get("cgroup") or []]
    ns_pid = int(spec.get("ns_pid") or 0)
    uid = int(spec["uid"])
    ns_fds = []
    if ns_pid:
        if not is_servers(ns_pid, procs, uid):
            fail("the server's process is gone")
        for ns in ("mnt", "ipc"):
            ns_fds.append(os.open(f"/proc/{ns_pid}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC))
        # Still the server's after the opening: the namespaces are the server's, not those of a
        # process that took a reused pid.
        if not is_servers(ns_pid, procs, uid):
            fail("the server's process is gone")
    for path in procs:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            fail(f"could not join the cgroup {path}: {e.strerror}; try again")
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    if ns_fds:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        for fd, kind in zip(ns_fds, (CLONE_NEWNS, CLONE_NEWIPC), strict=True):
            if libc.setns(fd, kind) != 0:
                fail(f"setns: {os.strerror(ctypes.get_errno())}")
            os.close(fd)


def load_launcher(path: str):
    """The launcher module, from its file (root's, changeable by root only)."""
    st = os.stat(path)
    if not path.startswith("/") or not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022:
        fail(f"not the launcher: {path!r}")
    if st.st_uid not in (0, os.geteuid()):
        fail(f"not the launcher: {path!r}")
    spec = importlib.util.spec_from_file_location("gpulab_launcher", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def private_mounts(spec: dict) -> None:
    """No server: the transfer's own scratch and /proc, as a local server has them."""
    launcher = load_launcher(spec["launcher"])
    env = {
        launcher.ENV_SCRATCH: json.dumps(spec["scratch"]),
        launcher.ENV_RUN_AS: f"{int(spec['uid'])}:{int(spec['gid'])}:{spec.get('account', '')}",
        "GPULAB_PRIVATE_PROC": "1",
        "HOME": spec["cwd"],
    }
    try:
        launcher.private_scratch(env)
        launcher.hide_other_accounts_processes(env)
    except (OSError, ValueError) as e:
        fail(f"could not make the transfer's private folders: {e}")


def main() -> None:
    spec = json.loads(sys.argv[1])
    uid = spec.get("uid")
    if uid is not None and os.geteuid() != 0:
        # A hub not run as root: its servers run as the hub's own account, as does this.
        if int(uid) != os.geteuid():
            fail("the gateway cannot become the server's account (it does not run as root)")
        uid = None
    if uid is not None:
        enter_server(spec)
        if spec.get("scratch") and not spec.get("ns_pid"):
            private_mounts(spec)
    os.setsid()
    if spec.get("tty"):
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if uid is not None:
            os.fchown(0, int(uid), -1)
            os.fchmod(0, 0o620)
    if uid is not None:
        uid, gid = int(uid), int(spec["gid"])
        if uid == 0 or gid == 0:
            fail("refusing to run as root")
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid or os.getegid() != gid:
            fail("could not become the account")
        os.umask(0o022)  # the hub's own (077) is for its private files, not the user's
    try:
        os.chdir(spec.get("cwd") or "/")
    except OSError:
        os.chdir("/")
    env = spec["env"]
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        fail(f"{argv[0]}: {e.strerror}")


if __name__ == "__main__":
    main()
