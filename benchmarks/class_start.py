"""The "class starts" benchmark: a booked lab session vs students clicking Start on stock JupyterHub.

gpulab: a course with ``--students`` students, a booking of one (simulated) card each for a window
opening ``--lead`` seconds later; the hub starts their servers before the window. When it opens,
every student "clicks" at once: opens ``/user/NAME/lab`` on their own origin (``NAME.localhost``)
with their token until JupyterLab's page answers (HTML 200). A gpulab side that fails (the booking
refused, servers never ready) is reported with the hub's reasons, and stock is measured all the
same. Stock JupyterHub (``SimpleLocalProcessSpawner``, stock JupyterLab)
has nothing to start ahead: the clicks start the servers (``POST .../server``, the home page's
Start), so click -> JupyterLab includes the spawn; each student then waits as their browser does
on the spawn-pending page, on the hub's progress stream (no polling), and opens JupyterLab once it
says ready. Stock's ``start_timeout`` and ``http_timeout`` are raised to 600 s: with the defaults
(60 s and 30 s) stock gives up on most of a class of 40 starting at once on 2 cores (its log:
"... never showed up at ... after 30 seconds. Giving up."). A failed spawn is reported with the
hub's own reason. Both runs on this machine, one after the other; printed: time until all servers
are ready, click -> JupyterLab p50/p95 and the ratio. The Unix accounts gpulab made for the
students (a root hub) are removed afterwards.

    .venv/bin/python benchmarks/class_start.py [--students 40] [--lead 120]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import Hub, resolve_localhost_names, wait_for
from spawn import pct, start_stock, stock_hub

from gpulab.spawners.local.accounts import account_name
from gpulab.spawners.local.accounts import lookup as accounts_lookup


def token_for(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 7200})
    r.raise_for_status()
    return r.json()["token"]


CLICK_TIMEOUT = 600  # seconds a student waits for JupyterLab before counting as failed


def progress(session: requests.Session, hub: Hub, name: str, deadline: float) -> dict:
    """The last event of the hub's spawn progress stream for ``name``'s server (``ready`` or
    ``failed``), as JupyterHub's spawn-pending page follows it in a student's browser: one
    long-lived request, no polling. ``{}`` when there is no stream (nothing pending or running)."""
    left = max(1.0, deadline - time.perf_counter())
    url = f"{hub.url}/hub/api/users/{name}/server/progress"
    # The hub sends a keepalive every 8 s, so a read timeout of 60 s only catches a hung hub.
    with session.get(url, stream=True, timeout=(10, min(60, left))) as r:
        if r.status_code != 200:
            return {}
        last: dict = {}
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                last = json.loads(line[5:])
                if last.get("ready") or last.get("failed"):
                    break
            if time.perf_counter() > deadline:
                break
        return last


def click(hub: Hub, name: str, token: str, start: bool, lab: str) -> float:
    """Seconds from the student's click to JupyterLab's page (HTML 200). The click opens their
    server (``lab``: ``/user/NAME/lab`` on the hub's origin for stock JupyterHub, on the user's
    own origin ``NAME.localhost`` for gpulab); where nothing runs yet (stock JupyterHub) it first starts it,
    as the home page's Start button does, and then waits as the browser does on the hub's
    spawn-pending page: on the progress stream, which says when the server is ready or why it
    failed. A spawn the hub reports failed fails the click at once, with the hub's reason."""
    t0 = time.perf_counter()
    deadline = t0 + CLICK_TIMEOUT
    session = requests.Session()
    session.headers["Authorization"] = f"token {token}"
    if start:
        r = session.post(f"{hub.url}/hub/api/users/{name}/server", json={}, timeout=300)
        if r.status_code not in (201, 202):
            raise RuntimeError(f"start refused: {r.status_code} {r.text[:300]}")
    ready_at = None
    while True:
        r = session.get(lab, timeout=300, allow_redirects=False)
        if r.status_code == 200 and "jupyter-config-data" in r.text:
            return time.perf_counter() - t0
        now = time.perf_counter()
        last = f"{r.status_code} -> {r.headers.get('Location')}: {r.text[:200]!r}"
        if now > deadline:
            raise RuntimeError(f"no JupyterLab after {CLICK_TIMEOUT} s (last: {last})")
        if ready_at is not None and now - ready_at > 30:
            raise RuntimeError(f"the hub says ready, but {lab} still answers {last}")
        # Not JupyterLab yet: the hub answers for a server that is not (yet) routed.
        event = progress(session, hub, name, deadline)
        if event.get("failed"):
            raise RuntimeError(f"the hub reports: {event.get('message')}")
        if not event.get("ready"):
            time.sleep(0.5)  # no stream (not pending, not ready): look again shortly
        else:
            ready_at = ready_at or time.perf_counter()
            time.sleep(0.05)  # ready: the route is in; just not answered yet


