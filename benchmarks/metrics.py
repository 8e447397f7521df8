"""What operators' metrics cost the hub: a /hub/metrics scrape, and the observer and card sampler.

Issue 24 asks that a scrape stay under 50 ms with 1,000 users and 200 allocations, and that the
activity observer and the card sampling cost within 1 % of a core per 100 servers. This runs
the hub's own code in one process, at that size, without 200 real servers (2 cores cannot run
them): the real pool and allocator over a simulated pool of ``--cards`` cards with ``--allocs``
allocations of one card each (made by ``GpuAllocator.allocate``, its ledger on disk), the real
card sampler over them, ``--users`` hub users in memory (what the snapshot walks; the holders'
spawners carry their options), and gpulab's collector registered on prometheus_client's
default registry beside JupyterHub's own metrics (``jupyterhub.metrics``), as in the hub.

- **scrape**: ``generate_latest(REGISTRY)``, the body JupyterHub's MetricsHandler writes, timed
  ``--rounds`` times; the peer is the same registry with gpulab's collector unregistered
  (stock JupyterHub's scrape of the same hub). The HTTP request and the token check around it
  are the same for both and not included. Here JupyterHub's request histograms are empty (no
  requests served), so the stock figure is a floor and gpulab's share looks larger than live.
- **observer**: ``ActivityObserver.tick`` over ``--servers`` running stand-ins whose
  ``sandbox`` and ``observe_activity`` are the local spawner's own (``LocalIsolationMixin``: the
  account looked up as the hub does, once per session; the processes of the server's cgroup,
  each one's /proc stat read once; the CPU counter), each stand-in a shell with sleeping
  children in its own cgroup (benchmarks/observer.py's); root and a writable cgroup tree
  needed for cgroups.
- **sampler**: ``CardSampler.sample`` over every card, CPU figures from the observer's trackers.

CPU is this process's (``time.process_time``: all threads, the observer's reads run in
threads); "% of a core" is CPU per pass over the component's default interval (observer 2 s,
sampler 10 s), per 100 servers. Printed, not asserted.

    sudo .venv/bin/python benchmarks/metrics.py --users 1000 --allocs 200 --servers 100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from observer import p50_p95, start_servers


def setup(tmp: Path) -> None:
    os.environ["GPULAB_DATA_DIR"] = str(tmp)


def make_pool(tmp: Path, cards: int):
    from traitlets.config import Config

    from gpulab.spawners.node.pool import GpuPool

    half = cards // 2
    config = Config()
    config.GpuInventory.simulate_gpus = f"A100-80G:{cards - half},RTX-4090:{half}"
    return GpuPool.instance(config=config, data_dir=str(tmp))


def stand_in_class(tree):
    """The local spawner's isolation (its ``sandbox``, its ``observe_activity``), over the
    benchmark's cgroup tree (``tree``; None: no cgroups) with the allocation id as group name."""
    from gpulab.spawners.local.isolation import LocalIsolationMixin

    class StandIn(LocalIsolationMixin):
        """A running server as the observer sees it: owner, allocation, pid, and the local
        spawner's own sandbox (its account looked up as the hub does) and observation."""

        def __init__(self, pool, owner: str, alloc, pid: int, options) -> None:
            super().__init__()
            self.pool, self.owner, self.allocation, self.pid = pool, owner, alloc, pid
            self.gpulab_options, self.orm_spawner = options, None
            self.user = types.SimpleNamespace(name=owner.partition("/")[0])

        @classmethod
        def node_cgroups(cls):
            return tree

        def _cgroup_name(self, alloc_id: str) -> str:
            return alloc_id

    return StandIn


def users(n: int, holders: dict[str, object]) -> dict[str, object]:
    """``n`` hub users as the snapshot walks them (``app.users``): name and spawners."""
    out: dict[str, object] = {}
    for i in range(n):
        name = f"user{i:04d}"
        spawner = holders.get(f"{name}/")
        spawners = {"": spawner} if spawner is not None else {}
        out[name] = types.SimpleNamespace(name=name, spawners=spawners)
    return out


async def recorded_activity(method: str, path: str, body: dict) -> tuple[int, str]:
    """The hub's API as the observer calls it to record activity (an HTTP call in the hub, at
    most once a minute per server: answered here without one)."""
    return 200, ""


