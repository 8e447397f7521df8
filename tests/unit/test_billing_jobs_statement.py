"""Issue 26, "billed per second as job-seconds on the statement": a training job's usage is one
line per job, across its ranks and attempts, with a jobs subtotal, in the statement's JSON, on its
page and in its CSV, and only on its owner's statement.

Checked on the store (real SQLite and a real PostgreSQL, through ``ingest`` and
``statements.usage`` as the handlers call them): a job of two attempts on one node (2 x A100 for
1,800 s each: "Job 17 · A100-80G x2 · 3,600 s · CNY 4.20"), a gang of 2 nodes, and a plain
server beside them, which stays a session row of its own. Expected amounts are the catalog's
prices times the seconds, worked out here.
"""

from __future__ import annotations

import csv
import io
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from billing.scenario import kernel, server_start, server_stop
from tornado.escape import url_escape
from tornado.template import Loader

from gpulab.billing_service import csv_export, jobs, statements
from gpulab.billing_service.chart import bar_chart
from gpulab.billing_service.hub_links import HubLinks
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import PriceBook, format_money
from gpulab.billing_service.schemas import parse_batch
from gpulab.catalog import load_catalog

CATALOG = load_catalog()
PRICES = PriceBook(CATALOG)
TRIAL = 100 * MICRO
T0 = datetime(2026, 3, 10, 9, tzinfo=UTC).timestamp()
DOT = " \u00b7 "
TEMPLATES = Path(statements.__file__).with_name("templates")


def us(t: float) -> int:
    return round(t * MICRO)


def run(user: str, server: str, t: float, seconds: float, gpu: str, gpus: int) -> list[dict]:
    """One session of ``server``: started at t, a process busy for ``seconds``, stopped."""
    k = f"k-{uuid.uuid4().hex[:6]}"
    return [
        server_start(user, t, gpu, gpus, server=server),
        kernel("kernel_start", user, k, t + 1, server),
        kernel("kernel_stop", user, k, t + 1 + seconds, server),
        server_stop(user, t + seconds + 5, server),
    ]


def feed(engine, events: list[dict]) -> None:
    now = time.time_ns() // 1000
    result = ingest(engine, parse_batch({"events": events}, time.time()), PRICES, TRIAL, now)
    assert not result.rejected


def usage(engine, user: str) -> dict:
    with engine.connect() as conn:
        return statements.usage(conn, PRICES, user, us(T0 - 3600), us(T0 + 86_400))


