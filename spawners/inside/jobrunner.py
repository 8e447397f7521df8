"""The job runner: what a job server runs instead of JupyterLab (issue 26).

A job attempt is a named server of its owner (``job-17``); its spawner starts this in the
server's place, with the server's account, cgroup or container, home, datasets and cards. It

- answers HTTP on the server's port (from ``JUPYTERHUB_SERVICE_URL``, else ``--ip``/``--port``;
  or on the listening socket the launcher made, ``GPULAB_JOB_LISTEN_FD``, when the job runs in a
  network of its own), so that the hub's readiness check and route work, exactly as the hub
  answers for a server that is not running (a GET: 302 to the hub; nobody tells a running job
  from a stopped one by its URL); nothing else is served;
- runs the job's command (``GPULAB_JOB_COMMAND``) as ``bash -lc COMMAND`` in the home (or its
  ``GPULAB_JOB_CWD`` below it), in a process group of its own, with the environment below;
- forwards SIGTERM, SIGINT and SIGHUP to that process group, and SIGUSR1 (the checkpoint signal)
  only to the server's processes that catch it (the agent's rule: a process that does not would
  be killed by it);
- prints ``[gpulab] ...`` lines (attempt, resume path, exit code) to stderr, which is the
  server's log;
- exits with the command's exit code, 128+N when a signal N killed it. A command that ends
  before the hub asked the runner anything waits (up to ``GPULAB_JOB_LINGER`` seconds) for the
  hub's first request, so a quick job's start is not taken for a server that died at start.

What the command sees: ``GPULAB_JOB_ID``, ``GPULAB_JOB_ATTEMPT``, ``GPULAB_CHECKPOINT_DIR``
(``$HOME/.gpulab/jobs/<id>/checkpoints``, made here as the user), ``GPULAB_RESUME`` (the newest
entry of that folder by modification time when the attempt starts, names starting with "." left
out as unfinished; "" when none), ``GPULAB_CHECKPOINT_SIGNAL=SIGUSR1``,
``GPULAB_CHECKPOINT_SECONDS``, ``CUDA_VISIBLE_DEVICES`` (from the spawner), ``LOCAL_WORLD_SIZE``
(the cards, at least 1), ``NNODES``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (one node: 127.0.0.1 and a free port), torchrun's ``PET_*`` equivalents, and
``OMP_NUM_THREADS`` (the server's CPUs per local process).

Runs inside users' servers and images: standard library only, nothing newer than Python 3.8 at
run time, no import of gpulab (``python3 -c <this file's source>`` works as well as ``-m``).
"""

from __future__ import annotations

import http.server
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

PREFIX = "[gpulab]"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The listening socket's descriptor, when the launcher made it (spawners/inside/launcher.py).
ENV_LISTEN_FD = "GPULAB_JOB_LISTEN_FD"
# Methods the hub answers 405 on a URL outside its prefix (the others: 403, token or not).
XSRF_SAFE = ("GET", "HEAD", "OPTIONS")


def say(message: str) -> None:
    sys.stderr.write(f"{PREFIX} {message}\n")
    sys.stderr.flush()


def login_command(command: str, path: str) -> str:
    """``command`` as ``bash -lc`` runs it with the server's own ``PATH`` in front: a login
    shell reads /etc/profile, which on Debian sets PATH anew and drops the image's or venv's bin
    where the server's ``python``, ``torchrun`` and ``jupyter`` are (``python train.py`` was
    "command not found"); what the profiles add stays after it."""
    if not path:
        return command
    return f'export PATH={shlex.quote(path)}"${{PATH:+:$PATH}}"\n{command}'


# ---- the HTTP answer --------------------------------------------------------------------------


def hub_location(env: dict[str, str], uri: str) -> str:
    """Where the hub sends a request for a server that is not running (its
    ``PrefixRedirectHandler``): the same path below the hub's prefix (``/user/A/job-7/`` ->
    ``/hub/user/A/job-7/``, query kept), on the hub's public host where it has one
    (``JUPYTERHUB_HOST``: the public URL's or the subdomain host)."""
    base = env.get("JUPYTERHUB_BASE_URL") or "/"
    hub = base.rstrip("/") + "/hub/"
    check = uri if uri.endswith("/") else uri + "/"
    path = uri[len(base) :] if check.startswith(base) else urlparse(uri).path
    return env.get("JUPYTERHUB_HOST", "") + _path_join(hub, path or "/")


