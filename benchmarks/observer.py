"""What watching servers costs the hub: CPU per server per minute of the activity observer.

Each sample of a server (``GpuLocalSpawner.observe_activity``) lists the processes of its sandbox
and reads their start times from /proc. This benchmark starts ``--servers`` stand-in servers of
``--procs`` processes each (a shell and its sleeping children, like a server with kernels), puts
each in its own cgroup as the hub does (when run as root on a writable cgroup tree), and times
the sampling the observer does, in CPU time of this process:

- ``cgroup``: the server's cgroup (the embedded default under root);
- ``account``: every process of a Unix account (root without cgroups; here the benchmark's own
  uid, so every process of the machine is looked at: the worst case);
- ``tree``: the server's process tree plus processes carrying its allocation id (a hub that is
  not root: reads every process's environment).

Printed: CPU milliseconds per sample (p50/p95 over all samples) and per server per minute at the
observer's default interval (2 s). Stock JupyterHub watches nothing but the server's HTTP
activity, so there is no stock figure to divide by; the spawn benchmark (benchmarks/spawn.py)
carries the observer's effect on spawns, against stock JupyterHub.

    sudo .venv/bin/python benchmarks/observer.py --servers 50 --procs 5 --rounds 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import uuid

from gpulab.spawners.local.accounts import Account
from gpulab.spawners.local.cgroup import Cgroups, Limits
from gpulab.spawners.local.sandbox import Sandbox

INTERVAL = 2.0  # ActivityObserver.interval's default


def p50_p95(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return statistics.median(values), cuts[94]


def start_servers(n: int, procs: int, tree: Cgroups | None, alloc_ids: list[str]):
    script = " ".join(["sleep 600 &"] * (procs - 1)) + " wait"
    servers = []
    for alloc_id in alloc_ids[:n]:
        group = None
        if tree is not None:
            group = tree.group(alloc_id)
            group.create(Limits(pids=64))
        env = {**os.environ, "GPULAB_ALLOCATION_ID": alloc_id}
        proc = subprocess.Popen(
            ["bash", "-c", script],
            env=env,
            preexec_fn=(lambda g=group: g.join(0)) if group is not None else None,
            start_new_session=True,
        )
        servers.append((proc, group, alloc_id))
    return servers


def measure(label: str, sandboxes: list[tuple[Sandbox, int]], rounds: int) -> None:
    samples = []
    found = 0
    for _ in range(rounds):
        for sandbox, pid in sandboxes:
            t0 = time.thread_time()
            found = len(sandbox.others(pid))
            samples.append((time.thread_time() - t0) * 1e3)
    p50, p95 = p50_p95(samples)
    per_minute = p50 * 60 / INTERVAL
    print(
        f"{label:8s} {len(sandboxes):4d} servers, {found} other processes each: "
        f"per sample p50 {p50:.3f} ms, p95 {p95:.3f} ms CPU; "
        f"{per_minute:.1f} ms CPU per server per minute at {INTERVAL:g} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--procs", type=int, default=5, help="processes per server")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    tree = Cgroups.detect(parent="gpulab-bench")
    ids = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(args.servers)]
    servers = start_servers(args.servers, args.procs, tree, ids)
    time.sleep(0.5)  # the shells have started their children
    try:
        me = Account(name="bench", uid=os.getuid(), gid=os.getgid(), home="/")
        if tree is not None:
            measure("cgroup", [(Sandbox(a, cgroup=g), p.pid) for p, g, a in servers], args.rounds)
        else:
            print("cgroup   (needs root and a writable cgroup tree: skipped)")
        measure(
            "account", [(Sandbox(a, account=me), p.pid) for p, _, a in servers[:5]], args.rounds
        )
        measure("tree", [(Sandbox(a), p.pid) for p, _, a in servers[:10]], args.rounds)
    finally:
        for proc, group, alloc_id in servers:
            sandbox = Sandbox(alloc_id, cgroup=group)
            sandbox.kill_all(proc.pid)
            if group is not None:
                group.remove()
            proc.wait()


if __name__ == "__main__":
    main()