def test_a_job_is_one_line_of_job_seconds_across_attempts_and_ranks(engine) -> None:
    """Issue 26: job-seconds on the statement; a job's attempts (a preemption's requeue) and a
    gang's ranks add up to one line per job, and the subtotal is the jobs' own."""
    owner, other = f"u{uuid.uuid4().hex[:8]}", f"u{uuid.uuid4().hex[:8]}"
    feed(
        engine,
        [
            # a notebook server: not a job
            *run(owner, "", T0, 600, "a100-80g", 1),
            # job 17, attempt 1 (preempted), then attempt 2 on the same server name
            *run(owner, "job-17", T0 + 1000, 1800, "a100-80g", 2),
            *run(owner, "job-17", T0 + 4000, 1800, "a100-80g", 2),
            # job 18, a gang of 2 nodes x 1 RTX 4090, 900 s on each
            *run(owner, "job-18-0", T0 + 8000, 900, "rtx-4090", 1),
            *run(owner, "job-18-1", T0 + 8000, 900, "rtx-4090", 1),
            # a name that only looks like a job's stays a server
            *run(owner, "job-x", T0 + 9000, 60, "none", 0),
        ],
    )
    u = usage(engine, owner)
    got = u["jobs"]
    assert [j["job"] for j in got["jobs"]] == [17, 18]
    j17, j18 = got["jobs"]
    # 2 cards x 2.10/card-h x 3,600 s = 4.20
    assert j17["label"] == f"Job 17{DOT}A100-80G x2{DOT}3,600 s{DOT}CNY 4.20"
    assert (j17["attempts"], j17["nodes"], j17["servers"]) == (2, 1, ["job-17"])
    assert j17["job_seconds"] == 3600 and j17["amount"]["exact"] == "4.2"
    assert [(p["attempt"], p["rank"]) for p in j17["sessions"]] == [(1, None), (2, None)]
    assert j17["running"] is False and j17["stopped"] is not None
    # 2 nodes x 0.68/card-h x 900 s = 0.34
    assert j18["label"] == f"Job 18{DOT}RTX 4090 x1{DOT}2 nodes{DOT}1,800 s{DOT}CNY 0.34"
    assert (j18["attempts"], j18["nodes"], j18["servers"]) == (1, 2, ["job-18-0", "job-18-1"])
    assert sorted(p["rank"] for p in j18["sessions"]) == [0, 1]
    assert got["total"]["job_seconds"] == 5400
    assert got["total"]["amount"]["exact"] == "4.54"
    assert got["total"]["label"] == f"Jobs{DOT}5,400 s{DOT}CNY 4.54"
    # The jobs are part of what the sessions cost, not on top of it: 600 s of an A100 (0.35)
    # and 60 s without a GPU (0.09/h: 0.0015) besides.
    assert Decimal(u["total"]["amount"]["exact"]) == Decimal("4.54") + Decimal("0.3515")

    # The page: one row per job (its sessions inside), the notebook server and job-x as before.
    rows = statements.page_rows(u, [], us(T0 + 86_400))
    kinds = [
        (r["kind"], r["job"]["job"] if r["kind"] == "job" else r["session"]["server"]) for r in rows
    ]
    assert sorted(kinds, key=str) == sorted(
        [("job", 17), ("job", 18), ("session", ""), ("session", "job-x")], key=str
    )
    job_row = next(r for r in rows if r["kind"] == "job" and r["job"]["job"] == 17)
    assert [p["row"]["session"]["server"] for p in job_row["parts"]] == ["job-17", "job-17"]
    assert "\u2013" in job_row["when"] and "(" in job_row["when"]

    text = page_text(u, rows)
    assert "Job 17 \u00b7 A100-80G x2 \u00b7 3,600 s 2 attempts" in text
    assert "Job 18 \u00b7 RTX 4090 x1 \u00b7 2 nodes \u00b7 1,800 s" in text
    assert "attempt 2" in text and "node 1" in text
    assert "Of which training jobs (2; 5,400 job-seconds) 4.54" in text
    assert "on server job-x" in text and "on server job-17" not in text

    # The CSV says the same: a job row per job, its sessions naming it, and the subtotal.
    table = list(csv.DictReader(io.StringIO(csv_export.render(u))))
    job_rows = [r for r in table if r["row"] == "job"]
    assert [(r["job"], r["job_seconds"], r["amount_CNY"]) for r in job_rows] == [
        ("17", "3600.0", "4.2"),
        ("18", "1800.0", "0.34"),
    ]
    assert job_rows[0]["note"].startswith(j17["label"])
    servers = [r for r in table if r["row"] == "server"]
    assert sorted(r["job"] for r in servers) == ["", "", "17", "17", "18", "18"]
    (subtotal,) = [r for r in table if r["row"] == "jobs_total"]
    assert (subtotal["job_seconds"], subtotal["amount_CNY"]) == ("5400.0", "4.54")

    # Another user's statement has none of it.
    assert usage(engine, other)["jobs"] == {
        "jobs": [],
        "total": {
            "jobs": 0,
            "job_seconds": 0,
            "amount": statements.money(0),
            "label": f"Jobs{DOT}0 s{DOT}CNY 0.00",
        },
    }


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def page_text(u: dict, rows: list[dict]) -> str:
    """The statement page's text (billing's template, as its handler renders it)."""
    html = (
        Loader(str(TEMPLATES))
        .load("statement.html")
        .generate(
            me="x",
            name="x",
            usage=u,
            chart=bar_chart(u["daily"], u["currency"], u["time_zone"]),
            spend_total=format_money(sum(d["micro"] for d in u["daily"])),
            balance={"warnings": [], "currency": "CNY", "balance": statements.money(0)}
            | {"burn_rate_per_hour": statements.money(0), "time_left_seconds": None},
            overview=None,
            rows=rows,
            period=statements.human_period(u, us(T0 + 86_400)),
            prefix="/services/billing/",
            hub=HubLinks("/hub/"),
            hub_admin=False,
            service_name="billing",
            from_arg="",
            to_arg="",
            xsrf="",
            url_escape=url_escape,
        )
        .decode()
    )
    parser = _Text()
    parser.feed(html)
    return " ".join(" ".join(parser.parts).split())


def test_a_running_job_shows_so_far(engine) -> None:
    """A job whose attempt still runs is marked running, with no stop."""
    owner = f"u{uuid.uuid4().hex[:8]}"
    feed(
        engine,
        [
            server_start(owner, T0, "a100-80g", 1, server="job-5"),
            kernel("kernel_start", owner, "k", T0 + 1, "job-5"),
            kernel("kernel_stop", owner, "k", T0 + 61, "job-5"),
        ],
    )
    (job,) = usage(engine, owner)["jobs"]["jobs"]
    assert job["running"] is True and job["stopped"] is None
    assert job["job_seconds"] == 60


def test_job_server_names() -> None:
    assert jobs.job_of("job-17") == (17, None)
    assert jobs.job_of("job-17-1") == (17, 1)
    for name in ("", "job-", "job-0", "job-017", "job-1-01", "job-1-x", "xjob-1", "job-1-2-3"):
        assert jobs.job_of(name) is None, name