def _path_join(*pieces: str) -> str:
    """JupyterHub's ``url_path_join`` (this file imports nothing of JupyterHub's)."""
    parts = list(pieces)
    while parts and not parts[-1]:
        del parts[-1]
    if not parts:
        return ""
    result = "/".join(s for s in (p.strip("/") for p in parts) if s)
    if parts[0].startswith("/"):
        result = "/" + result
    if parts[-1].endswith("/"):
        result += "/"
    return "/" if result == "//" else result


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers as the proxy and hub answer for a job server that is not running, so nobody
    tells a running job from a stopped one by its URL: a GET is the hub's redirect to itself
    (JupyterHub's readiness check takes any answer below 500), any other method the hub's 405
    (its redirect handler has GET only)."""

    server_version = "TornadoServer/6.5"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    def _answer(self, status: int, location: str = "") -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.server.answered.set()  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self._answer(302, hub_location(self.server.env, self.path))  # type: ignore[attr-defined]

    def _refuse(self) -> None:
        length = self.headers.get("Content-Length", "")
        if length.isdigit() and int(length) <= 2**20:
            self.rfile.read(int(length))  # drained: the connection stays in step
        else:
            self.close_connection = True
        if self.command in XSRF_SAFE:
            self._answer(405)  # the hub's redirect handler has no such method
        else:
            self._answer(403)  # the hub refuses these before that (its XSRF check)

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def log_message(self, format: str, *args: object) -> None:
        pass  # the hub's checks are no news in the job's output


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], env: dict[str, str], fd: int | None = None
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler, bind_and_activate=fd is None)
        if fd is not None:
            # The launcher's listening socket, made in the host's network namespace before it
            # entered the job's own (sockets keep the namespace they were made in).
            self.socket.close()
            self.socket = socket.socket(fileno=fd)
            self.socket.set_inheritable(False)
            self.server_address = self.socket.getsockname()[:2]
            self.server_name, self.server_port = "job", self.server_address[1]
        self.env = env
        self.answered = threading.Event()


def listen_address(env: dict[str, str], argv: list[str]) -> tuple[str, int] | None:
    """Where the server must answer: ``JUPYTERHUB_SERVICE_URL`` (JupyterHub sets it), else
    ``--ip``/``--port`` arguments; None when neither says (the runner then answers nowhere)."""
    url = env.get("JUPYTERHUB_SERVICE_URL", "")
    if url:
        parsed = urlparse(url)
        if parsed.port:
            return (parsed.hostname or "0.0.0.0", parsed.port)
    ip, port = "127.0.0.1", None
    for i, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if not value and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value = argv[i + 1]
        if name in ("--port", "--ServerApp.port", "--NotebookApp.port") and value.isdigit():
            port = int(value)
        elif name in ("--ip", "--ServerApp.ip", "--NotebookApp.ip") and value:
            ip = value
    return (ip, port) if port else None


def serve(address: tuple[str, int] | None, env: dict[str, str] | None = None) -> _Server | None:
    """Answer HTTP at ``address``, or on the listening socket the launcher handed over
    (``GPULAB_JOB_LISTEN_FD``: a job in a network of its own)."""
    env = dict(os.environ) if env is None else env
    fd_s = env.get(ENV_LISTEN_FD, "")
    fd = int(fd_s) if fd_s.isdigit() else None
    if address is None and fd is None:
        return None
    server = _Server(address or ("127.0.0.1", 0), env, fd)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


# ---- the job's environment ----------------------------------------------------------------


def _int(env: dict[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, "") or default)
    except ValueError:
        return default


def checkpoint_dir(home: str, job_id: str) -> str:
    return os.path.join(home, ".gpulab", "jobs", job_id, "checkpoints")


def newest_checkpoint(folder: str) -> str:
    """The newest entry of ``folder`` by modification time ("" when none). Names starting with
    "." are a checkpoint still being written (write to ``.tmp``, then rename): left out."""
    best, best_mtime = "", -1.0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return ""
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if mtime > best_mtime or (mtime == best_mtime and entry.name > os.path.basename(best)):
            best, best_mtime = entry.path, mtime
    return best


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def job_env(env: dict[str, str], home: str) -> dict[str, str]:
    """The command's environment: the server's, plus the job's (see the module docstring)."""
    out = dict(env)
    job_id = env.get("GPULAB_JOB_ID", "0")
    gpus = _int(env, "GPULAB_JOB_GPUS", 0)
    nodes = max(1, _int(env, "GPULAB_JOB_NODES", 1))
    rank = _int(env, "GPULAB_JOB_RANK", 0)
    local = max(1, gpus)
    folder = checkpoint_dir(home, job_id)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    master_addr = env.get("MASTER_ADDR") or "127.0.0.1"
    master_port = env.get("MASTER_PORT") or str(free_port())
    cpus = _int(env, "GPULAB_JOB_CPUS", 0) or cpu_count()
    out.update(
        {
            "GPULAB_JOB_ID": job_id,
            "GPULAB_JOB_ATTEMPT": str(max(1, _int(env, "GPULAB_JOB_ATTEMPT", 1))),
            "GPULAB_CHECKPOINT_DIR": folder,
            "GPULAB_RESUME": newest_checkpoint(folder),
            "GPULAB_CHECKPOINT_SIGNAL": "SIGUSR1",
            "GPULAB_CHECKPOINT_SECONDS": env.get("GPULAB_CHECKPOINT_SECONDS") or "60",
            "LOCAL_WORLD_SIZE": str(local),
            "NNODES": str(nodes),
            "NODE_RANK": str(rank),
            "WORLD_SIZE": str(nodes * local),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": master_port,
            "PET_NNODES": str(nodes),
            "PET_NODE_RANK": str(rank),
            "PET_NPROC_PER_NODE": str(local),
            "PET_MASTER_ADDR": master_addr,
            "PET_MASTER_PORT": master_port,
            "OMP_NUM_THREADS": str(max(1, cpus // local)),
        }
    )
    if env.get("GPULAB_JOB_NETWORK") == "private":
        # The job's network has only its loopback: gloo and NCCL would otherwise look for the
        # host name's address (not there) before falling back to it.
        out.setdefault("GLOO_SOCKET_IFNAME", "lo")
        out.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if "CUDA_VISIBLE_DEVICES" not in out:
        out["CUDA_VISIBLE_DEVICES"] = ""
    # The runner's own settings are no business of the command's.
    for name in ("GPULAB_JOB_COMMAND", "GPULAB_JOB_CWD", "GPULAB_JOB_LINGER", ENV_LISTEN_FD):
        out.pop(name, None)
    return out


def working_dir(home: str, cwd: str) -> str:
    """``cwd`` below the home (the hub checked it is relative and has no ".."; checked again)."""
    parts = [p for p in cwd.split("/") if p not in ("", ".")]
    if cwd.startswith("/") or ".." in parts:
        raise ValueError(f"cwd {cwd!r} must be a folder below your home")
    return os.path.join(home, *parts)


# ---- signals ----------------------------------------------------------------------------------


def catches(pid: int, signum: int = signal.SIGUSR1) -> bool:
    """Whether ``pid`` has a handler installed for ``signum`` (its SigCgt mask): the agent's rule
    (spawners/inside/agent.py), repeated because this file runs alone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    except (OSError, ValueError):
        pass
    return False


def _parents() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            out[int(name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(root: int) -> list[int]:
    parents = _parents()
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.append(pid)
                frontier.append(pid)
    return found


def server_processes(env: dict[str, str]) -> list[int]:
    """The server's processes besides this one: its cgroup's (the hub made it the server's own:
    ``GPULAB_CGROUP_PROCS``), every process in sight in a container (``GPULAB_JOB_SCOPE`` is
    ``container``), and always this runner's descendants (however they detached, a cgroup or
    container holds them; a process tree only while they keep their parent)."""
    me = os.getpid()
    pids = set(descendants(me))
    if env.get("GPULAB_JOB_SCOPE") == "container":
        pids.update(int(p) for p in os.listdir("/proc") if p.isdigit())
    for procs in filter(None, env.get("GPULAB_CGROUP_PROCS", "").split(os.pathsep)):
        try:
            with open(procs) as f:
                pids.update(int(line) for line in f if line.strip())
        except (OSError, ValueError):
            continue
    pids.discard(me)
    return sorted(pids)


def prepare_container() -> None:
    """In a container, what the image's launcher does before a server (links to the read-only
    datasets, the apps' config), where the image has gpulab's launcher; a job runs without."""
    try:
        from gpulab.spawners.inside.launcher import start_server_environment
    except ImportError:
        say("this image has no gpulab launcher: datasets are not linked into the home")
        return
    start_server_environment(dict(os.environ))


class Runner:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen | None = None

    def forward(self, signum: int, frame: object = None) -> None:
        if self.proc is None:
            if signum != signal.SIGUSR1:
                raise SystemExit(128 + signum)  # a stop before the command runs: stop here
            return
        if self.proc.poll() is not None:
            return  # the command ended: the runner is on its way out
        if signum == signal.SIGUSR1:
            signalled = []
            for pid in server_processes(self.env):
                if catches(pid):
                    try:
                        os.kill(pid, signal.SIGUSR1)
                        signalled.append(pid)
                    except OSError:
                        pass
            say(
                "checkpoint signal (SIGUSR1) sent to "
                + (", ".join(map(str, signalled)) or "no process: none catches it")
            )
            return
        try:
            os.killpg(self.proc.pid, signum)
        except OSError:
            pass

    def install(self) -> None:
        """Take the signals first thing: the checkpoint signal's default action would end the
        runner, and a stop before the command runs ends it with 128+N."""
        for signum in (*FORWARDED, signal.SIGUSR1):
            signal.signal(signum, self.forward)

    def run(self, command: str, cwd: str, env: dict[str, str]) -> int:
        self.proc = subprocess.Popen(
            ["bash", "-lc", login_command(command, env.get("PATH", ""))],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: the forwarded signals reach all of it
        )
        while True:
            try:
                code = self.proc.wait()
                break
            except InterruptedError:
                continue
        return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    runner = Runner(dict(os.environ))
    runner.install()
    if os.environ.get("GPULAB_JOB_SCOPE") == "container":
        prepare_container()
    env = runner.env = dict(os.environ)
    command = env.get("GPULAB_JOB_COMMAND", "")
    job_id = env.get("GPULAB_JOB_ID", "")
    if not command or not job_id:
        say("GPULAB_JOB_COMMAND and GPULAB_JOB_ID must be set")
        return 2
    server = serve(listen_address(env, argv), env)
    home = env.get("HOME") or os.getcwd()
    try:
        cwd = working_dir(home, env.get("GPULAB_JOB_CWD", ""))
        child_env = job_env(env, home)
    except (OSError, ValueError) as e:
        say(f"job {job_id} cannot start: {e}")
        return _linger(server, env, 2)
    if not os.path.isdir(cwd):
        say(f"job {job_id} cannot start: the folder {cwd} does not exist")
        return _linger(server, env, 2)
    say(
        f"job {job_id} attempt {child_env['GPULAB_JOB_ATTEMPT']} (node {child_env['NODE_RANK']} "
        f"of {child_env['NNODES']}, {child_env['LOCAL_WORLD_SIZE']} local process(es)) in {cwd}"
    )
    resume = child_env["GPULAB_RESUME"]
    say(f"resuming from {resume}" if resume else "no checkpoint to resume from: a fresh start")
    try:
        code = runner.run(command, cwd, child_env)
    except SystemExit as e:  # a stop before the command ran
        code = int(e.code or 0)
    say(f"job {job_id} exited with code {code}")
    return _linger(server, env, code)


def _linger(server: _Server | None, env: dict[str, str], code: int) -> int:
    """Wait for the hub's first request (its readiness check) before exiting, at most
    ``GPULAB_JOB_LINGER`` seconds (default 20); a stop meanwhile ends the wait (the exit code
    stays the command's)."""
    if server is not None and not server.answered.is_set():
        try:
            limit = float(env.get("GPULAB_JOB_LINGER") or 20)
        except ValueError:
            limit = 20.0
        stop = threading.Event()
        for signum in FORWARDED:
            signal.signal(signum, lambda *_: stop.set())
        deadline = time.monotonic() + limit
        while not (server.answered.is_set() or stop.is_set()) and time.monotonic() < deadline:
            server.answered.wait(0.05)
    sys.stderr.flush()
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