def time_scrape(rounds: int) -> list[tuple[float, float]]:
    """(wall ms, CPU ms) of ``rounds`` scrapes of the default registry."""
    from prometheus_client import REGISTRY, generate_latest

    out = []
    for _ in range(rounds):
        c0, t0 = time.process_time(), time.perf_counter()
        generate_latest(REGISTRY)
        out.append(((time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3))
    return out


async def main_async(args: argparse.Namespace, tmp: Path) -> None:
    import jupyterhub.metrics  # noqa: F401  (JupyterHub's own families on the default registry)
    from prometheus_client import REGISTRY

    from gpulab.hub_config.billing.observer import ActivityObserver
    from gpulab.hub_config.metrics import collector as collectors
    from gpulab.hub_config.metrics.sampler import CardSampler, cpu_by_card
    from gpulab.spawners.local.cgroup import Cgroups
    from gpulab.spawners.local.sandbox import Sandbox

    pool = make_pool(tmp, args.cards)
    allocator = pool.allocator
    # The holders: users 0..allocs-1 (a quarter of them through a course), one card each.
    holders: dict[str, object] = {}
    allocs = []
    for i in range(args.allocs):
        owner = f"user{i:04d}/"
        gpu_type = "a100-80g" if i % 2 == 0 else "rtx-4090"
        allocs.append((owner, allocator.allocate(owner, gpu_type, 1)))
    tree = Cgroups.detect(parent="gpulab-bench")
    ids = [a.alloc_id for _, a in allocs[: args.servers]]
    servers = start_servers(len(ids), args.procs, tree, ids)
    stand_in = stand_in_class(tree)
    try:
        for i, (owner, alloc) in enumerate(allocs):
            options = types.SimpleNamespace(course="ml101" if i % 4 == 0 else None, max_price=None)
            pid = servers[i][0].pid if i < len(servers) else 0
            holders[owner] = stand_in(pool, owner, alloc, pid, options)
        app = types.SimpleNamespace(config=None, users=users(args.users, holders))

        # The observer over the running stand-ins (nothing reported: no billing here).
        observer = ActivityObserver.instance(hub_api=recorded_activity, notices=None)
        running = [s for s in holders.values() if s.pid]
        await observer.tick(running)  # trackers made, first samples taken
        cpu_obs = []
        for _ in range(args.rounds):
            c0 = time.process_time()
            await observer.tick(running)
            cpu_obs.append(time.process_time() - c0)

        # The card sampler over every card, simulated utilisation from the observer's trackers.
        sampler = CardSampler.instance()
        sampler.pool = pool
        sampler.cpu_source = lambda: cpu_by_card(pool, observer.trackers)
        await sampler.sample()
        cpu_smp = []
        for _ in range(args.rounds):
            c0 = time.process_time()
            await sampler.sample()
            cpu_smp.append(time.process_time() - c0)

        # Scrapes: JupyterHub's registry alone (stock), then with gpulab's collector.
        stock = time_scrape(args.rounds)
        collector = collectors.install(app)
        body = __import__("prometheus_client").generate_latest(REGISTRY)
        gpulab = time_scrape(args.rounds)
        REGISTRY.unregister(collector)
        stock_after = time_scrape(args.rounds)
    finally:
        for proc, group, alloc_id in servers:
            Sandbox(alloc_id, cgroup=group).kill_all(proc.pid)
            if group is not None:
                group.remove()
            proc.wait()

    n = len(running)
    cg = "cgroups" if tree is not None else "no cgroups (not root?): process trees"
    held = sum(1 for line in body.decode().splitlines() if line.startswith("gpulab_pool_cards{"))
    print(
        f"hub: {args.users} users, {args.allocs} allocations of {args.cards} simulated cards, "
        f"{len(body) / 1024:.0f} KiB per scrape ({held} gpulab_pool_cards series)"
    )
    for label, values in (
        ("stock JupyterHub scrape", stock + stock_after),
        ("gpulab scrape", gpulab),
    ):
        p50, p95 = p50_p95([w for w, _ in values])
        cpu50, cpu95 = p50_p95([c for _, c in values])
        print(
            f"  {label:24s} p50 {p50:7.2f} ms   p95 {p95:7.2f} ms   "
            f"(CPU p50 {cpu50:.2f} ms, p95 {cpu95:.2f} ms; {len(values)} scrapes)"
        )
    interval_obs = observer.interval
    interval_smp = sampler.interval
    per_obs, p95_obs = p50_p95(cpu_obs)
    per_smp, p95_smp = p50_p95(cpu_smp)
    core_obs = per_obs / interval_obs * 100 * 100 / n
    core_smp = per_smp / interval_smp * 100 * 100 / n
    print(f"observer + sampler, {n} running servers ({cg}, {args.procs} processes each):")
    print(
        f"  observer pass  CPU p50 {per_obs * 1e3:6.2f} ms, p95 {p95_obs * 1e3:6.2f} ms every "
        f"{interval_obs:g} s -> {core_obs:.2f} % of a core per 100 servers (p50)"
    )
    print(
        f"  sampler pass   CPU p50 {per_smp * 1e3:6.2f} ms, p95 {p95_smp * 1e3:6.2f} ms every "
        f"{interval_smp:g} s -> {core_smp:.2f} % of a core per 100 servers ({args.cards} cards)"
    )
    print(f"  together       {core_obs + core_smp:.2f} % of a core per 100 servers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--allocs", type=int, default=200, help="allocations of one card")
    parser.add_argument("--cards", type=int, default=200, help="simulated cards (>= allocs)")
    parser.add_argument("--servers", type=int, default=100, help="running stand-in servers")
    parser.add_argument("--procs", type=int, default=5, help="processes per server")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    if args.cards < args.allocs or args.servers > args.allocs:
        parser.error("need --cards >= --allocs >= --servers")
    with tempfile.TemporaryDirectory(prefix="gpulab-bench-metrics-") as tmp:
        setup(Path(tmp))
        asyncio.run(main_async(args, Path(tmp)))


if __name__ == "__main__":
    main()
