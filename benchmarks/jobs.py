"""Jobs benchmark: submit-to-running for training jobs, and the time to resume after a
preemption, against the reference cloud's 4 minutes (issue 26).

One real hub (``gpulab up``, local spawner, simulated RTX 4090s, the spot market with a short
warning period) and, in the same run, the strongest peers on this machine:

- **job**: ``POST /hub/api/gpulab/users/NAME/jobs`` (1 card, ``sleep``) until the job's state
  is ``running`` (the scheduler's pass, the job server's start as the user's account in its
  cgroup, the runner answering), as the user polls it every 50 ms;
- **named server**: a plain named-server spawn through JupyterHub's REST API
  (``POST /hub/api/users/NAME/servers/bench``, 1 card) until ready: what a job would cost without
  the scheduler, with JupyterLab instead of the runner;
- **process**: a direct ``subprocess`` start of ``bash -lc`` (no hub, no account, no cgroup):
  the floor, what a bare ``sbatch``-less script start costs here.

The three alternate (drift on a shared machine hits all alike). Then **resume**: a spot job
running tests/job_scripts/train.py is preempted (its price pinned above the bid: SIGUSR1, the
script checkpoints, the stop at the deadline, the requeue), and the price is pinned back within
the bid: from that moment (a card within the bid is free) to the first ``step`` line of the new
attempt in the job's log (training again, from ``GPULAB_RESUME``), against the reference's 240 s.
The hub's own record of it (``resume_seconds`` of the attempt) is printed beside it.

``--swarm`` adds 2-node x 2-card gangs on a real two-node test swarm (engines in network
namespaces, tests/swarm_helpers.py; root, Docker, the test image).

    .venv/bin/python benchmarks/jobs.py [--runs 20] [--resumes 5] [--swarm]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import REPO, Hub, passable_for_accounts, wait_for

REFERENCE_RESUME = 240.0  # the reference cloud's resume after a failure, "cut from 40 minutes to 4"
WARNING = 5  # the spot market's warning period for this run (the default is 300 s)
POLL = 0.05
SCRIPT = REPO / "tests" / "job_scripts" / "train.py"
STEP_RE = re.compile(rb"^step \d+ loss ", re.M)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class User:
    """A user of the hub with their own token (what the CLI or JupyterLab panel would use)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.name = hub.create_user(f"b{uuid.uuid4().hex[:8]}")
        r = hub.api("POST", f"/users/{self.name}/tokens", json={"expires_in": 7200})
        r.raise_for_status()
        self.token = r.json()["token"]

    def api(self, method: str, path: str, **kw):
        return self.hub.api(method, f"/gpulab/users/{self.name}/jobs{path}", token=self.token, **kw)

    def job(self, job_id: int) -> dict:
        r = self.api("GET", f"/{job_id}")
        r.raise_for_status()
        return r.json()

    def log(self, job_id: int) -> bytes:
        r = self.api("GET", f"/{job_id}/log")
        r.raise_for_status()
        return r.content

    def cancel(self, job_id: int, gpu: str, cards: int) -> None:
        self.api("DELETE", f"/{job_id}")
        wait_for(lambda: self.job(job_id)["state"] == "cancelled", 120, 0.2, "the cancel")
        wait_for(lambda: self.hub.free(gpu) >= cards, 120, 0.2, "the cards to be free")


def time_job(user: User, spec: dict) -> float:
    """Submit ``spec``; seconds until the job is running; then cancel it."""
    t0 = time.perf_counter()
    r = user.api("POST", "", json=spec)
    if r.status_code != 201:
        raise RuntimeError(f"submit failed: {r.status_code} {r.text}")
    job_id = r.json()["id"]

    def running() -> bool:
        state = user.job(job_id)["state"]
        if state in ("failed", "cancelled", "succeeded"):
            raise RuntimeError(f"job {job_id} ended {state}: {user.job(job_id)['reason']}")
        return state == "running"

    wait_for(running, 300, POLL, "the job to run")
    elapsed = time.perf_counter() - t0
    user.cancel(job_id, spec["gpu"], spec["gpus"] * spec.get("nodes", 1))
    return elapsed


