"""Replay a day of arrivals through the spot market, then time one tick of a very large market.

Both parts run the hub's own pure functions (``spot_price``, ``utilization``, ``decide`` and the
``TypeBook`` order book from ``gpulab.spawners.market.core``); only the clock and the servers are
simulated here.

    .venv/bin/python benchmarks/spot_market.py                 # a day on 64 GPUs, then the stress tick
    .venv/bin/python benchmarks/spot_market.py --gpus 400 --arrivals 6000 --seed 7

The day: arrivals follow a daily curve (busy office hours, quiet nights), 40% on-demand, 60% spot
with bids between the floor and the on-demand price; some spot requests wait in the queue, some
only run in the low-price windows (18:00-09:00 and weekends). A tick every 10 simulated seconds;
a preempted server stops after the warning period. Printed: utilization, revenue (on-demand and
spot, each spot second at the price in force), preemptions by reason, median/p95 wait of queued
requests, and the tick time. The stress part builds a market of 10,000 GPUs and 50,000 queued or
running requests and times full ticks (every GPU type priced and matched) with churn between them.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections import Counter
from datetime import datetime, timedelta
from decimal import Decimal

from gpulab.catalog import load_catalog
from gpulab.spawners.market.core import Order, Schedule, TypeBook, decide, spot_price, utilization

TICK = 10.0  # simulated seconds between ticks (the hub's upper bound)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(q / 100 * len(values)) - 1)]


def arrival_rate(hour: float) -> float:
    """Relative arrivals per hour of day: quiet at night, peak in office hours."""
    return 0.25 + 0.75 * math.exp(-(((hour - 14) / 4) ** 2))


def simulate_day(gpus: int, arrivals: int, warning: float, seed: int) -> None:
    rng = random.Random(seed)
    catalog = load_catalog()
    types = list(catalog.gpu_types.values())
    weights = [4, 3, 2, 1][: len(types)]
    total = {
        t.slug: max(1, round(gpus * w / sum(weights))) for t, w in zip(types, weights, strict=False)
    }
    free = dict(total)
    books = {t.slug: TypeBook() for t in types}
    schedule = Schedule.parse(["18:00-09:00"], weekends=True)
    day0 = datetime(2026, 12, 1)  # a Tuesday

    # Arrivals: (time, Order, duration, wait)
    curve = [arrival_rate(h / 10) for h in range(240)]
    arr = []
    for i in range(arrivals):
        slot = rng.choices(range(240), weights=curve)[0]
        t = (slot + rng.random()) * 360.0
        gt = rng.choices(types, weights=weights)[0]
        on_demand = rng.random() < 0.4
        cards = 1 if rng.random() < 0.85 else 2
        duration = rng.expovariate(1 / 5400)
        owner = f"u{i}/"
        if on_demand:
            arr.append(
                (t, Order(owner, gt.slug, cards, "on-demand", None, False, t), duration, True)
            )
        else:
            frac = Decimal(str(round(rng.uniform(0.05, 1.0), 2)))
            bid = (
                gt.spot_floor_price + (gt.on_demand_price - gt.spot_floor_price) * frac
            ).quantize(Decimal("0.01"))
            windows = rng.random() < 0.2
            wait = windows or rng.random() < 0.5
            arr.append((t, Order(owner, gt.slug, cards, "spot", bid, windows, t), duration, wait))
    arr.sort(key=lambda a: a[0])

    ends: dict[str, float] = {}  # owner -> when it finishes by itself
    durations: dict[str, float] = {}
    deadlines: dict[str, float] = {}  # preempted owner -> stop time
    books_reason: dict[str, str] = {}  # preempted owner -> why
    price = {slug: catalog.gpu_types[slug].spot_floor_price for slug in total}
    revenue_od = Decimal(0)
    revenue_spot = Decimal(0)
    busy_card_seconds = 0.0
    preempted: Counter[str] = Counter()
    waits: list[float] = []
    rejected = Counter()
    tick_times: list[float] = []
    running_od: dict[str, Order] = {}
    running_spot: dict[str, Order] = {}
    queued_at: dict[str, float] = {}

    def start(o: Order, now: float) -> None:
        free[o.gpu_type] -= o.cards
        ends[o.owner] = now + durations[o.owner]
        if o.pricing == "spot":
            running_spot[o.owner] = o
            books[o.gpu_type].add_running(o)
        else:
            running_od[o.owner] = o

    def stop(owner: str) -> None:
        o = running_spot.pop(owner, None) or running_od.pop(owner)
        books_reason.pop(owner, None)
        if o.pricing == "spot":
            books[o.gpu_type].remove(owner)
        free[o.gpu_type] += o.cards
        ends.pop(owner, None)
        deadlines.pop(owner, None)

    ai = 0
    steps = int(86400 / TICK)
    for step in range(steps):
        now = step * TICK
        low = schedule.is_low(day0 + timedelta(seconds=now))
        # Servers that finished, or reached their preemption deadline.
        for owner in [o for o, e in ends.items() if e <= now]:
            stop(owner)
        for owner in [o for o, d in deadlines.items() if d <= now]:
            preempted[books_reason[owner]] += 1
            stop(owner)
        # New arrivals: admitted like the hub does, else queued (or refused).
        while ai < len(arr) and arr[ai][0] <= now:
            _, o, duration, wait = arr[ai]
            ai += 1
            durations[o.owner] = duration
            book = books[o.gpu_type]
            if o.pricing == "on-demand":
                if free[o.gpu_type] >= o.cards:
                    start(o, now)
                elif free[o.gpu_type] + book.running_cards >= o.cards:
                    book.add_queued(o)
                    queued_at[o.owner] = now
                else:
                    rejected["on-demand, no card"] += 1
            else:
                ok = (
                    free[o.gpu_type] >= o.cards
                    and o.max_price >= price[o.gpu_type]
                    and (low or not o.windows_only)
                    and not book.queued_on_demand
                )
                if ok:
                    start(o, now)
                elif wait:
                    book.add_queued(o)
                    queued_at[o.owner] = now
                else:
                    rejected["spot, not matched"] += 1
        # The tick itself: what the hub runs every <= 10 s.
        t0 = time.perf_counter()
        decisions = {}
        for slug, book in books.items():
            u = utilization(total[slug], free[slug], book.queued_cards)
            gt = catalog.gpu_types[slug]
            price[slug] = spot_price(gt.spot_floor_price, gt.on_demand_price, u, low)
            decisions[slug] = decide(book, free[slug], price[slug], low)
        tick_times.append(time.perf_counter() - t0)
        for slug, d in decisions.items():
            book = books[slug]
            for owner in d.cancel:
                book.preempting.pop(owner, None)
                deadlines.pop(owner, None)
                books_reason.pop(owner, None)
            for owner, reason in d.preempt:
                book.preempting[owner] = reason
                books_reason[owner] = reason
                deadlines[owner] = now + warning
            for o in d.starts:
                book.remove(o.owner)
                waits.append(now - queued_at.pop(o.owner))
                start(o, now)
        # Money and utilization over this tick.
        for o in running_od.values():
            revenue_od += catalog.gpu_types[o.gpu_type].on_demand_price * o.cards
        for o in running_spot.values():
            revenue_spot += price[o.gpu_type] * o.cards
        busy_card_seconds += sum(total[s] - free[s] for s in total) * TICK
    revenue_od = revenue_od * Decimal(TICK) / 3600
    revenue_spot = revenue_spot * Decimal(TICK) / 3600
    still_queued = sum(len(b.orders) - len(b.running) for b in books.values())

    cur = catalog.currency
    print(
        f"== A simulated day: {sum(total.values())} GPUs ({', '.join(f'{s} x{n}' for s, n in total.items())}), {arrivals} arrivals, {warning:.0f} s warning"
    )
    print(f"utilization          {busy_card_seconds / (sum(total.values()) * 86400):.1%}")
    print(
        f"revenue              {cur} {(revenue_od + revenue_spot).quantize(Decimal('0.01'))} (on-demand {revenue_od.quantize(Decimal('0.01'))}, spot {revenue_spot.quantize(Decimal('0.01'))})"
    )
    print(f"preemptions          {sum(preempted.values())} " + str(dict(preempted)))
    print(
        f"queued then started  {len(waits)}; wait median {statistics.median(waits) if waits else 0:.0f} s, p95 {pct(waits, 95):.0f} s; still queued at midnight {still_queued}"
    )
    print(f"refused at arrival   {dict(rejected)}")
    print(
        f"tick time            p50 {pct(tick_times, 50) * 1e3:.3f} ms, p95 {pct(tick_times, 95) * 1e3:.3f} ms, max {max(tick_times) * 1e3:.3f} ms ({len(tick_times)} ticks)"
    )


def stress_tick(gpus: int, requests: int, ticks: int, seed: int) -> None:
    """Time full ticks of a market with ``gpus`` cards and ``requests`` running or queued."""
    rng = random.Random(seed)
    catalog = load_catalog()
    types = list(catalog.gpu_types.values())
    total = {t.slug: gpus // len(types) for t in types}
    free = dict(total)
    books = {t.slug: TypeBook() for t in types}

    def bid(gt) -> Decimal:
        frac = Decimal(str(round(rng.uniform(0.0, 1.0), 2)))
        return (gt.spot_floor_price + (gt.on_demand_price - gt.spot_floor_price) * frac).quantize(
            Decimal("0.01")
        )

    n = 0
    t_build = time.perf_counter()
    for gt in types:
        book = books[gt.slug]
        # 90% of the cards busy: two thirds spot (in the book), one third on-demand (not in it).
        busy = int(total[gt.slug] * 0.9)
        spot_cards = busy * 2 // 3
        for _ in range(spot_cards):
            book.add_running(Order(f"r{n}/", gt.slug, 1, "spot", bid(gt), rng.random() < 0.1, n))
            n += 1
        free[gt.slug] -= busy
    running = n
    queued = requests - running
    for i in range(queued):
        gt = types[i % len(types)]
        if rng.random() < 0.05:
            o = Order(f"q{n}/", gt.slug, 1, "on-demand", None, False, n)
        else:
            o = Order(
                f"q{n}/", gt.slug, rng.choice((1, 1, 1, 2)), "spot", bid(gt), rng.random() < 0.2, n
            )
        books[gt.slug].add_queued(o)
        n += 1
    build = time.perf_counter() - t_build

    times = []
    low = False
    for k in range(ticks):
        # Churn between ticks, as in a live hub: some servers finish, some requests arrive.
        for gt in types:
            book = books[gt.slug]
            for _ in range(20):
                if book.running:
                    _, _, owner = book.running[rng.randrange(len(book.running))]
                    o = book.remove(owner)
                    free[gt.slug] += o.cards
                book.add_queued(Order(f"n{n}/", gt.slug, 1, "spot", bid(gt), False, n))
                n += 1
        low = not low if k % 10 == 0 else low
        t0 = time.perf_counter()
        for gt in types:
            book = books[gt.slug]
            u = utilization(total[gt.slug], free[gt.slug], book.queued_cards)
            price = spot_price(gt.spot_floor_price, gt.on_demand_price, u, low)
            decide(book, free[gt.slug], price, low)
        times.append(time.perf_counter() - t0)
    print(
        f"\n== Stress tick: {sum(total.values())} GPUs, {running} running spot + "
        f"{queued} queued = {running + queued} requests in the books (+ on-demand servers "
        f"holding {sum(int(total[s] * 0.9) for s in total) - running} cards); built in {build:.2f} s"
    )
    print(
        f"tick time            p50 {pct(times, 50) * 1e3:.2f} ms, p95 {pct(times, 95) * 1e3:.2f} ms, "
        f"max {max(times) * 1e3:.2f} ms over {ticks} ticks (target < 100 ms)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64, help="GPUs in the simulated day's pool")
    ap.add_argument("--arrivals", type=int, default=1500, help="requests over the day")
    ap.add_argument("--warning", type=float, default=300.0, help="warning period in seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stress-gpus", type=int, default=10_000)
    ap.add_argument("--stress-requests", type=int, default=50_000)
    ap.add_argument("--stress-ticks", type=int, default=50)
    args = ap.parse_args()
    simulate_day(args.gpus, args.arrivals, args.warning, args.seed)
    stress_tick(args.stress_gpus, args.stress_requests, args.stress_ticks, args.seed)


if __name__ == "__main__":
    main()
