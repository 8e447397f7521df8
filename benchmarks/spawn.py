"""Spawn benchmark: POST-to-ready for gpulab's local spawner vs stock JupyterHub, in one run.

Starts two real hubs side by side on loopback (same venv, same configurable-http-proxy):

- stock: JupyterHub with ``SimpleLocalProcessSpawner`` (``jupyterhub-singleuser``, /lab);
- gpulab: ``gpulab up`` with the GPU-aware local spawner and a simulated pool.

Spawns alternate between the two (so drift on a shared machine hits both alike); each is timed from
sending ``POST /hub/api/users/NAME/server`` to the hub reporting the server ready. Prints p50/p95,
the ratio, and where the time goes.

    .venv/bin/python benchmarks/spawn.py [--spawns 20] [--gpu a100-80g]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import VENV_BIN, Hub, wait_for

from gpulab.hub_config.config import find_proxy_command

STOCK_CONFIG = """
import os
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = {proxy_cmd!r}
c.ConfigurableHTTPProxy.pid_file = "{data}/proxy.pid"
c.JupyterHub.db_url = "sqlite:///{data}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{data}/cookie_secret"
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{data}/users/{{username}}"
c.Spawner.default_url = "/lab"
c.Spawner.args = {args!r}
c.Spawner.cmd = [{singleuser!r}]
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.services = [{{"name": "bench", "api_token": "{token}"}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": ["bench"]}}]
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def stock_hub(base: Path) -> Hub:
    data = base / "stock"
    data.mkdir(parents=True)
    hub = Hub(data, simulate="none")
    config = data / "jupyterhub_config.py"
    config.write_text(
        STOCK_CONFIG.format(
            port=hub.port,
            hub_port=hub.hub_port,
            proxy_api_port=hub.proxy_api_port,
            proxy_cmd=find_proxy_command(),
            data=data,
            token=hub.token,
            args=["--allow-root"] if os.geteuid() == 0 else [],
            singleuser=str(VENV_BIN / "jupyterhub-singleuser"),
        )
    )
    # Reuse the harness for process handling and the API, with stock JupyterHub as the command.
    hub.cli = [str(VENV_BIN / "jupyterhub"), "-f", str(config)]
    return hub


def start_stock(hub: Hub) -> None:
    log = open(hub.log_path, "ab")
    hub.proc = subprocess.Popen(
        hub.cli, stdout=log, stderr=subprocess.STDOUT, cwd=hub.data_dir, start_new_session=True
    )
    log.close()

    def up() -> bool:
        if hub.proc.poll() is not None:
            raise RuntimeError(hub.log_tail())
        try:
            import requests

            return requests.get(f"{hub.url}/hub/api/", timeout=2).ok
        except Exception:
            return False

    wait_for(up, 60, what="stock hub")


def time_spawn(hub: Hub, options: dict | None) -> float:
    name = f"b{uuid.uuid4().hex[:8]}"
    hub.create_user(name)
    t0 = time.perf_counter()
    r = hub.spawn(name, options)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn failed: {r.status_code} {r.text}")
    if r.status_code == 202:
        hub.wait_ready(name, timeout=120)
    elapsed = time.perf_counter() - t0
    hub.stop_server(name)
    return elapsed


def import_time(trimmed: bool, repeat: int = 3) -> float:
    code = (
        "import sys;"
        + (
            "from gpulab.spawners.launcher import _SkipImports;sys.meta_path.insert(0,_SkipImports());"
            if trimmed
            else ""
        )
        + "import jupyterhub.singleuser"
    )
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def hub_log_seconds(hub: Hub, pattern: str) -> list[float]:
    text = hub.log_path.read_text(errors="replace")
    return [float(m) for m in re.findall(pattern, text)]


def gpulab_phases(hub: Hub) -> dict[str, float]:
    text = hub.log_path.read_text(errors="replace")
    phases: dict[str, list[float]] = {}
    for line in re.findall(r"gpulab spawn timing \S+: (.*)", text):
        for key, value in re.findall(r"(\w+)=([\d.]+)s", line):
            phases.setdefault(key, []).append(float(value))
    return {k: statistics.median(v) for k, v in phases.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=20, help="spawns per hub (>= 20 for p95)")
    parser.add_argument("--gpu", default="a100-80g", help="GPU type for gpulab spawns, or none")
    parser.add_argument("--warmup", type=int, default=2, help="untimed spawns per hub first")
    args = parser.parse_args()

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    base = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    stock = stock_hub(base)
    gpulab = Hub(base / "gpulab" / "data", simulate="A100-80G:2,RTX-4090:2")
    options = {"gpu": args.gpu}
    try:
        print("starting stock JupyterHub (SimpleLocalProcessSpawner) and gpulab ...", flush=True)
        start_stock(stock)
        gpulab.start()
        for i in range(args.warmup):
            time_spawn(stock, None)
            time_spawn(gpulab, options)
            print(f"  warm-up {i + 1}/{args.warmup}", flush=True)
        results: dict[str, list[float]] = {"stock": [], "gpulab": []}
        for i in range(args.spawns):
            results["stock"].append(time_spawn(stock, None))
            results["gpulab"].append(time_spawn(gpulab, options))
            print(
                f"  spawn {i + 1:2d}/{args.spawns}: stock {results['stock'][-1]:.2f}s  "
                f"gpulab {results['gpulab'][-1]:.2f}s",
                flush=True,
            )
    finally:
        stock.stop()
        gpulab.stop()

    s50, s95 = pct(results["stock"], 0.5), pct(results["stock"], 0.95)
    g50, g95 = pct(results["gpulab"], 0.5), pct(results["gpulab"], 0.95)
    print()
    print(f"POST-to-ready over {args.spawns} spawns each (gpulab: gpu={args.gpu}, simulated)")
    print(f"  {'':8s} {'p50':>7s} {'p95':>7s}")
    print(f"  {'stock':8s} {s50:6.2f}s {s95:6.2f}s")
    print(f"  {'gpulab':8s} {g50:6.2f}s {g95:6.2f}s")
    print(f"  ratio gpulab/stock: p50 {g50 / s50:.2f}, p95 {g95 / s95:.2f}")

    print("\nwhere the time goes (medians):")
    stock_hub_s = hub_log_seconds(stock, r"took ([\d.]+) seconds to start")
    gpulab_hub_s = hub_log_seconds(gpulab, r"took ([\d.]+) seconds to start")
    phases = gpulab_phases(gpulab)
    imp_stock, imp_trim = import_time(False), import_time(True)
    print(
        textwrap.dedent(
            f"""\
            stock:  hub-side spawn + readiness polling {statistics.median(stock_hub_s):.2f}s
                    (`import jupyterhub.singleuser` alone: {imp_stock:.2f}s, incl. interpreter start)
            gpulab: hub-side spawn {statistics.median(gpulab_hub_s):.2f}s = allocate {phases.get("allocate", 0):.3f}s
                    + process start {phases.get("process_start", 0):.3f}s
                    + imports and server init until listening {phases.get("imports_and_server_init", 0):.2f}s
                      (trimmed `import jupyterhub.singleuser`: {imp_trim:.2f}s)
                    + readiness check after listening ~{statistics.median(gpulab_hub_s) - phases.get("total", 0):.2f}s
            both:   client-measured minus hub-side = proxy route + API round trips"""
        )
    )
    print(f"\nlogs: {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
