"""The embedded default: single-user servers as local processes, pinned to their GPUs.

Each user has one home under the data dir, the same in GPU and no-GPU mode. Datasets appear under
``~/datasets/SLUG`` read-only. ``start()`` returns only once the server accepts connections, so the
hub's readiness check succeeds at once; if the server exits first, the spawn fails with the cause
and the server's last log lines instead of JupyterHub's opaque error (``wait_until_listening``).

It keeps LocalProcessSpawner's contract, checked by running JupyterHub's own spawner tests on it
(tests/e2e/test_jupyterhub_spawner_contract.py): ``start()`` returns (ip, port), ``shell_cmd`` and
``popen_kwargs`` apply (such servers start with Popen, not the fork server), and ``clear_state()``
clears all that gpulab saved.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyterhub import spawner as jupyterhub_spawner
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import random_port
from traitlets import Bool, CaselessStrEnum, Float, Integer, List, Unicode, default, validate

from gpulab.catalog import App
from gpulab.spawners.apps import checkout_problem
from gpulab.spawners.images import ImageStatus
from gpulab.spawners.inside.agent import signal_opted_in
from gpulab.spawners.inside.launcher import ENV_JOB_NETWORK, ENV_SCRATCH, enter_sandbox
from gpulab.spawners.local import accounts, exchange, serverlog
from gpulab.spawners.local.checkpoint import run_checkpoint
from gpulab.spawners.local.forkserver import ForkServerClient
from gpulab.spawners.local.isolation import LocalIsolationMixin
from gpulab.spawners.local.ports import PortTaken, held_by_another
from gpulab.spawners.local.sandbox import Sandbox
from gpulab.spawners.mixin import GpuSpawnerMixin, SpawnError
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.options import ServerOptions
from gpulab.spawners.request import SpawnRequest
from gpulab.spawners.storage.datasets import is_private, mount_name
from gpulab.spawners.storage.homes import (
    HomeUsage,
    StorageError,
    home_name,
    legacy_home_name,
)

# The folder holding gpulab's code (spawners/local/ is two below it).
CODE_ROOT = Path(__file__).resolve().parents[2]

_FORKSERVERS: dict[str, ForkServerClient] = {}

# LocalProcessSpawner options that only a new process can honour: a server forked by the fork
# server runs no shell (`shell_cmd`) and is no Popen (`popen_kwargs`). With either set, servers
# start with Popen.
FORK_EXCLUDES = ("shell_cmd", "popen_kwargs")
# Starts of one server, each on another free port, when another process took the one chosen.
PORT_TRIES = 3


def forkserver_for(pool: GpuPool) -> ForkServerClient:
    """The node's fork server client (one per data dir), created on first use."""
    run_dir = Path(pool.data_dir) / "run"
    socket_path = str(run_dir / "forkserver.sock")
    client = _FORKSERVERS.get(socket_path)
    if client is None:
        env = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TZ")}
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.defpath])
        # Imports happen with a neutral HOME: anything user-specific is read after the fork.
        env["HOME"] = str(run_dir)
        client = ForkServerClient(
            socket_path, str(Path(pool.data_dir) / "logs" / "forkserver.log"), env
        )
        _FORKSERVERS[socket_path] = client
    return client


def home_message(u: HomeUsage) -> str:
    """The spawn's progress line about the home: its use against its quota."""
    gb = 2**30
    how = "a quota the kernel enforces" if u.enforced else "quota not enforced on this node"
    return (
        f"Your home: {u.used_bytes / gb:.2f} GB used of {u.quota_bytes / gb:.2f} GB "
        f"({u.percent:.0f} %, {how})"
    )


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped by its parent) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()  # bytes: the name is the process's choice
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