def time_named_server(hub: Hub, user: User, gpu: str) -> float:
    """A plain named-server spawn (1 card) through JupyterHub's REST API, until ready."""
    path = f"/users/{user.name}/servers/bench"
    t0 = time.perf_counter()
    r = hub.api("POST", path, json={"gpu": gpu, "gpus": 1})
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn failed: {r.status_code} {r.text}")

    def ready() -> bool:
        s = hub.user(user.name)["servers"].get("bench")
        return bool(s and s["ready"])

    wait_for(ready, 120, POLL, "the named server")
    elapsed = time.perf_counter() - t0
    hub.api("DELETE", path)
    wait_for(lambda: "bench" not in hub.user(user.name)["servers"], 120, 0.2, "the stop")
    return elapsed


def time_process() -> float:
    """A direct subprocess start of the same command: until it printed its first line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        ["bash", "-lc", "echo running; exec sleep 600"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.kill()
    proc.wait()
    return elapsed


def pin(hub: Hub, slug: str, price: str | None) -> None:
    hub.api("PUT", f"/gpulab/spot/prices/{slug}", json={"price": price}).raise_for_status()


def time_resumes(hub: Hub, gpu: str, count: int) -> tuple[list[float], list[float]]:
    """``count`` preemptions of one spot training job: (card free -> training again as the user
    sees it in the log, the hub's own resume_seconds of each new attempt)."""
    user = User(hub)
    pin(hub, gpu, "0.30")
    r = user.api(
        "POST",
        "",
        json={
            "command": f"{sys.executable} {SCRIPT} --steps 1000000 --ckpt-every 0 --sleep 0.1",
            "name": "resume benchmark",
            "gpu": gpu,
            "gpus": 1,
            "pricing": "spot",
            "max_price": "0.40",
            "checkpoint_interval": 0,
            "max_attempts": count + 1,
        },
    )
    if r.status_code != 201:
        raise RuntimeError(f"submit failed: {r.status_code} {r.text}")
    job_id = r.json()["id"]
    seen, recorded = [], []
    try:
        offset = 0
        for n in range(1, count + 1):
            wait_for(
                lambda o=offset: len(STEP_RE.findall(user.log(job_id)[o:])) >= 5,
                300,
                0.2,
                f"attempt {n} to train",
            )
            pin(hub, gpu, "0.60")  # above the bid: warning, checkpoint, stop, requeue
            wait_for(
                lambda n=n: (
                    (j := user.job(job_id))["state"] == "queued" and len(j["attempts"]) == n
                ),
                WARNING + 120,
                0.1,
                f"preemption {n}",
            )
            offset = len(user.log(job_id))
            t_free = time.perf_counter()
            pin(hub, gpu, "0.30")  # a card within the bid is free from now
            wait_for(
                lambda o=offset: STEP_RE.search(user.log(job_id)[o:]) is not None,
                300,
                POLL,
                "training again",
            )
            seen.append(time.perf_counter() - t_free)
            # The hub marks it running on its next pass (the command may print first).
            attempt = wait_for(
                lambda: (a := user.job(job_id)["attempts"][-1])["running_at"] and a,
                60,
                0.1,
                "the hub to see it running",
            )
            recorded.append(attempt["resume_seconds"])
            print(
                f"  resume {n}/{count}: {seen[-1]:.2f}s to the first step "
                f"(hub: card free -> running {attempt['resume_seconds']:.2f}s; "
                f"lost work {user.job(job_id)['attempts'][-2]['lost_seconds']}s)",
                flush=True,
            )
    finally:
        pin(hub, gpu, None)
        user.api("DELETE", f"/{job_id}")
    return seen, [x for x in recorded if x is not None]


def swarm_gangs(runs: int, base: Path) -> list[float]:
    """2-node x 2-card gangs on a two-node test swarm: submit -> running."""
    from docker_spawn import test_image, write_catalog
    from swarm_helpers import remove_hub_services, start_cluster, swarm_hub_settings, teardown

    image = test_image()
    base.mkdir(parents=True, exist_ok=True)
    catalog = write_catalog(base / "catalog.toml", image)
    print("starting a 2-node swarm (2 simulated A100-80G each) ...", flush=True)
    cluster = start_cluster([("a100-80g", 2), ("a100-80g", 2)], image, base)
    hub = None
    times: list[float] = []
    try:
        # A gang needs homes every node shares (its checkpoints): a host folder stands in.
        homes = base / "homes"
        homes.mkdir(mode=0o711)
        passable_for_accounts(homes)
        hub = Hub(base / "swarm" / "data", **swarm_hub_settings(cluster, catalog, homes))
        hub.start(timeout=180)
        user = User(hub)
        spec = {"command": "sleep 600", "gpu": "a100-80g", "gpus": 2, "nodes": 2}
        for i in range(runs):
            times.append(time_job(user, spec))
            print(f"  gang {i + 1:2d}/{runs}: {times[-1]:.2f}s", flush=True)
    finally:
        if hub is not None:
            hub.stop()
            remove_hub_services(cluster, hub.data_dir)
        teardown(cluster)
    return times


def row(label: str, values: list[float]) -> str:
    if not values:
        return f"  {label:34s} {'-':>7s} {'-':>7s}"
    return f"  {label:34s} {pct(values, 0.5):6.2f}s {pct(values, 0.95):6.2f}s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="starts of each kind (>= 20 for p95)")
    parser.add_argument("--resumes", type=int, default=5, help="preemptions to resume from")
    parser.add_argument("--warmup", type=int, default=1, help="untimed starts of each kind first")
    parser.add_argument("--swarm", action="store_true", help="also 2x2-card gangs on a swarm")
    parser.add_argument("--swarm-only", action="store_true", help="only the swarm's gangs")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("jobs.py: needs root (job servers run as users' own accounts)")
        return 2
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    base = Path(tempfile.mkdtemp(prefix="gpulab-jobs-bench-"))
    if args.swarm_only:
        gangs = swarm_gangs(args.runs, base / "swarm")
        print(f"\nsubmit-to-running over {args.runs} gangs (simulated cards)")
        print(f"  {'':34s} {'p50':>7s} {'p95':>7s}")
        print(row("job, 2 nodes x 2 cards (swarm)", gangs))
        return 0
    gpu = "rtx-4090"
    hub = Hub(
        base / "hub" / "data",
        simulate="RTX-4090:2",
        extra_args=[
            "--JupyterHub.allow_named_servers=True",
            f"--SpotMarket.warning_seconds={WARNING}",
        ],
    )
    results: dict[str, list[float]] = {"job": [], "named": [], "process": []}
    try:
        print("starting gpulab ...", flush=True)
        hub.start(timeout=180)
        user = User(hub)
        job = {"command": "echo running; sleep 600", "gpu": gpu, "gpus": 1}
        for _ in range(args.warmup):
            time_job(user, job)
            time_named_server(hub, user, gpu)
        for i in range(args.runs):
            results["job"].append(time_job(user, job))
            results["named"].append(time_named_server(hub, user, gpu))
            results["process"].append(time_process())
            print(
                f"  start {i + 1:2d}/{args.runs}: job {results['job'][-1]:.2f}s  "
                f"named server {results['named'][-1]:.2f}s  "
                f"process {results['process'][-1] * 1000:.1f}ms",
                flush=True,
            )
        print(f"resume after preemption ({args.resumes} times) ...", flush=True)
        seen, recorded = time_resumes(hub, gpu, args.resumes)
    finally:
        hub.stop()
    gangs = swarm_gangs(args.runs, base / "swarm") if args.swarm else []

    print()
    print(f"submit-to-running over {args.runs} starts each (simulated cards)")
    print(f"  {'':34s} {'p50':>7s} {'p95':>7s}")
    print(row("job, 1 card (local)", results["job"]))
    print(row("named server via REST, 1 card", results["named"]))
    print(row("direct subprocess (no hub)", results["process"]))
    if args.swarm:
        print(row("job, 2 nodes x 2 cards (swarm)", gangs))
    print()
    print(f"resume after a preemption over {len(seen)} preemptions (warning {WARNING} s)")
    print(row("card free -> first training step", seen))
    print(row("hub's record: card free -> running", recorded))
    if seen:
        print(
            f"  reference cloud: {REFERENCE_RESUME:.0f}s; gpulab p95 is "
            f"{REFERENCE_RESUME / pct(seen, 0.95):.0f}x faster"
        )
    print(f"\nlogs: {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
