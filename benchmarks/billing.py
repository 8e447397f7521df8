"""Billing benchmark: ingestion throughput (events/s, batched) and monthly statement time.

    .venv/bin/python benchmarks/billing.py [--pg-url URL] [--users 1000] [--skip-pg]

- Ingestion: the service's ingestion path without HTTP (batch validation + one transaction that
  dedupes, widens spans, re-rates sessions and posts charges), on SQLite (file, WAL, fsync on
  commit) and PostgreSQL. Each batch is one server's spool flush: heartbeats of 3 live kernels
  plus kernel starts/stops. Prints events/s and p50/p95 batch latency.
- Statement: a month of data for N users with 10 kernels a day each (2 server sessions a day),
  then the time to produce one user's monthly statement (p50/p95 over a sample), every user's
  statement in turn, and the admin overview of the month.

Without --pg-url a throw-away PostgreSQL cluster is started (Debian's postgresql binaries).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import insert

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from gpulab.billing_service import statements  # noqa: E402
from gpulab.billing_service.db import make_engine, upgrade  # noqa: E402
from gpulab.billing_service.metering import ingest  # noqa: E402
from gpulab.billing_service.models import (  # noqa: E402
    MICRO,
    Account,
    KernelSpan,
    LedgerEntry,
    ServerSession,
)
from gpulab.billing_service.rating import PriceBook  # noqa: E402
from gpulab.billing_service.schemas import parse_batch  # noqa: E402
from gpulab.catalog import load_catalog  # noqa: E402

PRICES = PriceBook(load_catalog())
TRIAL = 10 * MICRO
DAY = 86_400


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def spool_batch(user: str, server: str, t0: float, n: int, kernels: list[str]) -> list[dict]:
    events = []
    t = t0
    for i in range(n):
        t += 1.0
        if i % 50 == 0:
            events.append(
                {
                    "id": uuid.uuid4().hex,
                    "kind": "kernel_start",
                    "user": user,
                    "server": server,
                    "t": t,
                    "kernel": kernels[i // 50 % len(kernels)],
                    "name": "python3",
                }
            )
        else:
            events.append(
                {
                    "id": uuid.uuid4().hex,
                    "kind": "heartbeat",
                    "user": user,
                    "server": server,
                    "t": t,
                    "kernels": kernels,
                }
            )
    return events


def bench_ingest(url: str, label: str, batch: int, batches: int) -> None:
    engine = make_engine(url)
    upgrade(engine)
    t0 = time.time() - 30 * DAY
    # Each server has a hub-reported session first.
    servers = [(f"bench{i:04d}", f"srv{i % 3}") for i in range(batches)]
    starts = [
        {
            "id": uuid.uuid4().hex,
            "kind": "server_start",
            "user": u,
            "server": s,
            "t": t0,
            "gpu": "a100-80g",
            "gpus": 1,
            "pricing": "on-demand",
            "options": {},
        }
        for u, s in servers
    ]
    for i in range(0, len(starts), 500):
        ingest(
            engine,
            parse_batch({"events": starts[i : i + 500]}, time.time()),
            PRICES,
            TRIAL,
            time.time_ns() // 1000,
        )
    bodies = [
        {"events": spool_batch(u, s, t0 + 10, batch, [f"{u}-{s}-k{j}" for j in range(3)])}
        for u, s in servers
    ]
    lat = []
    start = time.perf_counter()
    for body in bodies:
        b0 = time.perf_counter()
        events = parse_batch(body, time.time())
        ingest(engine, events, PRICES, TRIAL, time.time_ns() // 1000)
        lat.append(time.perf_counter() - b0)
    total = time.perf_counter() - start
    n = batch * len(bodies)
    print(
        f"ingest  {label:<10} batch={batch:<5} {n:>7} events in {total:6.2f}s = "
        f"{n / total:8.0f} events/s   batch p50 {pct(lat, 50) * 1000:7.1f} ms  "
        f"p95 {pct(lat, 95) * 1000:7.1f} ms"
    )
    engine.dispose()


def populate_month(url: str, users: int) -> tuple[int, int]:
    """A month for `users` users: 2 sessions a day, 5 kernels each (10 kernels/day/user)."""
    engine = make_engine(url)
    upgrade(engine)
    month0 = (int(time.time()) // DAY - 31) * DAY
    now_us = time.time_ns() // 1000
    sid = 0
    with engine.begin() as conn:
        for u in range(users):
            user = f"m{u:05d}"
            conn.execute(
                insert(Account), [{"user": user, "balance_micro": 0, "created_us": now_us}]
            )
            sessions, spans, entries = [], [], []
            balance = TRIAL
            entries.append(
                {
                    "user": user,
                    "kind": "trial",
                    "amount_micro": TRIAL,
                    "created_us": month0 * MICRO,
                    "idempotency_key": f"trial:{user}",
                    "note": "",
                    "actor": "",
                }
            )
            for d in range(30):
                for s in range(2):
                    sid += 1
                    start = (month0 + d * DAY + 9 * 3600 + s * 4 * 3600) * MICRO
                    gpu = "a100-80g" if s == 0 else "none"
                    intervals = []
                    for k in range(5):
                        a = start + k * 600 * MICRO
                        b = a + 1800 * MICRO
                        intervals.append((a, b))
                        spans.append(
                            {
                                "user": user,
                                "server": "",
                                "kernel_id": f"{sid}-{k}",
                                "name": "python3",
                                "first_us": a,
                                "last_us": b,
                                "session_id": sid,
                            }
                        )
                    merged = [(intervals[0][0], intervals[-1][1])]
                    billed = merged[0][1] - merged[0][0]
                    cost = PRICES.cost_micro(gpu, 1, "on-demand", merged)
                    stopped = merged[0][1] + 60 * MICRO
                    sessions.append(
                        {
                            "id": sid,
                            "start_event": f"e{sid}",
                            "user": user,
                            "server": "",
                            "gpu_type": gpu,
                            "gpus": 1 if gpu != "none" else 0,
                            "pricing": "on-demand",
                            "options": "{}",
                            "started_us": start,
                            "stopped_us": stopped,
                            "billed_us": billed,
                            "charged_micro": cost,
                            "last_busy_us": merged[0][1],
                            "last_heartbeat_us": merged[0][1],
                        }
                    )
                    entries.append(
                        {
                            "user": user,
                            "kind": "charge",
                            "amount_micro": -cost,
                            "created_us": stopped,
                            "session_id": sid,
                            "idempotency_key": None,
                            "note": "",
                            "actor": "",
                        }
                    )
                    balance -= cost
            conn.execute(insert(ServerSession), sessions)
            conn.execute(insert(KernelSpan), spans)
            conn.execute(insert(LedgerEntry), entries)
            conn.execute(
                Account.__table__.update().where(Account.user == user).values(balance_micro=balance)
            )
    engine.dispose()
    return month0 * MICRO, (month0 + 31 * DAY) * MICRO


def bench_statement(url: str, label: str, users: int) -> None:
    t = time.perf_counter()
    lo, hi = populate_month(url, users)
    print(
        f"statement {label:<10} populated {users} users x 10 kernels/day x 30 days "
        f"in {time.perf_counter() - t:.1f}s"
    )
    engine = make_engine(url)
    one = []
    with engine.connect() as conn:
        start = time.perf_counter()
        for u in range(users):
            b0 = time.perf_counter()
            s = statements.usage(conn, PRICES, f"m{u:05d}", lo, hi)
            one.append(time.perf_counter() - b0)
            assert len(s["servers"]) == 60
        all_users = time.perf_counter() - start
        b0 = time.perf_counter()
        overview = statements.admin_overview(conn, PRICES, lo, hi)
        admin = time.perf_counter() - b0
        assert len(overview["users"]) == users
    print(
        f"statement {label:<10} one user's month: p50 {pct(one, 50) * 1000:6.1f} ms  "
        f"p95 {pct(one, 95) * 1000:6.1f} ms   all {users} users' statements: {all_users:6.2f}s   "
        f"admin overview (all users, revenue per GPU type): {admin * 1000:6.1f} ms"
    )
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-url", default="")
    parser.add_argument("--skip-pg", action="store_true")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="gpulab-billing-bench-"))
    targets = [("sqlite", lambda name: f"sqlite:///{tmp / name}.sqlite")]
    cluster = None
    if not args.skip_pg:
        if args.pg_url:
            base = args.pg_url.rsplit("/", 1)[0]
            print("note: --pg-url databases bench_ingest_* and bench_month must not exist")
            targets.append(("postgresql", lambda name: f"{base}/{name}"))
        else:
            from billing.pg import PgCluster

            cluster = PgCluster().start()
            targets.append(("postgresql", cluster.create_database))
    try:
        for label, make in targets:
            for batch in (100, 1000):
                bench_ingest(make(f"bench_ingest_{batch}"), label, batch, args.batches)
        for label, make in targets:
            bench_statement(make("bench_month"), label, args.users)
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
