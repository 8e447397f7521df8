"""Drive a real gpulab hub from tests and benchmarks: start it, call its API, run kernel code.

Everything here talks to real processes over loopback: ``gpulab up`` (JupyterHub + the real
configurable-http-proxy), single-user servers, and kernels through the Jupyter websocket API.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import requests
import websocket

from gpulab.hub_config.origin import user_label
from gpulab.spawners.node.procs import process_env

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# Debian's Chromium, driven by Playwright (which cannot download browsers here). The flags keep it
# from reaching for the network at start-up.
CHROMIUM = os.environ.get("GPULAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# The password of the people the tests sign up, and the Playwright wait (ms) for anything that
# needs JupyterLab loaded: that can take a while on a busy 2-core machine.
PASSWORD = "correct-horse-battery"
SLOW = 90_000
# A fast billing loop for tests: the reporter's heartbeat (s) and the environment that sets it.
HB = 1.0
FAST_BILLING_ENV = {
    "GPULAB_REPORTER_HEARTBEAT": str(HB),
    "GPULAB_REPORTER_MAX_BACKOFF": "2",
    "GPULAB_BILLING_MIN_MINUTES": "1",
}

# The data dirs of every hub started in this process, so that the test session can tell its own
# processes and containers (see conftest.py) from anyone else's.
STARTED_DATA_DIRS: list[Path] = []


def pids_whose_argv(match: Callable[[list[str]], bool]) -> list[int]:
    """The node's processes whose command line (argv, decoded leniently) ``match`` accepts."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if match(argv):
            found.append(int(proc.name))
    return found


def resolve_localhost_names() -> None:
    """Resolve ``localhost`` and every ``NAME.localhost`` to 127.0.0.1 in this process, as
    browsers do (RFC 6761): the hub lives at ``http://localhost:PORT`` and each user's server on
    its own origin, ``http://NAME.localhost:PORT/user/NAME/`` (hub_config/origin.py), and the
    system resolver knows only ``localhost`` itself, sometimes as ::1 first (where the proxy does
    not listen). Idempotent."""
    original = socket.getaddrinfo
    if getattr(original, "_gpulab_localhost", False):
        return

    def getaddrinfo(host, *args, **kw):
        if isinstance(host, bytes):
            host = host.decode()
        if isinstance(host, str) and (host == "localhost" or host.endswith(".localhost")):
            host = "127.0.0.1"
        return original(host, *args, **kw)

    getaddrinfo._gpulab_localhost = True
    socket.getaddrinfo = getaddrinfo
    _keep_localhost_domain_cookies()


def _keep_localhost_domain_cookies() -> None:
    """Keep cookies set with ``Domain=localhost`` as browsers do (JupyterHub sets its session id
    so once users live on NAME.localhost), and send them to localhost and NAME.localhost.

    Python's cookie policy refuses a domain without a dot; requests builds a fresh jar with the
    default policy for every request, so the default policy itself learns it (tests only)."""
    policy = http.cookiejar.DefaultCookiePolicy

    def localhost(request) -> bool:
        host = urlparse(request.get_full_url()).hostname or ""
        return host == "localhost" or host.endswith(".localhost")

    def wrap(name: str, domain_of) -> None:
        original = getattr(policy, name)

        def method(self, first, request):
            if domain_of(first).lstrip(".") == "localhost":
                return localhost(request)
            return original(self, first, request)

        setattr(policy, name, method)

    wrap("set_ok_domain", lambda cookie: cookie.domain)
    wrap("return_ok_domain", lambda cookie: cookie.domain)
    wrap("domain_return_ok", lambda domain: domain)