def clicks(
    hub: Hub, names: list[str], tokens: dict[str, str], start: bool, lab: Callable[[str], str]
) -> list[float]:
    """Every student's click -> JupyterLab time; a student who never got JupyterLab counts as
    ``inf`` and is reported, the reasons counted alike (ports and names left out)."""
    reasons: Counter[str] = Counter()

    def one(name: str) -> float:
        try:
            return click(hub, name, tokens[name], start, lab(name))
        except Exception as e:
            print(f"  {name}: {e}", flush=True)
            reasons[re.sub(r":\d+/", ":PORT/", str(e).replace(name, "NAME"))] += 1
            return float("inf")

    with ThreadPoolExecutor(len(names)) as pool:
        times = list(pool.map(one, names))
    for reason, n in reasons.most_common():
        print(f"  {n} of {len(names)} without JupyterLab: {reason}", flush=True)
    return times


def quantile(values: list[float], q: float) -> float:
    """``pct``, but ``inf`` where a student without JupyterLab is at or next to the quantile."""
    ordered = sorted(values)
    if ordered[min(math.ceil((len(ordered) - 1) * q), len(ordered) - 1)] == float("inf"):
        return float("inf")
    return pct(ordered, q)


def all_ready(hub: Hub, names: list[str]) -> bool:
    r = hub.api("GET", "/users", params={"state": "ready"})
    ready = {u["name"] for u in r.json()}
    return set(names) <= ready


def not_ready(hub: Hub, names: list[str]) -> str:
    """How many servers the booking did not get ready, with the hub's own reasons (its log)."""
    r = hub.api("GET", "/users", params={"state": "ready"})
    ready = len(set(names) & {u["name"] for u in r.json()})
    log = hub.log_path.read_text(errors="replace")
    reasons = Counter(
        re.sub(r"st\d{3}", "NAME", m) for m in re.findall(r"server not started yet: (.*)", log)
    )
    said = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common(3))
    return f"{len(names) - ready} of {len(names)} servers never ready; the hub said: {said or '-'}"


def remove_accounts(accounts: list[str]) -> None:
    """A root hub's gpulab servers run as per-user Unix accounts (made on a user's first start;
    gpulab never removes one): remove the ones this run made, as the benchmark's own leftovers."""
    for name in accounts:
        if accounts_lookup(name) is None:
            continue
        done = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            print(f"  could not remove the account {name}: {done.stderr.strip()}", flush=True)


