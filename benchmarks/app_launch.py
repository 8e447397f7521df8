"""One-click app launch benchmark: click -> Stable Diffusion WebUI ready, gpulab vs stock JupyterHub.

Starts two real hubs side by side on loopback (same venv, same configurable-http-proxy, same app,
same tiny model):

- gpulab: ``gpulab up`` with a simulated pool and the tiny model in its store (``gpulab models
  --make-tiny-sd``); the click is ``POST /hub/api/gpulab/users/NAME/apps/sd-webui/launch``, then
  the browser's polls of ``GET /hub/api/gpulab/users/NAME/launch`` and of the app's readiness URL;
- stock: JupyterHub with ``SimpleLocalProcessSpawner`` (as benchmarks/spawn.py), whose servers get
  the same app (``gpulab-sd-webui``) through jupyter-server-proxy configured by hand in the
  server's ``jupyter_server_config.json``; the click is ``POST /hub/api/users/NAME/server``, then
  polls of the server's state and of the app's readiness URL.

Launches alternate between the two (so drift on a shared machine hits both alike), a fresh user
each, with the user's own API token. Each is timed from the click to the readiness URL
(``/user/NAME/sd-webui/sdapi/v1/options``) answering 200 through the hub's public proxy, and split
by the app's own ``/gpulab/status`` timings into spawn, app start, model load and polling.

A root hub's gpulab servers run as per-user Unix accounts (``useradd --system``, one per user,
removed here after each launch); where the machine has no system GID left, ``--user-accounts auto``
runs gpulab's servers as root instead, as stock's are, and says so.

    .venv/bin/python benchmarks/app_launch.py [--launches 5] [--user-accounts auto|yes|no]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

# benchmarks/ for spawn.py (which has no side effects but putting tests/ on sys.path too), tests/
# for the harness and the billing client.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from billing.client import Billing, user_token
from harness import VENV_BIN, Hub, pids_whose_argv, wait_for
from spawn import STOCK_SERVER_CONFIG, pct, start_stock, stock_hub

from gpulab.spawners.local.accounts import account_name
from gpulab.spawners.local.accounts import lookup as accounts_lookup

APP = "sd-webui"
READY_PATH = "sdapi/v1/options"
POOL = "RTX-4090:2,A100-80G:1"
POLL = 0.1  # seconds between polls, for the server's state and for the app's readiness
APP_TIMEOUT = 300  # as the catalog's apps.sd-webui.timeout
REFERENCE_S = 45.0  # the reference GPU cloud's promise for its Stable Diffusion WebUI
PARTS = ("total", "spawn", "app start", "model load", "polling")


def stock_server_config(models_dir: Path) -> dict:
    """The stock servers' jupyter_server_config.json: spawn.py's (gpulab's extensions off) plus
    the app for jupyter-server-proxy, as a stock operator or user writes it by hand."""
    return {
        **STOCK_SERVER_CONFIG,
        "ServerProxy": {
            "servers": {
                APP: {
                    "command": [
                        str(VENV_BIN / "gpulab-sd-webui"),
                        "--port",
                        "{port}",
                        "--subpath",
                        "{base_url}sd-webui",
                        "--models",
                        str(models_dir),
                        # jupyter-server-proxy starts the app in the server's working directory,
                        # which SimpleLocalProcessSpawner makes the user's home: ~/sd-webui.
                        "--data-dir",
                        "sd-webui",
                    ],
                    "absolute_url": True,
                    "timeout": APP_TIMEOUT,
                }
            }
        },
    }


def run_checked(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def app_pids(user: str) -> list[int]:
    """gpulab-sd-webui processes serving ``user`` (both hubs give it --subpath /user/NAME/...)."""
    subpath = f"/user/{user}/{APP}"
    return pids_whose_argv(
        lambda argv: any(a.endswith("gpulab-sd-webui") for a in argv) and subpath in argv
    )


def system_gids_left() -> int:
    """How many GIDs useradd --system (what gpulab's per-user accounts use) has left."""
    defs: dict[str, int] = {}
    try:
        for line in Path("/etc/login.defs").read_text().splitlines():
            fields = line.split()
            if len(fields) == 2 and not line.startswith("#") and fields[1].isdigit():
                defs[fields[0]] = int(fields[1])
    except OSError:
        pass
    lo = defs.get("SYS_GID_MIN", 100)
    hi = defs.get("SYS_GID_MAX", defs.get("GID_MIN", 1000) - 1)
    used = set()
    for line in Path("/etc/group").read_text().splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].isdigit() and lo <= int(fields[2]) <= hi:
            used.add(int(fields[2]))
    return hi - lo + 1 - len(used)


class Launcher:
    """One hub and how a user launches the app on it."""

    def __init__(self, name: str, hub: Hub) -> None:
        self.name = name
        self.hub = hub
        self.problems: list[str] = []

    def click(self, user: str, token: str) -> None:
        raise NotImplementedError

    def server_ready(self, user: str, token: str) -> bool:
        raise NotImplementedError

    def launch(self) -> dict[str, float]:
        """One launch by a fresh user, timed; the user's server is stopped after."""
        hub = self.hub
        user = hub.create_user(f"b{uuid.uuid4().hex[:8]}")
        token = user_token(hub, user)
        auth = {"Authorization": f"token {token}"}
        app_url = f"{hub.url}/user/{user}/{APP}/"
        try:
            t_click = time.time()
            self.click(user, token)
            wait_for(lambda: self.server_ready(user, token), 120, POLL, f"{user}'s server")
            t_server = time.time()
            statuses: list[int] = []

            def app_ready() -> bool:
                # The first request has jupyter-server-proxy start the app; it answers when the
                # app listens (then 503 while the model loads).
                r = requests.get(app_url + READY_PATH, headers=auth, timeout=APP_TIMEOUT + 30)
                statuses.append(r.status_code)
                if r.status_code in (404, 409, 500):  # no such app, no model, load failed
                    raise RuntimeError(f"{self.name}: {r.status_code} from the app: {r.text[:300]}")
                return r.status_code == 200

            wait_for(app_ready, APP_TIMEOUT + 60, POLL, f"{user}'s app")
            t_ready = time.time()
            r = requests.get(app_url + "gpulab/status", headers=auth, timeout=30)
            r.raise_for_status()
            timings = r.json()["timings"]
        finally:
            self.stop(user)
        http_up_at = timings["started"] + timings["http_up"]
        parts = {
            "total": t_ready - t_click,
            "spawn": t_server - t_click,
            "app start": http_up_at - t_server,
            "model load": timings["model_loaded"] - timings["http_up"],
            # below: the app's own split of app start and model load
            "proxy to process": timings["started"] - t_server,
            "process to http": timings["http_up"],
            "imports": timings["imports_done"] - timings["http_up"],
            "pipeline": timings["model_loaded"] - timings["imports_done"],
            "readiness polls": len(statuses),
        }
        parts["polling"] = (
            parts["total"] - parts["spawn"] - parts["app start"] - parts["model load"]
        )
        return parts

    def stop(self, user: str) -> None:
        if self.hub.server(user) is not None:
            self.hub.stop_server(user)
        try:
            wait_for(lambda: not app_pids(user), 10, POLL, f"{user}'s app to exit")
        except TimeoutError:
            left = app_pids(user)
            self.problems.append(
                f"{self.name}: {user}'s gpulab-sd-webui (pid {left}) outlived its stopped server; "
                "killed by the benchmark"
            )
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class GpulabLauncher(Launcher):
    def __init__(self, name: str, hub: Hub, user_accounts: bool) -> None:
        super().__init__(name, hub)
        self.user_accounts = user_accounts

    def stop(self, user: str) -> None:
        super().stop(user)
        if not self.user_accounts:
            return
        # The Unix account gpulab made for this throwaway user: gpulab never removes one, and
        # the system range of accounts is small (~900), so remove ours.
        name = account_name(user)
        if accounts_lookup(name) is not None:
            done = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                self.problems.append(f"userdel {name}: {done.stderr.strip()}")

    def click(self, user: str, token: str) -> None:
        r = self.hub.api("POST", f"/gpulab/users/{user}/apps/{APP}/launch", token, json={})
        if r.status_code != 202:
            raise RuntimeError(f"gpulab launch: {r.status_code} {r.text}")
        info = r.json()
        want = {
            "url": f"/user/{user}/{APP}/",
            "ready_url": f"/user/{user}/{APP}/{READY_PATH}",
        }
        for key, value in want.items():
            if info.get(key) != value:
                self.problems.append(f"gpulab launch: {key} is {info.get(key)!r}, not {value!r}")
        self.last_gpu = info.get("gpu")

    def server_ready(self, user: str, token: str) -> bool:
        # What the browser polls after the click: the launch's progress, with the user's token.
        r = self.hub.api("GET", f"/gpulab/users/{user}/launch", token)
        r.raise_for_status()
        state = r.json()
        if state.get("failed"):
            raise RuntimeError(f"gpulab launch failed: {state['failed']}")
        return bool(state.get("ready"))


class StockLauncher(Launcher):
    def click(self, user: str, token: str) -> None:
        r = self.hub.api("POST", f"/users/{user}/server", token, json={})
        if r.status_code not in (201, 202):
            raise RuntimeError(f"stock spawn: {r.status_code} {r.text}")

    def server_ready(self, user: str, token: str) -> bool:
        r = self.hub.api("GET", f"/users/{user}", token)
        r.raise_for_status()
        server = r.json().get("servers", {}).get("")
        return bool(server and server.get("ready"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5, help="timed launches per hub (>= 5)")
    parser.add_argument(
        "--user-accounts",
        choices=("auto", "yes", "no"),
        default="auto",
        help="gpulab's per-user Unix accounts (a root hub's default); auto: yes when root and "
        "useradd --system has a GID left",
    )
    args = parser.parse_args()
    if args.launches < 5:
        parser.error("--launches must be at least 5")

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        f", {platform.system()} {platform.release()}"
    )
    print(
        "app: gpulab's diffusers Stable Diffusion WebUI (gpulab-sd-webui) on CPU, with the tiny "
        "random-weight pipeline;\n"
        "     model load here is the tiny 7 MB pipeline; a real SD 1.5 checkpoint (2-4 GB) on a "
        "GPU loads in ~5-20 s.\n"
        f"     gpulab's GPUs are simulated ({POOL}): no card is really attached."
    )
    base = Path(tempfile.mkdtemp(prefix="gpulab-bench-apps-"))
    print(f"logs: {base}", flush=True)

    # The same tiny model for both: gpulab's in its model store, stock's in a folder of its own.
    root = os.geteuid() == 0
    gids_left = system_gids_left() if root else 0
    if args.user_accounts == "auto":
        user_accounts = root and gids_left > 0
    else:
        user_accounts = args.user_accounts == "yes"
    if user_accounts:
        print("gpulab: servers run as per-user Unix accounts (a root hub's default)")
    elif root:
        why = (
            f"useradd --system has {gids_left} GIDs left on this machine"
            if args.user_accounts == "auto"
            else "--user-accounts no"
        )
        print(
            f"gpulab: servers run as root, like stock's ({why}): "
            "--GpuLocalSpawner.user_accounts=False"
        )
    extra = [] if user_accounts or not root else ["--GpuLocalSpawner.user_accounts=False"]
    gpulab_hub = Hub(base / "gpulab" / "data", simulate=POOL, extra_args=extra)
    gpulab_hub.data_dir.mkdir(parents=True)
    run_checked(
        [
            str(VENV_BIN / "gpulab"),
            "models",
            "--make-tiny-sd",
            "--data-dir",
            str(gpulab_hub.data_dir),
        ],
        "gpulab models --make-tiny-sd",
    )
    models_dir = base / "stock-models"
    run_checked(
        [str(VENV_BIN / "gpulab-sd-webui"), "--make-tiny-model", str(models_dir / "tiny-sd")],
        "gpulab-sd-webui --make-tiny-model",
    )
    stock = stock_hub(base)
    config_file = stock.data_dir / "jupyter-config" / "jupyter_server_config.json"
    config_file.write_text(json.dumps(stock_server_config(models_dir), indent=1))

    launchers = [StockLauncher("stock", stock), GpulabLauncher("gpulab", gpulab_hub, user_accounts)]
    results: dict[str, list[dict[str, float]]] = {lc.name: [] for lc in launchers}
    try:
        print("starting stock and gpulab hubs ...", flush=True)
        start_stock(stock)
        gpulab_hub.start()
        wait_for(Billing(gpulab_hub).up, 60, 0.2, "gpulab's billing service")
        for lc in launchers:
            lc.launch()
        print("  warm-up launch done on each", flush=True)
        for i in range(args.launches):
            # Alternate, and swap who goes first each round.
            order = launchers if i % 2 == 0 else launchers[::-1]
            line = []
            for lc in order:
                parts = lc.launch()
                results[lc.name].append(parts)
                line.append(
                    f"{lc.name} {parts['total']:.2f}s (spawn {parts['spawn']:.2f} + app "
                    f"{parts['app start']:.2f} + model {parts['model load']:.2f} + poll "
                    f"{parts['polling']:.2f})"
                )
            print(f"  launch {i + 1}/{args.launches}: " + "  ".join(line), flush=True)
    finally:
        for lc in launchers:
            try:
                lc.hub.stop()
            except Exception as e:  # stop the other one all the same
                print(f"could not stop {lc.name}: {e}", file=sys.stderr)
        # The hubs' helpers (gpulab's fork server exits on its parent-death signal) may take a
        # moment after the hub; whatever of this run is still there after that is killed.
        t_stop = time.monotonic()
        at_stop = pids_under(base, [lc.hub for lc in launchers])
        while pids_under(base, [lc.hub for lc in launchers]) and time.monotonic() - t_stop < 15:
            time.sleep(POLL)
        lingered = time.monotonic() - t_stop
        stray = pids_under(base, [lc.hub for lc in launchers])
        if stray:
            launchers[0].problems.append(
                f"processes outlived both hubs' stop by 15 s; killed by the benchmark: {stray}"
            )
        elif lingered > 1:
            launchers[0].problems.append(
                f"processes of this run lingered {lingered:.1f}s after the hubs' stop returned: "
                + "; ".join(at_stop.values())
            )
        for pid in stray:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    print()
    print(f"click -> app ready (readiness URL 200 through the hub's proxy), {args.launches} each")
    if args.launches < 20:
        print(f"  (p95 of {args.launches} samples: interpolated between the two slowest)")
    print(
        f"  {'':13s} {'stock p50':>9s} {'p95':>8s}  {'gpulab p50':>10s} {'p95':>8s}"
        f"  {'ratio p50':>9s} {'p95':>6s}"
    )
    for part in PARTS:
        s = [p[part] for p in results["stock"]]
        g = [p[part] for p in results["gpulab"]]
        s50, s95, g50, g95 = pct(s, 0.5), pct(s, 0.95), pct(g, 0.5), pct(g, 0.95)
        print(
            f"  {part:13s} {s50:8.2f}s {s95:7.2f}s  {g50:9.2f}s {g95:7.2f}s"
            f"  {ratio(g50, s50):>9s} {ratio(g95, s95):>6s}"
        )
    print(
        "  spawn: click -> the hub says the server is ready; app start: -> the app's HTTP up "
        "(jupyter-server-proxy\n"
        "  starts it on the first request to its URL); model load: imports of torch/diffusers + "
        "the pipeline;\n"
        "  polling: the rest (readiness polls every 0.1 s, proxy round trips)."
    )
    print("\nthe app's own split (medians):")
    for name, runs in results.items():
        med = {k: statistics.median(p[k] for p in runs) for k in runs[0]}
        print(
            f"  {name:7s} server ready -> app process {med['proxy to process']:.2f}s, process -> "
            f"HTTP up {med['process to http']:.2f}s, torch/diffusers imports {med['imports']:.2f}s"
            f", pipeline load {med['pipeline']:.2f}s; {med['readiness polls']:.0f} readiness polls"
        )
    g50 = pct([p["total"] for p in results["gpulab"]], 0.5)
    print(
        f"\nreference: {REFERENCE_S:.0f} s (the reference cloud's promise for its SD WebUI); "
        f"gpulab p50 {g50:.1f} s (tiny CPU model, simulated GPU: not a like-for-like comparison)"
    )
    print(
        "stock: the user (or operator) has to do this by hand: write jupyter-server-proxy's "
        "ServerProxy.servers entry\n"
        "       into jupyter_server_config.json, start the server, then open "
        "/user/NAME/sd-webui/; gpulab: one click."
    )
    problems = [p for lc in launchers for p in lc.problems]
    if problems:
        print("\nproblems seen:")
        for p in problems:
            print(f"  - {p}")
    print(
        f"\nlogs: {base} (stock-hub.log: stock hub and its servers; gpulab/data-hub.log: gpulab "
        "hub; servers' logs under gpulab/data)"
    )
    return 0


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "n/a"


def pids_under(base: Path, hubs: list[Hub]) -> dict[int, str]:
    """This run's processes still running, with their argv: an argument under ``base``, or a
    configurable-http-proxy on one of the hubs' proxy API ports."""
    api_ports = {str(h.proxy_api_port) for h in hubs}
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        proxy = any("configurable-http-proxy" in a for a in argv) and any(
            a == "--api-port" and b in api_ports for a, b in itertools.pairwise(argv)
        )
        if proxy or any(str(base) in a for a in argv):
            found[int(proc.name)] = " ".join(argv)[:160]
    return found


if __name__ == "__main__":
    sys.exit(main())
