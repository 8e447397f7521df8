"""Entry point of a local single-user server: mount datasets read-only, then run JupyterHub's server.

Runs as ``python -m gpulab.spawners.inside.launcher [server args]`` in the server's own process, before any
thread exists, which is what ``unshare(CLONE_NEWNS)`` needs. Datasets arrive in the environment:

- ``GPULAB_DATASET_MOUNTS``: JSON list of ``[source_dir, target_dir]``;
- ``GPULAB_DATASET_MODE``: ``bind`` (a private mount namespace with read-only bind mounts, so even
  root inside the server gets EROFS) or ``symlink`` (links to read-only directories).

When the hub runs as root, the server enters its sandbox before any of the user's code runs
(:func:`enter_sandbox`): it joins its cgroup and becomes its user's own account for good. Until
then it is root in a home the user controls, so it does there only what needs root (the bind
mounts), never through a path the user could have linked elsewhere (:func:`open_beneath`); the
rest (links, tidying, the apps' config) it does as the user (:func:`start_server_environment`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import importlib.abc
import json
import os
import re
import signal
import socket
import stat
import struct
import sys
from pathlib import Path
from urllib.parse import urlparse

ENV_RUN_AS = "GPULAB_RUN_AS"  # "uid:gid:name" of the account the server runs as
ENV_CGROUP = "GPULAB_CGROUP_PROCS"  # os.pathsep-joined cgroup.procs files the server joins
ENV_UMASK = "GPULAB_UMASK"  # octal umask of the user's processes
ENV_JOB_ID = "GPULAB_JOB_ID"  # set for a job server: the job runner runs instead of JupyterLab
# JSON of the server's jupyter-server-proxy apps (``c.ServerProxy.servers``), from the hub.
ENV_APP_SERVERS = "GPULAB_APP_SERVERS"
# JSON {"tmp": bytes, "shm": bytes, "homes": homes folder, "keep": [folders]}: the server's own
# bounded /tmp and /dev/shm (issue 23); set by a hub that may make mount namespaces.
ENV_SCRATCH = "GPULAB_SCRATCH"
# Where a server with scratch of its own keeps what must not need room in the home (JupyterLab's
# runtime files, the apps' config): a full home is no lock-out.
SCRATCH_RUNTIME = "/tmp/.gpulab-runtime"
# A home with less room than this at start counts as full (its JupyterLab layout goes to scratch).
FULL_HOME_BYTES = 2**20

# Every folder of the host anyone may write into (``find / -xdev -type d -perm -0002``; /var/lock
# is a link to /run/lock): each server and each grading sandbox gets its own, private and bounded,
# in its mount namespace. One list for both (the grader imports it from here).
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# Where, in the server's own /tmp tmpfs, the other shared folders' private copies live (so they
# share its size and are wiped with it).
SCRATCH_SHARED = "/tmp/.gpulab-shared"

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
# "private" (set by the local spawner for a job server, issue 26): the job's command runs in a
# network namespace of its own with only its loopback; "host" or unset: the host's network.
ENV_JOB_NETWORK = "GPULAB_JOB_NETWORK"
# The runner's listening socket, made here (the job runner's ENV_LISTEN_FD; it imports nothing).
ENV_JOB_LISTEN_FD = "GPULAB_JOB_LISTEN_FD"
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

# Imported only for jsonschema's "iri" format checker, which no Jupyter event schema uses, yet its
# import compiles a grammar that costs about a second of every server start.
SKIPPED_IMPORTS = frozenset({"rfc3987_syntax"})


class _SkipImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in SKIPPED_IMPORTS:
            raise ModuleNotFoundError(
                f"{fullname} skipped by gpulab for start-up speed", name=fullname
            )
        return None


def libc() -> ctypes.CDLL:
    """The C library, with errno kept for ``ctypes.get_errno`` (the fork server's too)."""
    c = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    c.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    c.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return c


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


# ---- paths a user controls ------------------------------------------------------------------
#
# Everything below a user's home is theirs: any folder there may be swapped for a symlink (to
# /etc, say) at any moment, also between a check and a use. Root therefore never acts on a path
# string below the home: it opens each folder from its parent's descriptor with O_NOFOLLOW (a
# symlink fails with ELOOP instead of being followed), then acts on names inside that descriptor
# (``dir_fd=``, ``follow_symlinks=False``), or on the descriptor itself. What root does not have
# to do (links, tidying) is done after the server has become its user (:func:`arrange_datasets`).

O_PATH = getattr(os, "O_PATH", 0o10000000)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_beneath(
    base_fd: int, relative: str, *, create: bool = False, owner: tuple[int, int] | None = None
) -> int:
    """A descriptor of the directory ``relative`` below ``base_fd``, reached without following
    any symlink (ELOOP or ENOTDIR when a component is a link or no directory). ``create`` makes
    missing folders (mode 0755; those made as root are chowned to ``owner`` through their own
    descriptor) and replaces a link in the way by a real folder (the link is removed by name, in
    its folder: ``unlink`` never follows it)."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{relative!r} leaves its base folder")
    fd = os.dup(base_fd)
    try:
        for part in parts:
            if create:
                try:
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is not None and stat.S_ISLNK(st.st_mode):
                    os.unlink(part, dir_fd=fd)
                    st = None
                if st is None:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass  # made meanwhile: opened (or refused) below like any other
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if create and owner is not None and owner[0] != 0 and os.fstat(nxt).st_uid == 0:
                os.fchown(nxt, *owner)  # made by root just now
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _home_relative(home: str, path: str) -> str:
    rel = os.path.relpath(path, home)
    if rel == "." or rel.startswith(".."):
        raise ValueError(f"{path} is not inside the home {home}")
    return rel


_private_mounts = False  # this process has its own mount namespace (at most one unshare)


def enter_private_mounts(c: ctypes.CDLL) -> None:
    """Enter a mount namespace of this server's own, once: mounts made in it never reach the
    host's namespace."""
    global _private_mounts
    if _private_mounts:
        return
    _check(c.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Keep our mounts from propagating back to the host's namespace.
    _check(c.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    _private_mounts = True


def hide_other_accounts_processes(env: dict[str, str]) -> None:
    """A root hub's servers see only their own account's processes in ``/proc``.

    Local servers share the host's process namespace, so without this a user lists every
    other user's processes, their command lines (app sockets, paths, account names) and
    environment sizes. A proc instance of the server's own, mounted with ``hidepid=invisible``
    in its private mount namespace (per mount since Linux 5.8, so the host's ``/proc`` keeps its
    options; the hub observes from the host's), shows other accounts' processes to nobody in
    the server. Only where the hub runs servers as accounts and may make mount namespaces
    (``GPULAB_PRIVATE_PROC``); elsewhere every server is the same account anyway."""
    if _run_as(env) is None or os.geteuid() != 0 or env.get("GPULAB_PRIVATE_PROC") != "1":
        return
    c = libc()
    enter_private_mounts(c)
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    for options in (b"hidepid=invisible", b"hidepid=2"):
        if c.mount(b"proc", b"/proc", b"proc", flags, options) == 0:
            return
    _check(-1, "mount /proc with hidepid")


def bind_read_only(
    mounts: list[tuple[str, str]], home: str, owner: tuple[int, int] | None = None
) -> None:
    """Enter a private mount namespace and bind each source read-only onto its target.

    Runs as root in the server process. Each target (``~/datasets/SLUG``) is reached from the
    home without following a symlink; a link or file the user left at its name is removed (in
    the user's own folder: ``unlink`` with ``dir_fd``), a missing folder is made for the user.
    The mount goes onto the folder's descriptor (``/proc/self/fd/N``), never onto a path the
    user could swap between the check and the mount.
    """
    c = libc()
    enter_private_mounts(c)
    # Opened after unshare: a descriptor of the old namespace's mounts cannot be mounted on.
    home_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for src, dst in mounts:
            folder, name = os.path.split(_home_relative(home, dst))
            parent = open_beneath(home_fd, folder, create=True, owner=owner)
            try:
                _bind_one(c, src, parent, name, owner)
            finally:
                os.close(parent)
    finally:
        os.close(home_fd)


def _bind_one(c: ctypes.CDLL, src: str, parent: int, name: str, owner) -> None:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)  # the user's link or file at the mount point
        st = None
    if st is None:
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
    target = os.open(name, O_PATH | _DIR_FLAGS, dir_fd=parent)
    try:
        if owner is not None and owner[0] != 0 and os.fstat(target).st_uid == 0:
            os.chown(f"/proc/self/fd/{target}", *owner)
        fd_path = f"/proc/self/fd/{target}".encode()
        _check(c.mount(src.encode(), fd_path, None, MS_BIND | MS_REC, None), f"bind {src}")
    finally:
        os.close(target)
    # A fresh lookup crosses into the mount just made; remount exactly that one read-only.
    top = os.open(name, O_PATH | _DIR_FLAGS, dir_fd=parent)
    try:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        what = f"remount {name} read-only"
        _check(c.mount(None, f"/proc/self/fd/{top}".encode(), None, flags, None), what)
    finally:
        os.close(top)


def _open_mount_dir(home: str, name: str) -> int | None:
    """The home's folder ``name``, opened without following links (None if there is none)."""
    try:
        home_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return open_beneath(home_fd, name)
    except OSError:
        return None  # missing, or the user made it a link or a file: nothing of ours there
    finally:
        os.close(home_fd)


def link_read_only(mounts: list[tuple[str, str]], home: str) -> None:
    """Link each target (``~/datasets/SLUG``) to its read-only source. Run as the server's user:
    the folder is theirs; nothing here follows a link they made."""
    home_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for src, dst in mounts:
            folder, name = os.path.split(_home_relative(home, dst))
            parent = open_beneath(home_fd, folder, create=True)
            try:
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is not None and stat.S_ISDIR(st.st_mode):
                    os.rmdir(name, dir_fd=parent)  # an empty mount point left from bind mode
                elif st is not None:
                    os.unlink(name, dir_fd=parent)
                os.symlink(src, name, target_is_directory=True, dir_fd=parent)
            finally:
                os.close(parent)
    finally:
        os.close(home_fd)


def tidy_datasets_dir(folder_fd: int, keep: set[str]) -> None:
    """Remove links and empty mount points of datasets no longer requested, in the folder open
    at ``folder_fd`` (names only: nothing is followed out of it)."""
    for name in os.listdir(folder_fd):
        if name in keep:
            continue
        try:
            st = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                os.unlink(name, dir_fd=folder_fd)
            elif stat.S_ISDIR(st.st_mode):
                os.rmdir(name, dir_fd=folder_fd)
        except OSError:
            pass  # the user put files there (or it went meanwhile); leave them


# Folders of the home that hold read-only mounts (datasets, the model store), kept tidy here.
MOUNT_DIRS = ("datasets", "models")


def _mounts(env: dict[str, str]) -> list[tuple[str, str]]:
    return [tuple(m) for m in json.loads(env.get("GPULAB_DATASET_MOUNTS") or "[]")]


def _home(env: dict[str, str]) -> str:
    return env.get("HOME") or os.getcwd()


def _run_as(env: dict[str, str]) -> tuple[int, int, str] | None:
    run_as = env.get(ENV_RUN_AS)
    if not run_as:
        return None
    uid_s, gid_s, account = run_as.split(":", 2)
    return int(uid_s), int(gid_s), account


def prepare_datasets(env: dict[str, str]) -> None:
    """Before the sandbox: what needs root. In bind mode, the read-only mounts (on folders made
    for the user, reached without following links); folders that an older gpulab made as root
    in the home are handed to the user, so that the user can keep them tidy afterwards."""
    run_as = _run_as(env)
    owner = (run_as[0], run_as[1]) if run_as else None
    if owner is not None and os.geteuid() == 0:
        for name in MOUNT_DIRS:
            _hand_over(_home(env), name, owner)
    mounts = _mounts(env)
    if mounts and env.get("GPULAB_DATASET_MODE") == "bind":
        bind_read_only(mounts, _home(env), owner)


def _hand_over(home: str, name: str, owner: tuple[int, int]) -> None:
    fd = _open_mount_dir(home, name)
    if fd is None:
        return
    try:
        if os.fstat(fd).st_uid != 0:
            return
        # Root's folder (an older gpulab made it): the user cannot change it while the links
        # inside are handed over, and gets the folder last.
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            # Only links root made here: one linked in from elsewhere (nlink > 1) stays as is.
            if stat.S_ISLNK(st.st_mode) and st.st_uid == 0 and st.st_nlink == 1:
                os.chown(entry, *owner, dir_fd=fd, follow_symlinks=False)
        os.fchown(fd, *owner)
    finally:
        os.close(fd)


def arrange_datasets(env: dict[str, str]) -> None:
    """After the sandbox, as the server's user: links (symlink mode) and tidy mount folders."""
    mounts = _mounts(env)
    home = _home(env)
    if mounts and env.get("GPULAB_DATASET_MODE") != "bind":
        link_read_only(mounts, home)
    for name in MOUNT_DIRS:
        keep = {os.path.basename(dst) for _, dst in mounts if Path(dst).parent.name == name}
        fd = _open_mount_dir(home, name)
        if fd is not None:
            try:
                tidy_datasets_dir(fd, keep)
            finally:
                os.close(fd)


def enter_sandbox(env: dict[str, str]) -> None:
    """Join the server's cgroup and drop to its account (when the hub asked for them).

    Runs in the server process, as root, after the datasets are mounted and before anything of
    the user's runs: whatever the server starts later is inside the group and that account. It
    touches no path of the user's (it also runs before a checkpoint command, see
    :mod:`gpulab.spawners.local.checkpoint`).
    """
    for procs in filter(None, env.get(ENV_CGROUP, "").split(os.pathsep)):
        with open(procs, "w") as f:
            f.write("0")
    run_as = _run_as(env)
    if run_as is None:
        return
    uid, gid, account = run_as
    os.setgroups([gid])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit(f"gpulab: could not become {account}")
    os.environ["USER"] = os.environ["LOGNAME"] = account
    if env.get(ENV_UMASK):
        # The hub's own umask (077) is for its private files, not the user's.
        os.umask(int(env[ENV_UMASK], 8))


def private_scratch(env: dict[str, str]) -> None:
    """The server's own ``/tmp`` and ``/dev/shm``: tmpfs of the catalog's sizes in its private
    mount namespace (a write past them is ENOSPC in the user's code, the node's disk never
    fills), gone with the namespace when the server's last process ends (wiped at stop).

    Also detaches, in this namespace only, every other home mounted below the homes folder: a
    server never holds another user's home (which could then not be taken offline), and the
    folders the server needs that lived under the old ``/tmp`` (``keep``: the data dir, where a
    test puts it there) are bound back at their paths. The host's other world-writable folders
    (/var/tmp, /run/lock) become folders of this /tmp (:func:`private_shared_folders`) and the
    server gets its own IPC namespace (:func:`private_ipc`). Runs as root, before the sandbox."""
    raw = env.get(ENV_SCRATCH)
    if not raw or os.geteuid() != 0:
        return
    spec = json.loads(raw)
    c = libc()
    enter_private_mounts(c)
    # Its own SysV IPC and POSIX message queues: segments die with the server, and other
    # tenants' (and the host's) are out of sight.
    private_ipc(c)
    home = os.path.realpath(_home(env))
    homes = spec.get("homes")
    if homes:
        detach_mounts_below(c, homes, keep=[home])
    flags = MS_NOSUID | MS_NODEV
    for target, size in (("/tmp", spec["tmp"]), ("/dev/shm", spec["shm"])):
        keep = [k for k in spec.get("keep", []) if _below(os.path.realpath(k), target)]
        # What is mounted below the old folder (another hub's homes, on a machine running
        # several) would only be hidden by the tmpfs, and held by this server all the same.
        detach_mounts_below(c, target, keep=[*keep, home])
        old = os.open(target, O_PATH | _DIR_FLAGS) if keep else None
        try:
            opts = f"size={int(size)},mode=1777".encode()
            _check(c.mount(b"tmpfs", target.encode(), b"tmpfs", flags, opts), f"mount {target}")
            for k in keep:
                _bind_back(c, old, target, os.path.realpath(k))
        finally:
            if old is not None:
                os.close(old)
    private_shared_folders(c)
    os.environ["JUPYTER_RUNTIME_DIR"] = SCRATCH_RUNTIME
    try:
        v = os.statvfs(home)
        full = v.f_bavail * v.f_frsize < FULL_HOME_BYTES or v.f_favail < 16
    except OSError:
        full = False
    if full:
        # JupyterLab saves its layout (a workspace) on every change: on a full home that is an
        # error on the page, so this session keeps it in scratch (the home's own stays as is).
        os.environ["JUPYTERLAB_WORKSPACES_DIR"] = f"{SCRATCH_RUNTIME}/workspaces"


def private_ipc(c: ctypes.CDLL) -> None:
    """Enter an IPC namespace of this server's own (SysV shared memory, semaphores, message
    queues; POSIX message queues): what the user makes there is freed by the kernel when the
    server's last process ends, and no other tenant's is visible. Where ``/dev/mqueue`` exists it
    shows this namespace's queues (the mount is in the private mount namespace)."""
    _check(c.unshare(CLONE_NEWIPC), "unshare(CLONE_NEWIPC)")
    if os.path.isdir("/dev/mqueue") and not os.path.islink("/dev/mqueue"):
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        c.mount(b"mqueue", b"/dev/mqueue", b"mqueue", flags, None)  # best effort: a view only


def private_shared_folders(c: ctypes.CDLL) -> None:
    """Every other world-writable folder of the host (:data:`SHARED_WRITABLE` beyond /tmp and
    /dev/shm, which have tmpfs of their own) becomes a folder of the server's own /tmp: bounded
    by its size, wiped at stop, and out of other tenants' reach. Runs after /tmp is mounted."""
    made = False
    for folder in SHARED_WRITABLE:
        if folder in ("/tmp", "/dev/shm") or not os.path.isdir(folder) or os.path.islink(folder):
            continue
        if not made:
            os.mkdir(SCRATCH_SHARED, 0o700)  # reached only through the folders bound below
            made = True
        private = os.path.join(SCRATCH_SHARED, folder.strip("/").replace("/", "-"))
        os.mkdir(private)
        os.chmod(private, 0o1777)
        what = f"bind a private {folder}"
        _check(c.mount(private.encode(), folder.encode(), None, MS_BIND, None), what)


def detach_mounts_below(c: ctypes.CDLL, folder: str, keep: list[str]) -> None:
    """Detach, in this mount namespace only, every mount below ``folder`` (other users' homes,
    their datasets) except those on the way to or inside a path of ``keep``: a server or a
    grading job then never pins a home it has no business with (its quota change or release
    would answer "in use")."""
    top = os.path.realpath(folder).rstrip("/") + "/"
    kept = [os.path.realpath(k).rstrip("/") for k in keep]
    for point in reversed(_mount_points()):
        if not point.startswith(top):
            continue
        if any(_below(point, k) or _below(k, point) for k in kept):
            continue
        c.umount2(point.encode(), MNT_DETACH)


def _below(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _mount_points() -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            out.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point))
    return out


def _bind_back(c: ctypes.CDLL, old_fd: int, target: str, path: str) -> None:
    """Bind ``path`` (below ``target`` before the tmpfs hid it, reached through ``old_fd``)
    back at its own path on the new tmpfs (root's folders, made here)."""
    rel = os.path.relpath(path, target)
    src = os.open(rel, O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=old_fd)
    try:
        os.makedirs(path, mode=0o711, exist_ok=True)
        for folder in [path, *Path(path).parents]:
            if not _below(str(folder), target) or str(folder) == target:
                break
            os.chmod(folder, 0o711)
        what = f"bind {path} back"
        _check(c.mount(f"/proc/self/fd/{src}".encode(), path.encode(), None, MS_BIND | MS_REC,
                       None), what)  # fmt: skip
    finally:
        os.close(src)


def private_job_network(env: dict[str, str]) -> None:
    """A job server's network of its own (``GPULAB_JOB_NETWORK=private``): nothing outside the
    job reaches what it listens on (torchrun's TCPStore and gloo serve their rendezvous without
    authentication on ``MASTER_ADDR=127.0.0.1``, which on the host's loopback every other
    tenant's job and server could join), and the job reaches nothing outside either.

    Runs as root, before anything else of the server: the runner's HTTP socket (the hub's
    readiness check and route) is bound and listening first, in the host's namespace, and
    handed to the runner by descriptor (``GPULAB_JOB_LISTEN_FD``: a socket keeps the namespace
    it was made in); then this process enters a new network namespace and brings its ``lo`` up,
    so ``127.0.0.1`` works inside the job and is the job's alone."""
    if env.get(ENV_JOB_NETWORK) != "private" or not env.get(ENV_JOB_ID):
        return
    url = urlparse(env.get("JUPYTERHUB_SERVICE_URL", ""))
    if not url.port:
        raise SystemExit("gpulab: a job server in a private network needs JUPYTERHUB_SERVICE_URL")
    address = (url.hostname or "0.0.0.0", url.port)  # as the runner would bind it
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(128)
    fd = sock.detach()
    os.set_inheritable(fd, True)
    c = libc()
    _check(c.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    loopback_up()
    os.environ[ENV_JOB_LISTEN_FD] = str(fd)


def loopback_up() -> None:
    """Bring this network namespace's ``lo`` up (SIOCSIFFLAGS; no ``ip`` binary needed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def start_server_environment(env: dict[str, str]) -> None:
    """Everything between the server's fork and JupyterHub's server, in this order: root's part
    (mounts, scratch), the sandbox (cgroup, account), then the user's part (links, app config)."""
    prepare_datasets(env)
    hide_other_accounts_processes(env)
    private_scratch(env)
    enter_sandbox(env)
    arrange_datasets(env)
    configure_apps(env)
    tolerate_a_full_home()


def tolerate_a_full_home() -> None:
    """A full home is no lock-out: jupyter_core's one-time migration from IPython 3 makes
    ~/.jupyter at every server start until it has written its marker there (once ~/.ipython
    exists: after a first kernel), and in a home full to the byte that mkdir is ENOSPC, which
    would end the server before it listens. A full home skips the migration instead."""
    import errno

    try:
        from jupyter_core.application import JupyterApp
    except ImportError:
        return
    original = JupyterApp.migrate_config
    if getattr(original, "gpulab_tolerant", False):
        return

    def migrate_config(self) -> None:
        try:
            original(self)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self.log.warning("Your home is full: Jupyter's config migration skipped (%s)", e)

    migrate_config.gpulab_tolerant = True
    JupyterApp.migrate_config = migrate_config


def configure_apps(env: dict[str, str]) -> None:
    """Hand the hub's app list to jupyter-server-proxy through a config file of this server.

    A ``--ServerProxy.servers=<json>`` argument reaches jupyter-server-proxy as a string (the
    single-user app does not know that class when it parses its command line), so the apps go
    into a JSON config file in ``~/.gpulab/jupyter-config``, put first on JUPYTER_CONFIG_PATH.
    Written as the user, after the sandbox is entered: it is their server's configuration.
    """
    raw = env.get(ENV_APP_SERVERS)
    if not raw:
        return
    base = Path(env.get("HOME") or os.getcwd())
    if os.environ.get("JUPYTER_RUNTIME_DIR") == SCRATCH_RUNTIME:
        base = Path(SCRATCH_RUNTIME).parent  # the server's own /tmp: no room needed in the home
    folder = base / ".gpulab" / "jupyter-config"
    folder.mkdir(parents=True, exist_ok=True)
    config = {"ServerProxy": {"servers": json.loads(raw)}}
    (folder / "jupyter_server_config.json").write_text(json.dumps(config, indent=1))
    paths = [str(folder), *filter(None, [os.environ.get("JUPYTER_CONFIG_PATH")])]
    os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(paths)


def install_import_trimming() -> None:
    if not any(isinstance(f, _SkipImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _SkipImports())


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # The hub stops a server with SIGINT first; a hub started in the background hands its
    # children SIGINT ignored, which would make every stop wait for SIGTERM.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    private_job_network(dict(os.environ))
    start_server_environment(dict(os.environ))
    if os.environ.get(ENV_JOB_ID):
        # A job server (issue 26): the job runner answers in JupyterLab's place, in this
        # process (its mounts, cgroup and account; the hub's Popen handle stays its own).
        runner = [sys.executable, "-I", "-m", "gpulab.spawners.inside.jobrunner", *argv]
        os.execve(sys.executable, runner, dict(os.environ))
    if os.environ.get("GPULAB_TRIM_IMPORTS", "1") == "1":
        install_import_trimming()
    sys.argv = ["jupyterhub-singleuser", *argv]
    from jupyterhub.singleuser import main as singleuser_main

    sys.exit(singleuser_main())


if __name__ == "__main__":
    main()
