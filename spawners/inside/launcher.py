"""Entry point of a local single-user server: mount datasets read-only, then run JupyterHub's server.

Runs as ``python -m gpulab.spawners.inside.launcher [server args]`` in the server's own process, before any
thread exists, which is what ``unshare(CLONE_NEWNS)`` needs. Datasets arrive in the environment:

- ``GPULAB_DATASET_MOUNTS``: JSON list of ``[source_dir, target_dir]``;
- ``GPULAB_DATASET_MODE``: ``bind`` (a private mount namespace with read-only bind mounts, so even
  root inside the server gets EROFS) or ``symlink`` (links to read-only directories).

Then, when the hub runs as root, the server enters its sandbox before any of the user's code runs
(:func:`enter_sandbox`): it joins its cgroup and becomes its user's own account for good.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.abc
import json
import os
import signal
import sys
from pathlib import Path

ENV_RUN_AS = "GPULAB_RUN_AS"  # "uid:gid:name" of the account the server runs as
ENV_CGROUP = "GPULAB_CGROUP_PROCS"  # os.pathsep-joined cgroup.procs files the server joins
ENV_UMASK = "GPULAB_UMASK"  # octal umask of the user's processes
# JSON of the server's jupyter-server-proxy apps (``c.ServerProxy.servers``), from the hub.
ENV_APP_SERVERS = "GPULAB_APP_SERVERS"

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

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
    return c


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def bind_read_only(mounts: list[tuple[str, str]]) -> None:
    """Enter a private mount namespace and bind each source read-only onto its target."""
    c = libc()
    _check(c.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Keep our mounts from propagating back to the host's namespace.
    _check(c.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for src, dst in mounts:
        Path(dst).mkdir(parents=True, exist_ok=True)
        _check(c.mount(src.encode(), dst.encode(), None, MS_BIND | MS_REC, None), f"bind {src}")
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        _check(c.mount(None, dst.encode(), None, flags, None), f"remount {dst} read-only")


def link_read_only(mounts: list[tuple[str, str]]) -> None:
    for src, dst in mounts:
        target = Path(dst)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            target.rmdir()  # an empty mount point left from bind mode
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(src, target_is_directory=True)


def tidy_datasets_dir(datasets_dir: Path, keep: set[str]) -> None:
    """Remove links and empty mount points of datasets no longer requested."""
    if not datasets_dir.is_dir():
        return
    for entry in datasets_dir.iterdir():
        if entry.name in keep:
            continue
        if entry.is_symlink():
            entry.unlink()
        elif entry.is_dir():
            try:
                entry.rmdir()
            except OSError:
                pass  # the user put files there; leave them


# Folders of the home that hold read-only mounts (datasets, the model store), kept tidy here.
MOUNT_DIRS = ("datasets", "models")


def prepare_datasets(env: dict[str, str]) -> None:
    mounts = [tuple(m) for m in json.loads(env.get("GPULAB_DATASET_MOUNTS") or "[]")]
    home = Path(env.get("HOME") or os.getcwd())
    for name in MOUNT_DIRS:
        keep = {Path(dst).name for _, dst in mounts if Path(dst).parent.name == name}
        tidy_datasets_dir(home / name, keep)
    if not mounts:
        return
    if env.get("GPULAB_DATASET_MODE") == "bind":
        bind_read_only(mounts)
    else:
        link_read_only(mounts)


def enter_sandbox(env: dict[str, str]) -> None:
    """Join the server's cgroup and drop to its account (when the hub asked for them).

    Runs in the server process, as root, after the datasets are mounted and before anything of
    the user's runs: whatever the server starts later is inside the group and that account.
    """
    for procs in filter(None, env.get(ENV_CGROUP, "").split(os.pathsep)):
        with open(procs, "w") as f:
            f.write("0")
    run_as = env.get(ENV_RUN_AS)
    if not run_as:
        return
    uid_s, gid_s, name = run_as.split(":", 2)
    uid, gid = int(uid_s), int(gid_s)
    for name in MOUNT_DIRS:
        folder = Path(env.get("HOME") or os.getcwd()) / name
        if folder.is_dir():
            # Made by root just now; the links (or mount points) inside stay read-only.
            os.lchown(folder, uid, gid)
            for entry in folder.iterdir():
                if entry.is_symlink():
                    os.lchown(entry, uid, gid)
    os.setgroups([gid])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit(f"gpulab: could not become {name}")
    os.environ["USER"] = os.environ["LOGNAME"] = name
    if env.get(ENV_UMASK):
        # The hub's own umask (077) is for its private files, not the user's.
        os.umask(int(env[ENV_UMASK], 8))


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
    folder = Path(env.get("HOME") or os.getcwd()) / ".gpulab" / "jupyter-config"
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
    prepare_datasets(dict(os.environ))
    enter_sandbox(dict(os.environ))
    configure_apps(dict(os.environ))
    if os.environ.get("GPULAB_TRIM_IMPORTS", "1") == "1":
        install_import_trimming()
    sys.argv = ["jupyterhub-singleuser", *argv]
    from jupyterhub.singleuser import main as singleuser_main

    sys.exit(singleuser_main())


if __name__ == "__main__":
    main()
