"""Swarm spawn benchmark: POST-to-ready for gpulab-swarm vs gpulab-docker, in one run.

Starts a real two-node Docker Swarm on this machine (the tests' ``swarm_cluster``: two extra
Docker Engines, each in its own network namespace, simulated GPUs advertised as generic
resources, tests/swarm_helpers.py) and two hubs side by side, on the same preloaded image (the
registry-free test image, images/build-test-image.sh):

- gpulab-swarm: ``gpulab up --spawner swarm`` on that swarm: each server a Swarm service on the
  node the allocator picked, its task's cards read back, the port published on the node;
- gpulab-docker: ``gpulab up --spawner docker`` on this machine's own Docker Engine, with the
  same catalog and simulated cards.

Spawns alternate between the two (drift on a shared machine hits both alike), each timed from
sending ``POST /hub/api/users/NAME/server`` to the hub reporting the server ready, then stopped.
Prints p50/p95, the ratio, and the Swarm spawner's own phases (service placed, task started,
server listening). Needs root (network namespaces, engines), like the tests.

    .venv/bin/python benchmarks/swarm_spawn.py [--spawns 20] [--gpu a100-80g]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from docker_helpers import docker_hub_settings
from docker_spawn import test_image, write_catalog
from harness import Hub
from spawn import gpulab_phases, pct, time_spawn
from swarm_helpers import remove_hub_services, start_cluster, swarm_hub_settings, teardown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=20, help="spawns per hub (>= 20 for p95)")
    parser.add_argument("--gpu", default="a100-80g", help="GPU type for the spawns, or none")
    parser.add_argument("--warmup", type=int, default=1, help="untimed spawns per hub first")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("swarm_spawn.py: needs root (network namespaces, extra Docker Engines)")
        return 2

    client = docker.from_env(version="auto")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"Docker {client.version()['Version']}"
    )
    image = test_image()
    print(f"image: {image} (preloaded on every node)")
    base = Path(tempfile.mkdtemp(prefix="gpulab-swarm-bench-"))
    catalog = write_catalog(base / "catalog.toml", image)
    print("starting a 2-node swarm (2 simulated A100-80G each) ...", flush=True)
    cluster = start_cluster([("a100-80g", 2), ("a100-80g", 2)], image, base)
    hubs: dict[str, Hub] = {}
    results: dict[str, list[float]] = {"swarm": [], "docker": []}
    try:
        hubs["swarm"] = Hub(
            base / "swarm" / "data", **swarm_hub_settings(cluster, catalog, shared_homes=None)
        )
        settings = docker_hub_settings(catalog)
        settings["env"] = {}  # the default reporter heartbeat, as in production
        hubs["docker"] = Hub(base / "docker" / "data", **settings)
        hubs["swarm"].extra_env.pop("GPULAB_REPORTER_HEARTBEAT", None)
        print("starting gpulab (gpulab-swarm) and gpulab (gpulab-docker) ...", flush=True)
        for hub in hubs.values():
            hub.start(timeout=120)
        options = {"gpu": args.gpu}
        for i in range(args.warmup):
            for hub in hubs.values():
                time_spawn(hub, options)
            print(f"  warm-up {i + 1}/{args.warmup}", flush=True)
        for i in range(args.spawns):
            for kind, hub in hubs.items():
                results[kind].append(time_spawn(hub, options))
            print(
                f"  spawn {i + 1:2d}/{args.spawns}: swarm {results['swarm'][-1]:.2f}s  "
                f"docker {results['docker'][-1]:.2f}s",
                flush=True,
            )
        swarm_phases = swarm_launch_phases(hubs["swarm"])
    finally:
        for hub in hubs.values():
            hub.stop()
        if "swarm" in hubs:
            remove_hub_services(cluster, hubs["swarm"].data_dir)
        teardown(cluster)
        if "docker" in hubs:
            remove_docker_leftovers(client, hubs["docker"])

    w50, w95 = pct(results["swarm"], 0.5), pct(results["swarm"], 0.95)
    d50, d95 = pct(results["docker"], 0.5), pct(results["docker"], 0.95)
    print()
    print(f"POST-to-ready over {args.spawns} spawns each (gpu={args.gpu}, simulated cards)")
    print(f"  {'':14s} {'p50':>7s} {'p95':>7s}")
    print(f"  {'gpulab-swarm':14s} {w50:6.2f}s {w95:6.2f}s")
    print(f"  {'gpulab-docker':14s} {d50:6.2f}s {d95:6.2f}s")
    print(f"  ratio swarm/docker: p50 {w50 / d50:.2f}, p95 {w95 / d95:.2f}")
    if swarm_phases:
        print("\ngpulab-swarm phases (medians, seconds):")
        for key, value in swarm_phases.items():
            print(f"  {key:28s} {value:6.2f}")
        print(
            "  service_place: create_service -> Swarm placed the task on the chosen node\n"
            "  task_start: assigned -> task running (container created and started on the node)\n"
            "  python_startup_to_listen: task running -> the server accepts connections"
        )
    print(f"\nlogs: {base}")
    return 0


def swarm_launch_phases(hub: Hub) -> dict[str, float]:
    """The Swarm spawner's launch timings from the hub log (``gpulab spawn timing`` lines)."""
    phases = gpulab_phases(hub)
    keys = ("service_place", "task_start", "python_startup_to_listen")
    return {k: phases[k] for k in keys if k in phases}


def remove_docker_leftovers(client, hub: Hub) -> None:
    """What the docker hub's servers left on this machine's engine: their home volumes (and a
    container, should a stop have failed). Only this hub's, by its id label."""
    try:
        hub_id = (hub.data_dir / "hub-id").read_text().strip()
    except OSError:
        return
    mine = {"label": f"org.gpulab.hub-id={hub_id}"}
    for c in client.containers.list(all=True, filters=mine):
        c.remove(force=True)
    for v in client.volumes.list(filters=mine):
        v.remove(force=True)


if __name__ == "__main__":
    sys.exit(main())
