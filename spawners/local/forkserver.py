"""A pre-warmed fork server for local single-user servers.

Most of a server's start-up is Python importing jupyter_server, JupyterLab and their extensions.
The fork server imports all of that once, then forks one child per spawn; the child takes the
user's environment, home, GPU variables and datasets and runs JupyterHub's single-user server. A
spawn then costs a fork plus the server's own initialisation.

Protocol: one JSON line per connection on a Unix socket (mode 0600, in the hub's data dir)::

    -> {"argv": [...], "env": {...}, "cwd": "/home/x", "log": "/path/to/log", "log_max_bytes": N}
    <- {"pid": 1234}   or   {"error": "..."}

Rules that keep forking safe: the server process never starts a thread or an event loop, and every
child resets signal handlers and starts a new session. The server exits with the hub (parent-death
signal); its children keep running, as servers started with Popen would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from gpulab.spawners.inside.launcher import (
    install_import_trimming,
    libc,
    start_server_environment,
)
from gpulab.spawners.local import serverlog

DEFAULT_LOG_BYTES = 16 * 2**20  # GpuLocalSpawner.log_max_bytes's default
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def preload() -> list[str]:
    """Import the server stack and every enabled jupyter_server extension."""
    if os.environ.get("GPULAB_TRIM_IMPORTS", "1") == "1":
        install_import_trimming()
    import jupyterhub.singleuser  # noqa: F401
    from jupyter_core.paths import jupyter_config_path

    loaded = []
    for config_dir in jupyter_config_path():
        for path in sorted(Path(config_dir, "jupyter_server_config.d").glob("*.json")):
            try:
                exts = json.loads(path.read_text())["ServerApp"]["jpserver_extensions"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            for module, enabled in exts.items():
                if enabled and module not in loaded:
                    try:
                        __import__(module)
                        loaded.append(module)
                    except Exception as e:  # a broken extension fails in the child, visibly
                        print(f"forkserver: could not preload {module}: {e}", flush=True)
    _warm_first_requests()
    return loaded


def _warm_first_requests() -> None:
    """Fill the per-process caches that JupyterLab's first page load would otherwise fill.

    The language-pack listing (entry points, babel locale data) cost 0.16 s on every fresh
    server's first ``/lab/api/translations``, while the browser waits for it. Nothing here may
    start a thread or an event loop: the children are forked from this process.
    """
    try:
        from jupyterlab_server.translation_utils import get_language_packs

        get_language_packs()
    except Exception as e:  # only a missed speed-up
        print(f"forkserver: could not warm translations: {e}", flush=True)


def _run_child(request: dict, listener: socket.socket, conn: socket.socket) -> None:
    """In the forked child: become the user's server. Never returns."""
    code = 1
    try:
        listener.close()
        conn.close()
        os.setsid()
        # Children share our command line (no exec); a name in `ps -o comm` tells them apart.
        libc().prctl(PR_SET_NAME, b"jupyter-server", 0, 0, 0)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        # What a freshly started Python has: SIGINT raises KeyboardInterrupt, which
        # jupyter_server turns into a clean shutdown (kernels stopped) when the hub stops us.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = request["log_fd"]  # the write end of the log keeper's pipe (.serverlog)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["jupyterhub-singleuser", *request["argv"]]

        start_server_environment(dict(os.environ))
        from jupyterhub.singleuser import main

        result = main()
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class ForkServer:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.children: dict[int, str] = {}  # pid -> log path

    def reap(self, *_: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            log = self.children.pop(pid, None)
            if log:
                code = os.waitstatus_to_exitcode(status)
                how = f"signal {-code}" if code < 0 else f"code {code}"
                try:
                    with open(log, "a") as f:
                        f.write(f"--- gpulab: server process {pid} exited with {how} ---\n")
                except OSError:
                    pass

    def serve(self) -> None:
        path = Path(self.socket_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        listener.listen(64)
        Path(self.socket_path).with_suffix(".pid").write_text(f"{os.getpid()}\n")
        signal.signal(signal.SIGCHLD, self.reap)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        print(f"forkserver: ready on {self.socket_path}", flush=True)
        while True:
            conn, _ = listener.accept()
            with conn:
                line = conn.makefile("r").readline()
                if not line:
                    continue  # a readiness probe
                try:
                    request = json.loads(line)
                    request["log_fd"] = serverlog.open_bounded(
                        request["log"], int(request.get("log_max_bytes") or DEFAULT_LOG_BYTES)
                    )
                    try:
                        pid = os.fork()
                        if pid == 0:
                            _run_child(request, listener, conn)
                    finally:
                        os.close(request["log_fd"])
                    self.children[pid] = request["log"]
                    reply = {"pid": pid}
                except Exception as e:
                    reply = {"error": f"{type(e).__name__}: {e}"}
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass  # the hub gave up on this request; the child (if any) is its own


class ForkServerClient:
    """The hub's handle on its fork server: start it once, ask it for servers."""

    def __init__(self, socket_path: str, log_path: str, env: dict[str, str]) -> None:
        self.socket_path = socket_path
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._starting: asyncio.Future | None = None

    start_timeout = 60.0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def ensure_started(self) -> None:
        if self.running and self._starting is not None and self._starting.done():
            self._starting.result()  # re-raise a failed start
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    def _popen(self) -> subprocess.Popen:
        Path(self.socket_path).unlink(missing_ok=True)
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpulab.spawners.local.forkserver",
                    "--socket",
                    self.socket_path,
                    "--parent-pid",
                    str(os.getpid()),
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    async def _start(self) -> None:
        # Started from the event loop's own thread: the parent-death signal fires when the thread
        # that forked us exits, and a pool thread may exit long before the hub does.
        self.proc = self._popen()
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"fork server exited with {self.proc.returncode}; see {self.log_path}"
                )
            try:
                _, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fork server not ready; see {self.log_path}") from None
                await asyncio.sleep(0.02)
                continue
            writer.close()
            return

    async def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        log: str,
        log_max_bytes: int = DEFAULT_LOG_BYTES,
    ) -> int:
        await self.ensure_started()
        reader, writer = await asyncio.open_unix_connection(self.socket_path)
        try:
            request = {
                "argv": argv,
                "env": env,
                "cwd": cwd,
                "log": log,
                "log_max_bytes": log_max_bytes,
            }
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            reply = json.loads(await reader.readline())
        finally:
            writer.close()
        if "error" in reply:
            raise RuntimeError(f"fork server: {reply['error']}")
        return int(reply["pid"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="gpulab's pre-warmed single-user fork server")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--parent-pid", type=int, default=0, help="the hub's pid")
    args = parser.parse_args(argv)
    # Exit with the hub; the servers we forked live on in their own sessions.
    libc().prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if args.parent_pid and os.getppid() != args.parent_pid:
        sys.exit(0)  # the hub died before the signal was set: we were already re-parented
    t0 = time.perf_counter()
    loaded = preload()
    print(
        f"forkserver: preloaded jupyterhub.singleuser and {', '.join(loaded) or 'no extensions'} "
        f"in {time.perf_counter() - t0:.2f}s",
        flush=True,
    )
    ForkServer(args.socket).serve()


if __name__ == "__main__":
    main()
