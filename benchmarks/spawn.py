"""Spawn benchmark: POST-to-ready for gpulab's local spawner vs stock JupyterHub, in one run.

Starts two real hubs side by side on loopback (same venv, same configurable-http-proxy):

- stock: JupyterHub with ``SimpleLocalProcessSpawner`` (``jupyterhub-singleuser``, /lab), its
  servers running stock JupyterLab: gpulab's server and JupyterLab extensions (installed in the
  shared venv) and gpulab's page config are switched off for them (``stock_jupyter_config``);
- gpulab: ``gpulab up`` with the GPU-aware local spawner and a simulated pool;
- gpulab-nofork (with ``--no-fork-variant``): the same without the pre-warmed fork server, to show
  what each start-up measure is worth.

Spawns alternate between the two (so drift on a shared machine hits both alike); each is timed from
sending ``POST /hub/api/users/NAME/server`` to the hub reporting the server ready. Prints p50/p95,
the ratio, and where the time goes.

    .venv/bin/python benchmarks/spawn.py [--spawns 20] [--gpu a100-80g]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import VENV_BIN, Hub, wait_for

from gpulab.hub_config.config import find_proxy_command

STOCK_HUB_CONFIG = """
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = {hub_ip!r}
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = {proxy_cmd!r}
c.ConfigurableHTTPProxy.pid_file = "{data}/proxy.pid"
c.JupyterHub.db_url = "sqlite:///{data}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{data}/cookie_secret"
c.Spawner.default_url = "/lab"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.services = [{{"name": "bench", "api_token": "{token}"}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": ["bench"]}}]
"""

LOCAL_SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{data}/users/{{username}}"
c.Spawner.args = {args!r}
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.environment = {{"JUPYTER_CONFIG_DIR": {config_dir!r}, "JUPYTER_PREFER_ENV_PATH": "0"}}
"""

# gpulab's extensions are installed in the venv that both hubs share; stock servers must not get
# them (nor their cost or their speed-ups). JUPYTER_PREFER_ENV_PATH=0 gives the user-level config
# dir precedence over the venv's, where gpulab's page config is installed.
STOCK_SERVER_CONFIG = {
    "ServerApp": {"jpserver_extensions": {"jupyterlab_gpulab": False, "gpulab_reporter": False}}
}
STOCK_PAGE_CONFIG = {
    "buildAvailable": True,
    "buildCheck": True,
    "disabledExtensions": {
        "jupyterlab-gpulab": True,
        "@jupyterlab/apputils-extension:announcements": False,
    },
}


def stock_jupyter_config(data: Path) -> Path:
    """A JUPYTER_CONFIG_DIR that gives stock servers stock JupyterLab and jupyter_server."""
    config_dir = data / "jupyter-config"
    (config_dir / "labconfig").mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(STOCK_SERVER_CONFIG))
    (config_dir / "labconfig" / "page_config.json").write_text(json.dumps(STOCK_PAGE_CONFIG))
    return config_dir


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def stock_hub(base: Path, spawner_config: str | None = None, hub_ip: str = "127.0.0.1") -> Hub:
    """Stock JupyterHub in ``base/stock``, with ``spawner_config`` (default: local processes)."""
    data = base / "stock"
    data.mkdir(parents=True)
    hub = Hub(data, simulate="none")
    if spawner_config is None:
        spawner_config = LOCAL_SPAWNER_CONFIG.format(
            data=data,
            args=["--allow-root"] if os.geteuid() == 0 else [],
            singleuser=str(VENV_BIN / "jupyterhub-singleuser"),
            config_dir=str(stock_jupyter_config(data)),
        )
    config = data / "jupyterhub_config.py"
    config.write_text(
        STOCK_HUB_CONFIG.format(
            port=hub.port,
            hub_ip=hub_ip,
            hub_port=hub.hub_port,
            proxy_api_port=hub.proxy_api_port,
            proxy_cmd=find_proxy_command(),
            data=data,
            token=hub.token,
        )
        + spawner_config
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
            "from gpulab.spawners.inside.launcher import _SkipImports;sys.meta_path.insert(0,_SkipImports());"
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
    parser.add_argument(
        "--no-fork-variant",
        action="store_true",
        help="also time gpulab without its fork server (new process per spawn)",
    )
    args = parser.parse_args()

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    base = Path(tempfile.mkdtemp(prefix="gpulab-bench-"))
    stock = stock_hub(base)
    hubs: dict[str, Hub] = {
        "stock": stock,
        "gpulab": Hub(base / "gpulab" / "data", simulate="A100-80G:2,RTX-4090:2"),
    }
    if args.no_fork_variant:
        hubs["gpulab-nofork"] = Hub(
            base / "nofork" / "data",
            simulate="A100-80G:2,RTX-4090:2",
            extra_args=["--GpuLocalSpawner.use_forkserver=False"],
        )
    options = {name: (None if name == "stock" else {"gpu": args.gpu}) for name in hubs}
    results: dict[str, list[float]] = {name: [] for name in hubs}
    try:
        print(f"starting {', '.join(hubs)} ...", flush=True)
        start_stock(stock)
        for name, hub in hubs.items():
            if name != "stock":
                hub.start()
        for i in range(args.warmup):
            for name, hub in hubs.items():
                time_spawn(hub, options[name])
            print(f"  warm-up {i + 1}/{args.warmup}", flush=True)
        for i in range(args.spawns):
            line = []
            for name, hub in hubs.items():
                results[name].append(time_spawn(hub, options[name]))
                line.append(f"{name} {results[name][-1]:.2f}s")
            print(f"  spawn {i + 1:2d}/{args.spawns}: " + "  ".join(line), flush=True)
    finally:
        for hub in hubs.values():
            hub.stop()

    print()
    print(f"POST-to-ready over {args.spawns} spawns each (gpulab: gpu={args.gpu}, simulated)")
    print(f"  {'':14s} {'p50':>7s} {'p95':>7s} {'ratio p50':>10s} {'ratio p95':>10s}")
    s50, s95 = pct(results["stock"], 0.5), pct(results["stock"], 0.95)
    for name, values in results.items():
        p50, p95 = pct(values, 0.5), pct(values, 0.95)
        print(f"  {name:14s} {p50:6.2f}s {p95:6.2f}s {p50 / s50:10.2f} {p95 / s95:10.2f}")

    print("\nwhere the time goes (medians):")
    stock_hub_s = statistics.median(hub_log_seconds(stock, r"took ([\d.]+) seconds to start"))
    print(f"  stock: hub-side spawn incl. readiness polling {stock_hub_s:.2f}s")
    print(
        f"         `python -c 'import jupyterhub.singleuser'`: {import_time(False):.2f}s, "
        f"with gpulab's import trimming {import_time(True):.2f}s"
    )
    for name, hub in hubs.items():
        if name == "stock":
            continue
        phases = gpulab_phases(hub)
        hub_s = statistics.median(hub_log_seconds(hub, r"took ([\d.]+) seconds to start"))
        parts = " + ".join(
            f"{k.replace('_', ' ')} {v:.3f}s"
            for k, v in phases.items()
            if k not in ("launch", "total")
        )
        print(f"  {name}: hub-side spawn {hub_s:.2f}s = {parts}")
        print(
            f"         + readiness check and hub bookkeeping {hub_s - phases.get('total', 0):.3f}s"
        )
    print("  (client-measured minus hub-side: proxy route and API round trips)")
    print(f"\nlogs: {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