def _worker_ports() -> range | None:
    """This pytest-xdist worker's own share of the ports below the kernel's ephemeral range, or
    None outside a parallel run.

    A port from ``bind(0)`` is free when asked for, not when the hub binds it a moment later: with
    several workers starting hubs at once, another worker (or any ``connect()``, or JupyterHub's
    own ``random_port`` for a server) could take it in between. Below the ephemeral range nobody
    is handed a port by the kernel, and each worker probes only its own slice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return None
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    low, high = 15000, min(ephemeral, 32768)
    span = (high - low) // max(int(count), 1)
    if span < 100:
        return None
    start = low + int(worker[2:]) * span
    return range(start, start + span)


_PORTS = _worker_ports()
_next_port = 0


def free_port() -> int:
    """A loopback port nobody listens on; in a parallel run, one of this worker's own ports (each
    handed out once before any is tried again)."""
    global _next_port
    if _PORTS is not None:
        for _ in range(len(_PORTS)):
            port = _PORTS[_next_port % len(_PORTS)]
            _next_port += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUN_WHOLE_ENV = "GPULAB_RUN_WHOLE"


def run_whole(
    args: list[str], *, timeout: float, what: str, **popen: Any
) -> subprocess.CompletedProcess:
    """Run ``args`` to its end (text output, as ``popen`` asks). ``timeout`` is a guard, not a
    speed check: past it everything the command started is killed and the test fails with the
    output so far. Whatever it started that outlives it goes too, found by a marker in its
    environment: a process group is not enough (torchrun starts each rank in a session of its
    own, and a rank left by a dead torchrun is init's child). A test leaves no process behind."""
    marker = uuid.uuid4().hex
    env = {**(popen.pop("env", None) or os.environ), RUN_WHOLE_ENV: marker}
    proc = subprocess.Popen(args, text=True, start_new_session=True, env=env, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_marked(marker)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} did not end in {timeout} s:\n{(out or '')[-5000:]}") from None
    finally:
        _kill_marked(marker)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _kill_marked(marker: str) -> None:
    """SIGKILL every process whose environment carries ``marker`` (``run_whole``'s)."""
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        if process_env(pid, (RUN_WHOLE_ENV,)).get(RUN_WHOLE_ENV) == marker:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_for(predicate, timeout: float = 30, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def passable_for_accounts(path: Path) -> None:
    """A root hub's servers run as their users' own accounts, with homes in the data dir: let
    them pass through the test's temp folders (pytest makes each 0700) down to it."""
    if os.geteuid() != 0:
        return
    for folder in [path, *path.parents]:
        if folder == Path("/") or not folder.is_relative_to("/tmp"):
            break
        mode = folder.stat().st_mode & 0o777
        if not mode & 0o001:
            folder.chmod(mode | 0o011)


def catalog_with(out: Path, base: Path | None = None, **keys: Any) -> Path:
    """A copy of a catalog (the shipped one unless ``base``) written to ``out`` (a folder: its
    catalog.toml; or a file path) with each ``key = value`` line set: keys that stand once in the
    file (``free_gb``, ``tmp_gb``, ``keep_days``, ``trial_credit``...), values as Python numbers,
    strings or lists (written as TOML)."""
    text = (base or REPO / "catalog" / "catalog.toml").read_text()
    for key, value in keys.items():
        toml = str(value) if isinstance(value, Decimal) else json.dumps(value)
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {toml}", text, count=2)
        assert n == 1, f"{key} stands {n} times in the catalog"
    path = out / "catalog.toml" if out.is_dir() else out
    path.write_text(text)
    return path


def write_in_home(home: Path, relative: str, text: str) -> Path:
    """Write a file into a user's home as its owner would have (a root hub's servers run as the
    user's own account, which must be able to change what the test put there)."""
    path = home / relative
    owner = home.stat()
    made = [d for d in reversed(path.parents) if d.is_relative_to(home) and not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    for entry in [*made, path]:
        os.chown(entry, owner.st_uid, owner.st_gid)
    return path


class Hub:
    """A gpulab hub in its own data dir, on free loopback ports, with an admin API token."""

    def __init__(
        self,
        data_dir: Path,
        simulate: str = "A100-80G:2,RTX-4090:2",
        extra_args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        cli: list[str] | None = None,
        catalog: Path | None = None,
        ssh_port: bool | int = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.simulate = simulate
        self.extra_args = list(extra_args)
        self.extra_env = env or {}
        self.cli = cli or [str(VENV_BIN / "gpulab"), "up"]
        self.catalog = catalog
        self.token = uuid.uuid4().hex
        self.port = free_port()
        self.hub_port = free_port()
        self.proxy_api_port = free_port()
        # The managed billing service's port, from this worker's own share too: left to the hub it
        # is a bind(0) port, free when chosen but bound seconds later, and under the parallel
        # suite another worker's connection had taken it by then (CI: "Service billing exited").
        self.billing_port = free_port()
        # The SSH gateway (gpulab.ssh_service): off unless a test asks (ssh_port=True: a free
        # port of this worker's; an int: that port), so that hubs running at once never race
        # for `gpulab up`'s default 8022.
        self.ssh_port = (free_port() if ssh_port is True else int(ssh_port)) if ssh_port else 0
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-hub.log"

    @property
    def url(self) -> str:
        """The hub's public URL: its pages answer only under this host name (not 127.0.0.1)."""
        return f"http://localhost:{self.port}"

    def user_url(self, name: str, path: str = "") -> str:
        """``name``'s server, on its own origin: ``http://NAME.localhost:PORT/user/NAME/PATH``."""
        host = f"{user_label(name)}.localhost:{self.port}"
        return f"http://{host}/user/{name}/{path.lstrip('/')}"

    # ---- process -----------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> Hub:
        # A readiness wait, not a speed check: with the suite's workers on 2 cores a hub (and the
        # billing service it starts) has taken over 60 s to answer.
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.data_dir not in STARTED_DATA_DIRS:
            STARTED_DATA_DIRS.append(self.data_dir)
        passable_for_accounts(self.data_dir)
        # No demo model unless a test asks (env): making it takes seconds of CPU per hub.
        env = {
            **os.environ,
            "GPULAB_ADMIN_TOKEN": self.token,
            "GPULAB_DEMO_MODEL": "0",
            **self.extra_env,
        }
        if "GPULAB_BILLING_EXTERNAL_URL" not in env:
            env.setdefault("GPULAB_BILLING_PORT", str(self.billing_port))
        env.setdefault("GPULAB_SSH_PORT", str(self.ssh_port))
        args = [
            *self.cli,
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--hub-port",
            str(self.hub_port),
            "--proxy-api-port",
            str(self.proxy_api_port),
            "--simulate-gpus",
            self.simulate,
        ]
        if self.catalog:
            args += ["--catalog", str(self.catalog)]
        if self.extra_args:
            args += ["--", *self.extra_args]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
        log.close()

        self.wait_answering(timeout)
        return self

    def wait_answering(self, timeout: float) -> None:
        """Until the hub's API answers; a hub that exits first fails at once, with its log."""

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                return requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, timeout, what="the hub to answer")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the hub alone: the proxy and the servers stay, as after a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    # ---- API ---------------------------------------------------------------------------------

    def api(self, method: str, path: str, token: str | None = None, **kw: Any) -> requests.Response:
        headers = kw.pop("headers", {})
        headers["Authorization"] = f"token {token or self.token}"
        kw.setdefault("timeout", 60)
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, **kw)

    def create_user(self, name: str | None = None) -> str:
        name = name or f"u{uuid.uuid4().hex[:8]}"
        r = self.api("POST", f"/users/{name}")
        assert r.status_code in (201, 409), r.text
        return name

    def user(self, name: str) -> dict:
        r = self.api("GET", f"/users/{name}")
        r.raise_for_status()
        return r.json()

    def server(self, name: str) -> dict | None:
        return self.user(name)["servers"].get("")

    def pool(self) -> dict:
        r = self.api("GET", "/gpulab/pool")
        r.raise_for_status()
        return r.json()

    def free(self, gpu_type: str) -> int:
        return next(t["free"] for t in self.pool()["gpu_types"] if t["slug"] == gpu_type)

    def spawn(self, name: str, options: dict | None = None) -> requests.Response:
        return self.api("POST", f"/users/{name}/server", json=options or {})

    def spawn_ready(self, name: str, options: dict | None = None, timeout: float = 60) -> dict:
        r = self.spawn(name, options)
        assert r.status_code in (201, 202), f"{r.status_code} {r.text}"
        return self.wait_ready(name, timeout)

    def wait_ready(self, name: str, timeout: float = 60) -> dict:
        def ready():
            s = self.server(name)
            return s if s and s["ready"] else None

        return wait_for(ready, timeout, what=f"{name}'s server to be ready")

    def stop_server(self, name: str, timeout: float = 60) -> None:
        r = self.api("DELETE", f"/users/{name}/server")
        assert r.status_code in (202, 204), r.text
        wait_for(lambda: self.server(name) is None, timeout, what=f"{name}'s server to stop")

    # ---- kernels -----------------------------------------------------------------------------

    def kernel(self, name: str) -> Kernel:
        return Kernel(self, name)


class HubFactory:
    """Starts hubs on demand and stops every one of them at ``close()`` (a fixture's teardown).

    ``factory(name, **settings)`` makes a Hub (settings as for ``Hub``, data dir in a fresh temp
    dir named after ``name``), starts it unless ``start=False``, and returns it. ``on_stop`` runs
    after that hub is stopped (e.g. removing its Docker containers), even when its start failed.
    """

    def __init__(self, make_dir: Callable[[str], Path]) -> None:
        self.make_dir = make_dir
        self.hubs: list[tuple[Hub, Callable[[Hub], None] | None]] = []

    def __call__(
        self,
        name: str = "hub",
        *,
        start: bool = True,
        on_stop: Callable[[Hub], None] | None = None,
        **settings: Any,
    ) -> Hub:
        hub = Hub(Path(self.make_dir(name)) / "data", **settings)
        self.hubs.append((hub, on_stop))
        return hub.start() if start else hub

    def close(self) -> None:
        errors: list[Exception] = []
        while self.hubs:
            hub, on_stop = self.hubs.pop()
            try:
                hub.stop()
            except Exception as e:  # stop the others all the same
                errors.append(e)
            if on_stop is not None:
                try:
                    on_stop(hub)
                except Exception as e:
                    errors.append(e)
        if errors:
            raise errors[0]


class ConfigFileHub(Hub):
    """A hub started as ``jupyterhub -f CONFIG``, with gpulab's settings in GPULAB_* variables."""

    def __init__(
        self, data_dir: Path, config_file: Path, env: dict[str, str] | None = None
    ) -> None:
        super().__init__(
            data_dir, cli=[str(VENV_BIN / "jupyterhub"), "-f", str(config_file)], env=env
        )
        self.config_file = config_file

    def start(self, timeout: float = 90) -> ConfigFileHub:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.data_dir not in STARTED_DATA_DIRS:
            STARTED_DATA_DIRS.append(self.data_dir)
        passable_for_accounts(self.data_dir)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")},
            # Only the data dir is required; the ports keep clear of other hubs on this machine.
            "GPULAB_DATA_DIR": str(self.data_dir),
            "GPULAB_PORT": str(self.port),
            "GPULAB_HUB_PORT": str(self.hub_port),
            "GPULAB_PROXY_API_PORT": str(self.proxy_api_port),
            "GPULAB_BILLING_PORT": str(self.billing_port),
            "GPULAB_SSH_PORT": str(self.ssh_port),
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", os.defpath)]),
            **self.extra_env,
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cli,
                env=env,
                cwd=self.config_file.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        self.wait_answering(timeout)
        return self


class Kernel:
    """A real kernel in a user's server, driven over the Jupyter kernel websocket API."""

    def __init__(self, hub: Hub, user: str) -> None:
        self.hub = hub
        self.user = user
        self.base = hub.user_url(user, "api")
        self.headers = {"Authorization": f"token {hub.token}"}
        r = requests.post(f"{self.base}/kernels", headers=self.headers, json={}, timeout=60)
        # Who answered, and whether the hub still has the server: a 403 with "_xsrf" is the hub's
        # own (no route to a server), any other the server's or whatever holds its port.
        assert r.status_code == 201, (r.status_code, r.text[:500], hub.server(user))
        self.id = r.json()["id"]
        ws_url = self.base.replace("http://", "ws://") + f"/kernels/{self.id}/channels"
        self.session = uuid.uuid4().hex
        self.ws = websocket.create_connection(
            ws_url, header=[f"Authorization: token {hub.token}"], timeout=60
        )

    def send(self, code: str) -> str:
        """Start running ``code`` without waiting for it; returns the request's message id."""
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "username": self.user,
                        "session": self.session,
                        "msg_type": "execute_request",
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": False,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                    "channel": "shell",
                    "buffers": [],
                }
            )
        )
        return msg_id

    def execute(self, code: str, timeout: float = 60) -> str:
        """Run ``code``; return its stdout plus the repr of its result. Raise on a kernel error."""
        msg_id = self.send(code)
        out: list[str] = []
        error = None
        got_reply = got_idle = False
        deadline = time.monotonic() + timeout
        while not (got_reply and got_idle):
            if time.monotonic() > deadline:
                raise TimeoutError(f"kernel did not finish {code!r}")
            msg = json.loads(self.ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            content = msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "execute_result":
                out.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "execute_reply":
                got_reply = True
            elif kind == "status" and content["execution_state"] == "idle":
                got_idle = True
        if error:
            raise KernelError(error)
        return "".join(out)

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            # The server may be gone already (a test stopped it).
            try:
                requests.delete(f"{self.base}/kernels/{self.id}", headers=self.headers, timeout=30)
            except requests.RequestException:
                pass

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class KernelError(RuntimeError):
    pass


class WebSession:
    """A person in a browser, minus the JavaScript: cookies, XSRF, forms and redirects."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.http = requests.Session()

    def get(self, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 60)
        return self.http.get(f"{self.hub.url}{path}", **kw)

    def post(self, path: str, data: dict | list, **kw: Any) -> requests.Response:
        if not self.http.cookies.get("_xsrf"):
            self.get("/hub/login")
        xsrf = self.http.cookies.get("_xsrf")
        fields = list(data.items()) if isinstance(data, dict) else list(data)
        kw.setdefault("timeout", 60)
        return self.http.post(f"{self.hub.url}{path}", data=[*fields, ("_xsrf", xsrf)], **kw)

    def signup(self, name: str, password: str) -> requests.Response:
        return self.post(
            "/hub/signup",
            {
                "username": name,
                "signup_password": password,
                "signup_password_confirmation": password,
            },
        )

    def login(self, name: str, password: str) -> bool:
        r = self.post("/hub/login", {"username": name, "password": password})
        return r.ok and "jupyterhub-hub-login" in self.http.cookies


def admin_web(hub: Hub) -> WebSession:
    """The hub's admin, logged in through the form with the password generated on first start."""
    web = WebSession(hub)
    assert web.login("admin", (hub.data_dir / "admin-password").read_text().strip())
    return web


def approved_user(hub: Hub, prefix: str = "user", password: str = PASSWORD) -> str:
    """A person who signed up on the hub's page and whom the admin approved; their name."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    assert WebSession(hub).signup(name, password).ok
    approve(hub, name)
    return name


def approve(hub: Hub, name: str) -> None:
    """The admin approves ``name``'s sign-up: the Approve button on /hub/authorize, a POST with
    the XSRF token (a GET changes nothing: hub_config/signup_handlers.py)."""
    r = admin_web(hub).post(f"/hub/authorize/{name}", {"authorized": "1"})
    assert r.ok, (r.status_code, r.text[-2000:])


# Console errors a page gets from the host, not from gpulab: Chromium fails the loads in flight
# when the host's network changes (another test's Swarm fixture adding veths and bridges).
HOST_NETWORK_ERRORS = ("net::ERR_NETWORK_CHANGED",)


def page_error(message: Any) -> bool:
    """Whether a Playwright console message is an error of the page's own (not the host's)."""
    return message.type == "error" and not any(e in message.text for e in HOST_NETWORK_ERRORS)


def show_panel(page: Any, panel_id: str, timeout: float = SLOW) -> None:
    """Open JupyterLab's sidebar panel ``panel_id`` (its tab's ``data-id``). A click on a tab
    toggles its panel, and a reloaded JupyterLab restores the panels that were open (after a
    switch, the one just used): click only when it is not the current one."""
    tab = page.locator(f'.lm-TabBar-tab[data-id="{panel_id}"]')
    if "lm-mod-current" not in (tab.get_attribute("class", timeout=timeout) or "").split():
        tab.click()
    page.locator(f"#{panel_id}").wait_for(state="visible", timeout=timeout)


def browser_log_in(page, hub: Hub, name: str, password: str, timeout: float = 90_000) -> None:
    """Log in through the hub's own form in a Playwright page, as a person would."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", password)
    page.press("input[name=password]", "Enter")
    page.wait_for_url(lambda url: "/hub/login" not in url, timeout=timeout)


class Receiver:
    """A real HTTP server on loopback that records webhook deliveries."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.deliveries.append((dict(self.headers), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
