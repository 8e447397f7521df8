"""Docker spawn benchmark: POST-to-ready for gpulab's Docker spawner vs stock DockerSpawner, one run.

Both hubs run side by side against the same Docker Engine and the same preloaded image (the
registry-free test image, images/build-test-image.sh):

- stock: JupyterHub with ``dockerspawner.DockerSpawner`` running the image with the stock
  ``jupyterhub-singleuser`` command, reached on the container's bridge address;
- gpulab: ``gpulab up --spawner docker`` (GPU allocation, labels, home volume, limits, the launcher
  as the image's command) with a simulated GPU.

Spawns alternate between the two (drift on a shared machine hits both alike), each timed from
sending ``POST /hub/api/users/NAME/server`` to the hub reporting the server ready. The breakdown is
measured the same way for both, from outside: container start (Docker's ``State.StartedAt``),
Python start-up inside (until the server logs that it is running, by Docker's log timestamps) and
readiness detection (from there until the hub answered ready).

    .venv/bin/python benchmarks/docker_spawn.py [--spawns 20] [--gpu a100-80g]
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
import time
import uuid
from datetime import datetime
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import REPO, VENV_BIN, Hub
from spawn import pct, start_stock, stock_hub

from gpulab.catalog import DEFAULT_CATALOG
from gpulab.spawners.docker.spawner import network_gateway

DOCKER_SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "dockerspawner.DockerSpawner"
c.DockerSpawner.image = {image!r}
c.DockerSpawner.cmd = ["jupyterhub-singleuser"]
c.DockerSpawner.use_internal_ip = True
c.DockerSpawner.network_name = "bridge"
c.DockerSpawner.remove = True
c.DockerSpawner.prefix = "stockbench"
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 30
"""

# Logged by jupyter_server once its HTTP server is bound and serving.
RUNNING_LINE = re.compile(r"^(\S+) .*Jupyter Server \S+ is running at", re.M)


def docker_time(stamp: str) -> float:
    """Docker's RFC 3339 nanosecond timestamp -> epoch seconds."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


def test_image() -> str:
    out = subprocess.run(
        [str(REPO / "images" / "build-test-image.sh")], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def write_catalog(path: Path, image: str) -> Path:
    text = DEFAULT_CATALOG.read_text()
    text, n = re.subn(
        r'(\[images\.base\](?:(?!\n\[).)*?docker_image = )"[^"]*"',
        rf'\1"{image}"',
        text,
        flags=re.DOTALL,
    )
    assert n == 1
    path.write_text(text)
    return path


def stock_docker_hub(base: Path, image: str) -> Hub:
    return stock_hub(
        base, DOCKER_SPAWNER_CONFIG.format(image=image), hub_ip=network_gateway("bridge")
    )


def container_for(client, user: str):
    found = [c for c in client.containers.list() if c.name.endswith(f"-{user}")]
    assert len(found) == 1, [c.name for c in found]
    return found[0]


def timed_spawn(hub: Hub, client, options: dict | None) -> dict[str, float]:
    name = f"b{uuid.uuid4().hex[:8]}"
    hub.create_user(name)
    t0_wall, t0 = time.time(), time.perf_counter()
    r = hub.spawn(name, options)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn failed: {r.status_code} {r.text}")
    if r.status_code == 202:
        hub.wait_ready(name, timeout=120)
    total = time.perf_counter() - t0
    t_ready = t0_wall + total
    c = container_for(client, name)
    started = docker_time(c.attrs["State"]["StartedAt"])
    logs = c.logs(timestamps=True).decode(errors="replace")
    m = RUNNING_LINE.search(logs)
    listening = docker_time(m.group(1)) if m else float("nan")
    hub.stop_server(name)
    return {
        "total": total,
        "container_start": started - t0_wall,
        "python_startup": listening - started,
        "readiness_detection": t_ready - listening,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=20, help="spawns per hub (>= 20 for p95)")
    parser.add_argument("--gpu", default="a100-80g", help="GPU type for gpulab spawns, or none")
    parser.add_argument("--warmup", type=int, default=2, help="untimed spawns per hub first")
    args = parser.parse_args()

    client = docker.from_env(version="auto")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"Docker {client.version()['Version']}"
    )
    image = test_image()
    print(f"image: {image} (preloaded)")
    base = Path(tempfile.mkdtemp(prefix="gpulab-docker-bench-"))
    catalog = write_catalog(base / "catalog.toml", image)
    stock = stock_docker_hub(base, image)
    gpulab = Hub(
        base / "gpulab" / "data",
        simulate="A100-80G:2,RTX-4090:2",
        cli=[str(VENV_BIN / "gpulab"), "up", "--spawner", "docker", "--catalog", str(catalog)],
    )
    options = {"gpu": args.gpu}
    results: dict[str, list[dict[str, float]]] = {"stock": [], "gpulab": []}
    try:
        print(
            "starting stock JupyterHub (DockerSpawner) and gpulab (gpulab-docker) ...", flush=True
        )
        start_stock(stock)
        gpulab.start()
        for i in range(args.warmup):
            timed_spawn(stock, client, None)
            timed_spawn(gpulab, client, options)
            print(f"  warm-up {i + 1}/{args.warmup}", flush=True)
        for i in range(args.spawns):
            results["stock"].append(timed_spawn(stock, client, None))
            results["gpulab"].append(timed_spawn(gpulab, client, options))
            print(
                f"  spawn {i + 1:2d}/{args.spawns}: stock {results['stock'][-1]['total']:.2f}s  "
                f"gpulab {results['gpulab'][-1]['total']:.2f}s",
                flush=True,
            )
    finally:
        stock.stop()
        gpulab.stop()
        for c in client.containers.list(all=True):
            if c.name.startswith(("stockbench-", "gpulab-b")):
                c.remove(force=True)
        for v in client.volumes.list():
            if re.fullmatch(r"gpulab-home-b[0-9a-f]{8}", v.name):
                v.remove(force=True)

    totals = {k: [r["total"] for r in v] for k, v in results.items()}
    s50, s95 = pct(totals["stock"], 0.5), pct(totals["stock"], 0.95)
    g50, g95 = pct(totals["gpulab"], 0.5), pct(totals["gpulab"], 0.95)
    print()
    print(
        f"Docker POST-to-ready over {args.spawns} spawns each (gpulab: gpu={args.gpu}, simulated)"
    )
    print(f"  {'':8s} {'p50':>7s} {'p95':>7s}")
    print(f"  {'stock':8s} {s50:6.2f}s {s95:6.2f}s")
    print(f"  {'gpulab':8s} {g50:6.2f}s {g95:6.2f}s")
    print(f"  ratio gpulab/stock: p50 {g50 / s50:.2f}, p95 {g95 / s95:.2f}")
    print("\nbreakdown (medians, seconds):")
    phases = ("container_start", "python_startup", "readiness_detection")
    print(f"  {'':8s} " + " ".join(f"{p:>20s}" for p in phases))
    for kind, rows in results.items():
        cells = [statistics.median(r[p] for r in rows) for p in phases]
        print(f"  {kind:8s} " + " ".join(f"{v:20.2f}" for v in cells))
    print(
        "  container_start: POST sent -> container running (hub, allocation, docker create/start)\n"
        "  python_startup: container running -> server logs it is running (imports, init)\n"
        "  readiness_detection: server running -> hub answers ready (polling, proxy route)"
    )
    print(f"\nlogs: {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
