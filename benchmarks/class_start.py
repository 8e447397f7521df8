"""The "class starts" benchmark: a booked lab session vs students clicking Start on stock JupyterHub.

gpulab: a course with ``--students`` students, a booking of one (simulated) card each for a window
opening ``--lead`` seconds later; the hub starts their servers before the window. When it opens,
every student "clicks" at once: opens ``/user/NAME/lab`` with their token until JupyterLab's page
answers (HTML 200). Stock JupyterHub (``SimpleLocalProcessSpawner``, stock JupyterLab)
has nothing to start ahead: the clicks start the servers (``POST .../server``, the home page's
Start), so click -> JupyterLab includes the spawn. Both runs on this machine, one after the other; printed: time until all servers are
ready, click -> JupyterLab p50/p95 and the ratio.

    .venv/bin/python benchmarks/class_start.py [--students 40] [--lead 120]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import Hub, wait_for
from spawn import pct, start_stock, stock_hub


def token_for(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 7200})
    r.raise_for_status()
    return r.json()["token"]


def click(hub: Hub, name: str, token: str, start: bool) -> float:
    """Seconds from the student's click to JupyterLab's page (HTML 200). The click opens their
    server (``/user/NAME/lab``); where nothing runs yet (stock JupyterHub) it first starts it,
    as the home page's Start button does."""
    t0 = time.perf_counter()
    session = requests.Session()
    session.headers["Authorization"] = f"token {token}"
    if start:
        r = session.post(f"{hub.url}/hub/api/users/{name}/server", json={}, timeout=300)
        if r.status_code not in (201, 202):
            raise RuntimeError(f"{name}: start refused: {r.status_code} {r.text}")
    deadline = t0 + 600
    while time.perf_counter() < deadline:
        r = session.get(f"{hub.url}/user/{name}/lab", timeout=300, allow_redirects=False)
        if r.status_code == 200 and "jupyter-config-data" in r.text:
            return time.perf_counter() - t0
        time.sleep(0.1)  # still starting: the hub answers 424 (not running yet) meanwhile
    raise RuntimeError(
        f"{name}: no JupyterLab after 600 s (last: {r.status_code} {r.url} "
        f"-> {r.headers.get('Location')}: {r.text[:200]!r})"
    )


def clicks(hub: Hub, names: list[str], tokens: dict[str, str], start: bool) -> list[float]:
    """Every student's click -> JupyterLab time; a student who never got JupyterLab counts as
    ``inf`` (and is reported)."""

    def one(name: str) -> float:
        try:
            return click(hub, name, tokens[name], start)
        except Exception as e:
            print(f"  {name}: {e}", flush=True)
            return float("inf")

    with ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(one, names))


def all_ready(hub: Hub, names: list[str]) -> bool:
    r = hub.api("GET", "/users", params={"state": "ready"})
    ready = {u["name"] for u in r.json()}
    return set(names) <= ready


def run_gpulab(base: Path, students: int, lead: float) -> dict[str, float]:
    hub = Hub(
        base / "gpulab",
        simulate=f"RTX-4090:{students}",
        extra_args=[f"--BookingKeeper.prestart_seconds={lead - 10}"],
    )
    hub.start(timeout=120)
    try:
        names = [f"st{i:03d}" for i in range(students)]
        r = hub.api("POST", "/gpulab/courses", json={"name": "bench101", "teachers": ["prof"]})
        r.raise_for_status()
        csv = "username,role\n" + "".join(f"{n},student\n" for n in names)
        r = hub.api(
            "POST",
            "/gpulab/courses/bench101/roster",
            data=csv.encode(),
            headers={"Content-Type": "text/csv"},
        )
        r.raise_for_status()
        tokens = {n: token_for(hub, n) for n in names}
        start = time.time() + lead
        body = {
            "gpu_type": "rtx-4090",
            "cards": students,
            "start": datetime.fromtimestamp(start, UTC).isoformat(),
            "minutes": 30,
        }
        r = hub.api("POST", "/gpulab/courses/bench101/bookings", json=body)
        r.raise_for_status()
        use_from = datetime.fromisoformat(r.json()["servers_from"].replace("Z", "+00:00"))
        print(f"gpulab: booked {students} cards; servers start at {use_from:%H:%M:%S}", flush=True)
        wait_for(lambda: all_ready(hub, names), lead + 300, 0.5, "all students' servers")
        ready_after = time.time() - use_from.timestamp()
        before_window = start - time.time()
        print(
            f"gpulab: all {students} ready {ready_after:.1f} s after the hub began starting them, "
            f"{before_window:.1f} s before the window opens",
            flush=True,
        )
        wait_for(lambda: time.time() >= start, lead + 60, 0.2, "the window")
        times = clicks(hub, names, tokens, start=False)
        return {"ready_s": ready_after, "before_window_s": before_window, "clicks": times}
    finally:
        hub.stop()


def run_stock(base: Path, students: int) -> dict[str, float]:
    hub = stock_hub(base)
    # JupyterHub's default start_timeout (60 s) fails servers that 40 starts at once on 2 cores
    # cannot bring up in time; give them every chance (a failure is still counted below).
    with open(hub.data_dir / "jupyterhub_config.py", "a") as f:
        f.write("\nc.Spawner.start_timeout = 600\n")
    start_stock(hub)
    try:
        names = [f"st{i:03d}" for i in range(students)]
        for n in names:
            hub.create_user(n)
        tokens = {n: token_for(hub, n) for n in names}
        t0 = time.time()
        times = clicks(hub, names, tokens, start=True)
        ready_s = time.time() - t0
        return {"ready_s": ready_s, "before_window_s": 0.0, "clicks": times}
    finally:
        for n in [f"st{i:03d}" for i in range(students)]:
            hub.api("DELETE", f"/users/{n}/server")
        hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--lead", type=float, default=120.0, help="seconds until the window")
    args = parser.parse_args()
    print(
        f"class start: {args.students} students; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; GPUs simulated",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gpulab-class-") as tmp:
        base = Path(tmp)
        g = run_gpulab(base, args.students, args.lead)
        s = run_stock(base, args.students)
    print()
    print(f"{'':28}{'gpulab (booked)':>18}{'stock JupyterHub':>18}{'ratio':>8}")
    print(
        f"{'all servers ready (s)':28}{g['ready_s']:>18.1f}{s['ready_s']:>18.1f}"
        f"{g['ready_s'] / s['ready_s']:>8.2f}"
    )
    for label, q in (("click -> JupyterLab p50 (s)", 0.5), ("click -> JupyterLab p95 (s)", 0.95)):
        a, b = pct(g["clicks"], q), pct(s["clicks"], q)
        print(f"{label:28}{a:>18.2f}{b:>18.2f}{a / b:>8.2f}")
    failed = [sum(1 for t in r["clicks"] if t == float("inf")) for r in (g, s)]
    print(f"{'students without JupyterLab':28}{failed[0]:>18}{failed[1]:>18}")
    print(
        "gpulab's servers were started by the booking, before the window; stock JupyterHub's by "
        "the students' clicks (its 'all ready' is from the first click)."
    )


if __name__ == "__main__":
    main()