def run_gpulab(base: Path, students: int, lead: float) -> dict[str, float]:
    names = [f"st{i:03d}" for i in range(students)]
    ours = [a for a in (account_name(n) for n in names) if accounts_lookup(a) is None]
    hub = Hub(
        base / "gpulab",
        simulate=f"RTX-4090:{students}",
        extra_args=[
            f"--BookingKeeper.prestart_seconds={lead - 10}",
            # A course holds at most 32 cards at once by default: its operator raises that for a
            # class as large as this one.
            f"--HoldLimits.max_cards_per_course={max(students, 32)}",
        ],
    )
    try:
        hub.start(timeout=120)
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
        if r.status_code != 201:
            raise RuntimeError(f"booking refused: {r.status_code} {r.text[:300]}")
        use_from = datetime.fromisoformat(r.json()["servers_from"].replace("Z", "+00:00"))
        print(f"gpulab: booked {students} cards; servers start at {use_from:%H:%M:%S}", flush=True)
        try:
            wait_for(lambda: all_ready(hub, names), lead + 300, 0.5, "all students' servers")
        except TimeoutError:
            raise RuntimeError(not_ready(hub, names)) from None
        ready_after = time.time() - use_from.timestamp()
        before_window = start - time.time()
        print(
            f"gpulab: all {students} ready {ready_after:.1f} s after the hub began starting them, "
            f"{before_window:.1f} s before the window opens",
            flush=True,
        )
        wait_for(lambda: time.time() >= start, lead + 60, 0.2, "the window")
        times = clicks(hub, names, tokens, False, lambda n: hub.user_url(n, "lab"))
        return {"ready_s": ready_after, "before_window_s": before_window, "clicks": times}
    finally:
        hub.stop()
        remove_accounts(ours)


def run_stock(base: Path, students: int) -> dict[str, float]:
    hub = stock_hub(base)
    # JupyterHub gives a server two limits: start_timeout (default 60 s) for the spawner's start,
    # then http_timeout (default 30 s) for the started server to answer at its URL. Forty
    # jupyterhub-singleuser processes starting at once on 2 cores take about a minute each to
    # answer, so with the defaults stock gives up on nearly all of them ("st003's server never
    # showed up at http://127.0.0.1:36875/user/st003/ after 30 seconds. Giving up."), which is
    # what an operator expecting a class would raise. Give them every chance (gpulab keeps the
    # defaults: its booking starts the servers ahead); a failure is still counted below, with the
    # hub's reason.
    with open(hub.data_dir / "jupyterhub_config.py", "a") as f:
        f.write(f"\nc.Spawner.start_timeout = {CLICK_TIMEOUT}\n")
        f.write(f"c.Spawner.http_timeout = {CLICK_TIMEOUT}\n")
    start_stock(hub)
    try:
        names = [f"st{i:03d}" for i in range(students)]
        for n in names:
            hub.create_user(n)
        tokens = {n: token_for(hub, n) for n in names}
        t0 = time.time()
        times = clicks(hub, names, tokens, True, lambda n: f"{hub.url}/user/{n}/lab")
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
    resolve_localhost_names()  # gpulab's users' own origins, NAME.localhost
    print(
        f"class start: {args.students} students; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; GPUs simulated",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gpulab-class-") as tmp:
        base = Path(tmp)
        try:
            g = run_gpulab(base, args.students, args.lead)
        except Exception as e:  # still measure stock, and say which side failed
            print(f"gpulab FAILED: {e}", flush=True)
            g = {"ready_s": float("inf"), "clicks": [float("inf")] * args.students}
        s = run_stock(base, args.students)
    print()
    print(f"{'':28}{'gpulab (booked)':>18}{'stock JupyterHub':>18}{'ratio':>8}")
    print(
        f"{'all servers ready (s)':28}{g['ready_s']:>18.1f}{s['ready_s']:>18.1f}"
        f"{g['ready_s'] / s['ready_s']:>8.2f}"
    )
    for label, q in (("click -> JupyterLab p50 (s)", 0.5), ("click -> JupyterLab p95 (s)", 0.95)):
        a, b = quantile(g["clicks"], q), quantile(s["clicks"], q)
        print(f"{label:28}{a:>18.2f}{b:>18.2f}{a / b:>8.2f}")
    failed = [sum(1 for t in r["clicks"] if t == float("inf")) for r in (g, s)]
    print(f"{'students without JupyterLab':28}{failed[0]:>18}{failed[1]:>18}")
    print(
        "gpulab's servers were started by the booking, before the window; stock JupyterHub's by "
        "the students' clicks (its 'all ready' is from the first click)."
    )


if __name__ == "__main__":
    main()