def _read_only_for_all(folder: Path) -> None:
    """Read-only, and readable by every user's account (the hub's umask is 077). Only for the
    hub's own copies in its data dir."""
    for path in [*folder.rglob("*"), folder]:
        mode_bits = path.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
        if path.is_dir():
            mode_bits |= stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
        path.chmod(mode_bits & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _can_unshare_mounts() -> bool:
    probe = (
        "import ctypes,ctypes.util,sys;"
        "l=ctypes.CDLL(ctypes.util.find_library('c'),use_errno=True);"
        "sys.exit(l.unshare(0x20000))"
    )
    try:
        return subprocess.run([sys.executable, "-c", probe], timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class GpuLocalSpawner(LocalIsolationMixin, GpuSpawnerMixin, LocalProcessSpawner):
    """Runs each server as a local process, with its GPUs pinned: as its user's own Unix account
    in its own cgroup when the hub runs as root (:mod:`.isolation`), else as the hub's user."""

    home_dir_template = Unicode(
        "{data_dir}/users/{username}",
        config=True,
        help="""Where each user's home lives. {data_dir} is GpuPool.data_dir, {username} the
        user name made safe as a path component. The same home serves GPU and no-GPU mode.""",
    )

    dataset_mode = Unicode(
        "auto",
        config=True,
        help="""How datasets appear in ~/datasets: 'bind' (read-only bind mounts in a private
        mount namespace: nobody in the server can write, root included; needs CAP_SYS_ADMIN),
        'symlink' (links to read-only directories: enough when the hub does not run as root),
        or 'auto' (bind where the hub can, else symlink).""",
    )

    wait_until_listening = Bool(
        True,
        config=True,
        help="""Whether start() returns only once the server accepts connections on its port. A
        server that exits before then fails the spawn with its exit code and last log lines, and
        the hub's own readiness check passes at once. False returns as soon as the process runs,
        as JupyterHub's LocalProcessSpawner does: the hub then waits for the server itself (up to
        `http_timeout`) and reports only that it did not answer.""",
    )

    ready_poll_interval = Float(
        0.01,
        config=True,
        help="Seconds between checks that the starting server accepts connections.",
    )

    log_tail_lines = Integer(
        20,
        config=True,
        help="How many of the server's last log lines a failed spawn shows.",
    )

    log_max_bytes = Integer(
        16 * 2**20,
        config=True,
        help="""Most bytes of a server's output (its own, its kernels', its terminals' stdout
        and stderr: the user's to fill) kept on the node's disk in DATA_DIR/logs/NAME.log and its
        rotated older half NAME.log.1 (spawners/local/serverlog.py; at least 128 KiB).""",
    )

    exchange_mb_per_person = Integer(
        512,
        config=True,
        help="""Room of a course's nbgrader exchange per person of the course, in MiB, where the
        hub bounds exchanges (it can loop-mount: the home store enforces quotas). Each course's
        exchange is then a filesystem image of its own, grown as people join; a student's huge
        or countless submissions fill only that (spawners/local/exchange.py).""",
    )

    local_images = List(
        Unicode(),
        ["base"],
        config=True,
        help="""Catalog images this spawner can run. Local servers always run the hub's own
        Python environment, so only images that stand for it belong here; the others (PyTorch,
        Stable Diffusion WebUI, ...) are container images and need the Docker spawner.""",
    )

    use_forkserver = Bool(
        True,
        config=True,
        help="""Start servers by forking a pre-warmed process that has already imported
        jupyter_server, JupyterLab and the enabled server extensions (about 3x faster spawns).
        Only applies with the default `cmd` and without `shell_cmd` or `popen_kwargs` (a fork
        runs no shell and takes no Popen arguments; servers then start with Popen). False starts
        each server as a new process.""",
    )

    job_network = CaselessStrEnum(
        ["private", "host"],
        default_value="private",
        config=True,
        help="""The network a training job's command runs in (issue 26). 'private': a network
        namespace of the job's own with only its loopback: its rendezvous (MASTER_ADDR=127.0.0.1,
        MASTER_PORT; torchrun's TCPStore and gloo, which have no authentication) and whatever
        else it listens on are out of every other user's reach, and the job has no network
        beyond its own loopback: no outbound access (no downloads; put data in datasets or the
        home first). The hub still reaches the job's server (its socket is made in the host's
        network). Applies where the hub makes mount namespaces (`dataset_mode` 'bind', or 'auto'
        on a root hub); elsewhere every server runs as one account anyway and jobs use the
        host's network. 'host': the host's network, shared with every other user's servers and jobs
        on this node (their processes can connect to the job's ports).""",
    )

    trim_imports = Bool(
        True,
        config=True,
        help="""Skip imports that only slow server start-up (jsonschema's rfc3987 grammar, used
        by no Jupyter event schema).""",
    )

    @classmethod
    def prepare_node(cls, pool: GpuPool, config: Any) -> None:
        """Called at hub start: warm the fork server so the first spawn is fast too."""
        # Which home backend this node has (a probe mount, once), off the event loop.
        probe = asyncio.ensure_future(asyncio.to_thread(lambda: pool.homes.backend))
        probe.add_done_callback(lambda t: t.cancelled() or t.exception())
        settings = {**config.get("LocalProcessSpawner", {}), **config.get(cls.__name__, {})}
        if settings.get("use_forkserver", True) and not {"cmd", *FORK_EXCLUDES} & set(settings):
            client = forkserver_for(pool)
            task = asyncio.ensure_future(client.ensure_started())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    @validate("dataset_mode")
    def _check_dataset_mode(self, proposal: dict) -> str:
        if proposal["value"] not in {"auto", "bind", "symlink"}:
            raise ValueError(
                f"dataset_mode: {proposal['value']!r} is not allowed; allowed: auto, bind, symlink"
            )
        return proposal["value"]

    @default("cmd")
    def _default_cmd(self) -> list[str]:
        return [sys.executable, "-m", "gpulab.spawners.inside.launcher"]

    @default("env_keep")
    def _default_env_keep(self) -> list[str]:
        return ["PATH", "LANG", "LC_ALL", "TZ", "JUPYTERHUB_SINGLEUSER_APP", "GPULAB_REQUIRE_ALL"]

    # ---- paths -------------------------------------------------------------------------------

    @property
    def home_dir(self) -> str:
        return self.home_dir_template.format(
            data_dir=self.pool.data_dir, username=self.user_home_name()
        )

    @property
    def log_path(self) -> Path:
        # A home name never holds a ".": "bob.x.log" (bob's server x) is never "bob-x"'s log.
        suffix = f".{home_name(self.name)}" if self.name else ""
        return Path(self.pool.data_dir) / "logs" / f"{self.user_home_name()}{suffix}.log"

    def _dataset_mode(self) -> str:
        if self.dataset_mode != "auto":
            return self.dataset_mode
        cls = type(self)
        if not hasattr(cls, "_auto_mode"):
            cls._auto_mode = "bind" if _can_unshare_mounts() else "symlink"
            self.log.info("Datasets are mounted with mode %r", cls._auto_mode)
        return cls._auto_mode

    def _read_only_source(self, kind: str, slug: str, src: Path, mode: str) -> str:
        """The folder to mount at ~/KIND/SLUG (KIND: datasets or models), read-only."""
        if not src.is_dir():
            what = "Dataset" if kind == "datasets" else "Model"
            raise SpawnError(500, f"{what} {slug} is unavailable: {src} is not a directory")
        if mode == "bind" or not os.access(src, os.W_OK):
            return str(src)
        # Symlink mode and we could write the source (e.g. package data in our own venv): serve
        # a read-only copy instead, made once.
        copy = Path(self.pool.data_dir) / "read-only" / kind / slug
        if not copy.exists():
            tmp = copy.with_name(f".{slug}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            _read_only_for_all(tmp)
            tmp.rename(copy)
        elif copy.stat().st_mode & 0o005 != 0o005:
            _read_only_for_all(copy)  # made by an older gpulab, for the hub's user only
        for folder in (copy.parent.parent, copy.parent):
            folder.chmod(0o711)  # passable by the users' accounts, not listable
        return str(copy)

    # ---- environment -------------------------------------------------------------------------

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        env["USER"] = self.account_name if self.user_accounts else self.user.name
        env["HOME"] = self.home_dir
        env["SHELL"] = "/bin/bash"
        return env

    def make_preexec_fn(self, name: str):
        # gpulab's launcher enters the sandbox itself (after mounting datasets as root); any
        # other command enters it here, between fork and exec.
        env = self.sandbox.env()
        if not env or self.cmd == self._default_cmd():
            return None
        return lambda: enter_sandbox(env)

    def get_args(self) -> list[str]:
        args = list(super().get_args())
        if os.geteuid() == 0 and not self.user_accounts and "--allow-root" not in args:
            # Servers of a root hub without user accounts run as root; jupyter_server refuses
            # without this.
            args.append("--allow-root")
        return args

    # ---- lifecycle ---------------------------------------------------------------------------

    async def image_availability(self) -> dict[str, ImageStatus]:
        """Which catalog images local servers can run (the spawn form greys out the rest)."""
        return {
            slug: ImageStatus(
                slug=slug,
                docker_image=None,
                present=slug in self.local_images,
                reason="" if slug in self.local_images else "needs the Docker spawner",
            )
            for slug in self.pool.catalog.images
        }

    # ---- apps ----------------------------------------------------------------------------------

    def server_home(self) -> str:
        return self.home_dir

    def app_command(self, app: App) -> list[str] | None:
        # Local servers run the hub's own environment: an app runs if its local command is
        # installed there (the venv's bin comes first on the server's PATH).
        if not app.local_command or checkout_problem(app):
            return None
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        return app.local_command if shutil.which(app.local_command[0], path=path) else None

    async def app_unavailable(self, app: App) -> str:
        if app.is_server:
            return ""
        if not app.local_command:
            return f"needs the Docker spawner (image {app.image!r})"
        if checkout_problem(app):
            return checkout_problem(app)
        if self.app_command(app) is None:
            return f"{app.local_command[0]} is not installed in the hub's environment"
        return ""

    def _runs_image(self, opts: ServerOptions) -> bool:
        # An app's local command stands in for its image (the embedded spawner has none).
        app = self.pool.catalog.apps[opts.app]
        return opts.image in self.local_images or (
            app.image == opts.image and self.app_command(app) is not None
        )

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> tuple[str, int]:
        """Allocate the server's GPUs and start it; return its (ip, port).

        (ip, port), as LocalProcessSpawner returns: subclasses of it unpack that, and JupyterHub
        picks http or https (internal SSL) itself.
        """
        opts = self._start_request().options
        if not self._runs_image(opts):
            # Before anything is allocated: an image we can't run changes nothing.
            raise SpawnError(
                409,
                f"Image {opts.image!r} needs the Docker spawner; "
                f"images on this node: {', '.join(self.local_images)}",
            )
        return await self.gpulab_start()

    def uses_forkserver(self) -> bool:
        """Whether this spawner's servers are forked by the fork server (else started by Popen).
        A job server never is: its runner imports no Jupyter (nothing to gain), and its exit
        code must be the hub's own observation (Popen's wait), not a line in its log."""
        if self.gpulab_job is not None:
            return False
        if not self.use_forkserver or self.cmd != self._default_cmd():
            return False
        unforkable = [name for name in FORK_EXCLUDES if getattr(self, name)]
        if unforkable:
            cls = type(self)
            if not getattr(cls, "_told_unforkable", False):
                cls._told_unforkable = True
                self.log.info(
                    "%s is set: servers start with Popen, not the fork server",
                    " and ".join(unforkable),
                )
            return False
        return True

    async def _launch(self, request: SpawnRequest) -> tuple[str, int]:
        opts = request.options
        home = Path(self.home_dir)
        mounts: list[list[str]] = []
        models = await asyncio.to_thread(self.model_sources)
        if opts.datasets or models:
            mode = self._dataset_mode()
            self.emit_progress(
                30,
                f"Mounting datasets and models read-only ({mode}): "
                + ", ".join([*opts.datasets, *(f"models/{m}" for m in models)]),
            )
            for slug in opts.datasets:
                src = self.pool.datasets.source_of(slug, self.pool.catalog)
                if not is_private(slug):
                    src = await asyncio.to_thread(
                        self._read_only_source, "datasets", slug, src, mode
                    )
                elif mode != "bind" and self.user_accounts:
                    # A user's snapshot is reachable only through a bind mount (its folder is
                    # root's, 0700): a link would be a path any account could try.
                    raise SpawnError(409, f"Dataset {slug} needs dataset_mode 'bind' here")
                mounts.append([str(src), str(home / "datasets" / mount_name(slug))])
            for slug, src in models.items():
                src = await asyncio.to_thread(self._read_only_source, "models", slug, src, mode)
                mounts.append([src, str(home / "models" / slug)])
        else:
            mode = "symlink"

        # An operator's fixed port is kept (no other try); else a free one is chosen per try.
        fixed = any(
            c.__name__ in self.config and "port" in self.config[c.__name__]
            for c in type(self).mro()
        )
        for tries_left in reversed(range(PORT_TRIES)):
            try:
                return await self._launch_on_a_port(request, home, mounts, mode)
            except PortTaken as e:
                # Another process of the host took the free port chosen for this server before
                # the server bound it: this try is ended, the next one gets another port.
                self.log.warning("%s: %s", self.owner, e)
                await asyncio.to_thread(self.sandbox.kill_all, self.pid or None)
                if fixed or not tries_left:
                    raise SpawnError(503, f"{e}; try starting it again") from None
                self.port = 0
        raise AssertionError("unreachable")

    async def _launch_on_a_port(
        self, request: SpawnRequest, home: Path, mounts: list[list[str]], mode: str
    ) -> tuple[str, int]:
        sandbox = await asyncio.to_thread(self._make_sandbox, home)
        usage = getattr(self, "_home_usage", None)
        if usage is not None:
            self.emit_progress(35, home_message(usage))
        if self.port == 0:
            self.port = random_port()
        env = self.get_env()
        env.update(request.env)
        env.update(sandbox.env())
        if "umask" in self.popen_kwargs:
            env.pop("GPULAB_UMASK", None)  # the operator's umask (popen_kwargs) stands
        env["GPULAB_DATASET_MODE"] = mode
        # Where the hub may make mount namespaces, each server gets a /proc of its own that
        # shows it only its account's processes (spawners/inside/launcher.py).
        env["GPULAB_PRIVATE_PROC"] = "1" if self._dataset_mode() == "bind" else "0"
        env["GPULAB_DATASET_MOUNTS"] = json.dumps(mounts)
        scratch = self._scratch()
        if scratch:
            env[ENV_SCRATCH] = json.dumps(scratch)
        env["GPULAB_TRIM_IMPORTS"] = "1" if self.trim_imports else "0"
        if self.gpulab_job is not None:
            # The job's own network where the hub can make one (spawners/inside/launcher.py).
            private = self.job_network == "private" and self._dataset_mode() == "bind"
            env[ENV_JOB_NETWORK] = "private" if private else "host"
        venv_bin = os.path.dirname(sys.executable)
        env["PATH"] = os.pathsep.join([venv_bin, env.get("PATH", os.defpath)])
        nbgrader_config = await asyncio.to_thread(self._prepare_assignments, sandbox)
        env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
            filter(None, [nbgrader_config, env.get("JUPYTER_CONFIG_PATH")])
        )

        self.emit_progress(40, "Starting the server process")
        t0 = time.perf_counter()
        forked = self.uses_forkserver()
        if forked:
            await asyncio.to_thread(self._prepare_dirs, home)
            self.proc = None
            self.pid = await forkserver_for(self.pool).spawn(
                self.get_args(), env, str(home), str(self.log_path), self.log_max_bytes
            )
        else:
            self.proc = await asyncio.to_thread(self._popen, self.command_line(), env, home)
            self.pid = self.proc.pid
        t1 = time.perf_counter()
        self.pool.allocator.set_pid(self.owner, self.pid)
        if self.wait_until_listening:
            self.emit_progress(60, "Waiting for JupyterLab to answer")
            await self._wait_listening()
        if forked:
            self.launch_timings = {
                "fork": t1 - t0,
                "server_init_until_listening": time.perf_counter() - t1,
            }
        else:
            self.launch_timings = {
                "process_start": t1 - t0,
                "imports_and_server_init_until_listening": time.perf_counter() - t1,
            }
        return (self.ip or "127.0.0.1", self.port)

    def _ensure_home(self, home: Path, account: accounts.Account | None) -> None:
        """The home store's home for this user at ``home`` (blocking): with the image backend,
        a filesystem of its own mounted there, its size the user's quota. A home somewhere else
        (an operator's ``home_dir_template``) is not the store's and is left as it is."""
        name = self.user_home_name()
        store = self.pool.homes
        self._home_usage = None
        if Path(home) != store.path(name):
            return
        try:
            if account is not None:
                self.adopt_legacy_home(name, account)
            store.ensure(name, *((account.uid, account.gid) if account else (None, None)))
            self._home_usage = store.usage(name)
        except StorageError as e:
            raise SpawnError(500, f"Your home could not be prepared: {e}") from None

    def adopt_legacy_home(self, name: str, account: accounts.Account) -> None:
        """Issue 23: the old home-name rule gave two users one home. A home under this user's
        old-rule name is theirs only if their own account owns it (the store adopts it then,
        and the account's recorded home follows); a home under their name owned by another
        user's account is never handed over (the old rule's shared home): the start is refused.
        Blocking."""
        store = self.pool.homes
        why = store.adopt(legacy_home_name(self.user.name), name, account.uid)
        if why:
            self.log.warning("Home of %s: %s", self.owner, why)
        elif account.home != str(store.path(name)) and not os.path.lexists(account.home):
            usermod = shutil.which("usermod", path="/usr/sbin:/sbin") or "usermod"
            subprocess.run(
                [usermod, "--home", str(store.path(name)), account.name],
                capture_output=True,
                timeout=60,
            )
        owner = store.owner_of(name)
        if owner in (None, 0, os.geteuid(), account.uid):
            return
        try:
            other = pwd.getpwuid(owner).pw_name
        except KeyError:
            return
        if other.startswith(self.account_prefix):
            self.log.error("Home %s of %s belongs to %s: not handed over", name, self.owner, other)
            raise SpawnError(
                409,
                "Your home folder belongs to another user's account (a home shared under the "
                "old home-name rule); an administrator must look at it before it is yours.",
            )

    async def stop(self, now: bool = False) -> None:
        self._note_job_exit()  # ended already (JupyterHub's poll found it stopped)
        await super().stop(now=now)
        self._note_job_exit()  # the stop ended it: Popen's wait has its status
        await asyncio.to_thread(self._trim_home)

    def _trim_home(self) -> None:
        """Blocks the user's files freed go back to the node's disk (the home store's trim)."""
        name = self.user_home_name()
        store = self.pool.homes
        if Path(self.home_dir) != store.path(name):
            return
        try:
            n = store.trim(name)
        except StorageError as e:
            self.log.warning("Could not trim the home of %s: %s", self.owner, e)
            return
        if n:
            self.log.info("Home of %s: %d MiB freed on the node's disk", self.owner, n >> 20)

    def _scratch(self) -> dict[str, Any] | None:
        """The server's own bounded /tmp and /dev/shm (:func:`private_scratch`), where the hub
        may make mount namespaces; None elsewhere (a hub that is not root)."""
        if os.geteuid() != 0 or self._dataset_mode() != "bind":
            return None
        s = self.pool.catalog.storage
        return {
            "tmp": s.bytes_of(s.tmp_gb),
            "shm": self.job_shm_bytes(s.bytes_of(s.shm_gb)),
            "homes": str(self.pool.homes.homes_dir),
            # What the server runs from stays where it is, should it live below /tmp (a test
            # checkout, a throw-away venv): the data dir, the Python environment, this code.
            "keep": sorted(
                {
                    str(Path(self.pool.data_dir).resolve()),
                    str(Path(sys.prefix).resolve()),
                    str(CODE_ROOT),
                }
            ),
        }

    def _prepare_assignments(self, sandbox: Sandbox) -> str:
        """The course exchanges of the user's courses and the server's nbgrader config
        (:mod:`.exchange`); blocking. Returns the folder holding the config."""
        account_of = None
        if self.user_accounts and self.course_seats:
            # One read of the account database for every person of every course.
            table = {
                p.pw_name: accounts.Account(p.pw_name, p.pw_uid, p.pw_gid, p.pw_dir)
                for p in pwd.getpwall()
            }
            prefix = self.account_prefix

            def account_of(name: str) -> accounts.Account | None:
                return table.get(accounts.account_name(name, prefix))

        folder, problems = exchange.prepare(
            self.pool.data_dir,
            self.user_home_name(),
            self.user.name,
            self.course_seats,
            sandbox.account,
            account_of,
            self.exchange_mb_per_person * 2**20 if self.pool.homes.enforced else None,
        )
        for problem in problems:
            self.log.warning("nbgrader exchange for %s: %s", self.owner, problem)
        return str(folder)

    def command_line(self) -> list[str]:
        """The server's command line for Popen: `cmd` and its arguments, wrapped in `shell_cmd`
        when one is set (as LocalProcessSpawner does: the command becomes its last argument)."""
        cmd = [*self.cmd, *self.get_args()]
        if self.shell_cmd:
            cmd = [*self.shell_cmd, shlex.join(cmd)]
        return cmd

    def _prepare_dirs(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"\n--- gpulab: starting {self.owner} at {time.ctime()} ---\n")

    def _popen(self, cmd: list[str], env: dict[str, str], home: Path) -> subprocess.Popen:
        self._prepare_dirs(home)
        self.log.info("Spawning %s", shlex.join(cmd))
        # The server writes into a pipe whose keeper bounds the log (.serverlog).
        log = serverlog.open_bounded(str(self.log_path), self.log_max_bytes)
        try:
            kwargs: dict[str, Any] = {
                "cwd": str(home),
                "stdout": log,
                "stderr": subprocess.STDOUT,
                "stdin": subprocess.DEVNULL,
                "start_new_session": True,  # signals to the hub are not forwarded to servers
            }
            preexec_fn = self.make_preexec_fn(self.user.name)
            if preexec_fn is not None:
                kwargs["preexec_fn"] = preexec_fn
            # The operator's popen_kwargs win over ours, except for the environment (as in
            # LocalProcessSpawner: the server's environment is the spawner's to build).
            kwargs.update(self.popen_kwargs)
            kwargs["env"] = env
            # JupyterHub's own Popen name, as LocalProcessSpawner calls it: whatever wraps
            # JupyterHub's process start (its spawner tests patch it) applies to ours too.
            return jupyterhub_spawner.Popen(cmd, **kwargs)
        finally:
            os.close(log)

    async def _wait_listening(self) -> None:
        host = self.ip or "127.0.0.1"
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self._exit_code()
            if code is not None:
                if any("already in use" in line for line in self.log_tail()):
                    raise PortTaken(f"port {self.port} was in use when the server bound it")
                raise SpawnError(500, self._early_exit_message(code))
            try:
                _, writer = await asyncio.open_connection(host, self.port)
            except OSError:
                await asyncio.sleep(self.ready_poll_interval)
                continue
            writer.close()
            if self.pid and await asyncio.to_thread(held_by_another, self.port, self.pid):
                raise PortTaken(f"port {self.port} is another process's, not the server's")
            if self._exit_code() is not None:
                continue  # it answered, but the server is gone: the loop's first check says why
            return
        raise SpawnError(500, f"Server did not listen on port {self.port} in {self.start_timeout}s")

    def _exit_code(self) -> int | None:
        """The server's exit code once it has exited (None while it runs)."""
        if self.proc is not None:
            return self.proc.poll()
        if pid_alive(self.pid):
            return None
        # Forked by the fork server, which reaps it and logs the exit code.
        for _ in range(50):
            for line in reversed(self.log_tail()):
                m = re.search(rf"server process {self.pid} exited with (code|signal) (-?\d+)", line)
                if m:
                    return int(m.group(2)) if m.group(1) == "code" else -int(m.group(2))
            time.sleep(0.01)
        return -1

    def _early_exit_message(self, code: int) -> str:
        tail = self.log_tail()
        how = f"signal {-code}" if code < 0 else f"code {code}"
        return f"Server exited with {how} before it answered. Last log lines:\n" + "\n".join(tail)

    async def poll(self) -> int | None:
        self._note_job_exit()
        if self.proc is None and self.pid and not pid_alive(self.pid):
            # kill(pid, 0) succeeds on a zombie nobody reaped; a forked server's parent is the
            # fork server (or, after a hub restart, init), not us.
            await self.end_processes()
            self.clear_state()
            return 0
        return await super().poll()

    def _note_job_exit(self) -> None:
        """Keep the runner's exit code (Popen's wait: the hub's own observation) before
        JupyterHub's poll clears the state; a server known only by its pid (a hub restart) has
        none to give."""
        if self.proc is not None and self._job_exit is None:
            code = self.proc.poll()
            if code is not None:
                self._job_exit = self.exit_code_of(code)

    async def gpulab_exit_status(self) -> int | None:
        self._note_job_exit()
        return self._job_exit

    def log_tail(self) -> list[str]:
        try:
            with open(self.log_path, errors="replace") as f:
                return list(deque((line.rstrip("\n") for line in f), maxlen=self.log_tail_lines))
        except OSError:
            return []

    def _launched(self) -> bool:
        return bool(self.pid)

    # ---- preemption warning (spot) -------------------------------------------------------------

    async def gpulab_signal_processes(self) -> tuple[list[int], list[int]]:
        """SIGUSR1 to the server's processes that catch it: all of its sandbox (its cgroup or
        account; without those, its process tree and any process carrying its allocation id)."""
        if self.allocation is None:
            return [], []
        if self.gpulab_job is not None and self.pid:
            # A job server: its runner forwards the signal to the processes that catch it (one
            # delivery each; see spawners/inside/jobrunner.py).
            return await asyncio.to_thread(signal_opted_in, [self.pid])
        sandbox = self.sandbox
        pids = await asyncio.to_thread(sandbox.pids, self.pid or self.allocation.pid)
        return signal_opted_in(pids)

    async def gpulab_run_checkpoint(
        self,
        command: str,
        limit: float,
        env: dict[str, str] | None = None,
        on_start: Callable[[dict[str, Any]], None] | None = None,
        on_result: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """The checkpoint command in the user's home with the server's environment, run by the
        same agent as in containers (see :mod:`gpulab.spawners.local.checkpoint`)."""
        server_env = self.get_env()
        if self.allocation is not None:
            server_env.update(self.gpu_env(self.allocation))
        server_env.update(env or {})
        sandbox_env = self.sandbox.env()
        return await run_checkpoint(
            command,
            self.home_dir,
            server_env,
            limit,
            on_start=on_start,
            on_result=on_result,
            # As the server's user, inside its cgroup: killed with the server, limited with it.
            preexec_fn=(lambda: enter_sandbox(sandbox_env)) if sandbox_env else None,
        )
