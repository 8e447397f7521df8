"""Every second a job server runs work is billed once, to the right session (issue 26, F6 of the
red team: "some no-GPU job attempts are never billed; a re-run's observed span is booked on the
previous session and cut off").

A job server's work starts the moment the server does: the job runner (the "server itself" the
observer leaves out) starts the command as its child at once, not minutes later as a notebook's
kernel. The hub's observer opens the span at that child's start time, read from the kernel's
process table (boot time, which /proc gives in whole seconds, plus ticks since boot), so it can
read a little earlier than the hub's own clock said when it told billing the server started.
Billing placed a span in the session that started before the span's first second: that was the
session before (a re-run of the same ``job-ID``, stopped since: the span was clipped to its
window, 0 s) or none at all (a first attempt: billed nowhere).

Real parts: a root hub with the local spawner, the job scheduler and the observer, and the real
billing service; the events of the second test are the hub's own (its service token), timed as
the hub times them for a job server started again under the same name.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from billing.client import Billing
from harness import FAST_BILLING_ENV, HB, Hub, wait_for
from jobs_helpers import Jobs

ENV = {
    **FAST_BILLING_ENV,
    "GPULAB_BILLING_ARGS": (
        f"--BillingService.heartbeat_interval={HB} --BillingService.enforce_interval=1 "
        "--BillingService.idle_timeout=600"
    ),
}
ARGS = [
    "--ActivityObserver.interval=0.5",
    "--ActivityObserver.report_interval=1",
    "--JobScheduler.interval=0.3",
    "--JobScheduler.retry_seconds=1",
]
BUSY = 20
# A busy loop of BUSY seconds, exec'd by bash so that the command is the runner's only child.
BUSY_LOOP = (
    "exec python3 -c 'import time\nend = time.time() + "
    f'{BUSY}\nwhile time.time() < end: pass\nprint("busy-done")\''
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")


@pytest.fixture(scope="module")
def bhub(module_hub_factory) -> Hub:
    h = module_hub_factory("jobspans", env=ENV, extra_args=ARGS)
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


def sessions_of(billing: Billing, user: str, server: str) -> list[dict]:
    return [s for s in billing.usage(user)["servers"] if s["server"] == server]


def test_a_no_gpu_job_busy_for_20_seconds_is_billed_about_its_run_time(bhub: Hub) -> None:
    """Issue 26 (F6): a no-GPU job running a busy loop for ~20 s (no card: billed from what the
    hub observes) is billed about its run time, on its own session, and the span is listed
    there. Before: the span's first second read before the session's start, so it was placed in
    no session (billed 0 s, listed nowhere)."""
    user = bhub.create_user(f"b{uuid.uuid4().hex[:8]}")
    jobs = Jobs(bhub, user)
    billing = Billing(bhub)
    job = jobs.submit(command=BUSY_LOOP, gpu="none", gpus=0, name="busy")
    running = jobs.wait_state(job["id"], "running", "succeeded", "failed")
    done = jobs.wait_state(job["id"], "succeeded", "failed", timeout=120)
    assert done["state"] == "succeeded", done
    assert "busy-done" in jobs.log(job["id"])
    assert running["state"] in ("running", "succeeded")
    server = f"job-{job['id']}"

    def billed() -> dict | None:
        rows = sessions_of(billing, user, server)
        return rows[0] if len(rows) == 1 and rows[0]["stopped"] and rows[0]["observed"] else None

    row = wait_for(billed, 30, 0.5, "the job's session to be billed and closed")
    (attempt,) = done["attempts"]
    assert BUSY - 1.5 <= row["billed_seconds"] <= BUSY + 10, (row, attempt)
    observed = sum(o["observed_seconds"] for o in row["observed"])
    assert abs(observed - row["billed_seconds"]) < 0.01, row
    # Listed with its own session, and nothing of it billed anywhere else.
    total = sum(s["billed_seconds"] for s in billing.usage(user)["servers"])
    assert abs(total - row["billed_seconds"]) < 0.01


def _hub_events(billing: Billing, events: list[dict]) -> None:
    r = billing.post("api/v1/events", {"events": events})
    assert r.status_code == 200, r.text


def test_a_job_server_name_reused_by_two_attempts_bills_each_to_its_own_session(
    bhub: Hub,
) -> None:
    """Issue 26 (F6): a job's server name (``job-ID``) is reused by its next attempt a moment
    after the last one stopped. Each attempt's observed seconds are billed to its own session:
    the sum is both runs, none lost, none twice. The events are the hub's own, as the hub sends
    them for a no-GPU job server: ``server_start`` (the hub's clock, before the server is
    launched), the observer's span whose first second is the command's start as the kernel's
    process table reads it (here 0.4 s before the hub's clock said the server started), and
    ``server_stop``. Before: attempt 2's span was booked on attempt 1's session, clipped to its
    window: attempt 2 billed 0 s."""
    user = bhub.create_user(f"r{uuid.uuid4().hex[:8]}")
    billing = Billing(bhub)
    server = f"job-{90000 + uuid.uuid4().int % 9999}"
    now = time.time()
    t1 = now - 100.0  # attempt 1 starts; runs 30 s; attempt 2 starts 1 s after its stop
    t2 = t1 + 31.0
    runs = {1: (t1, 30.0, "a1"), 2: (t2, 40.0, "a2")}  # attempt -> start, seconds, allocation
    skew = 0.4  # the process table's clock reads this much early
    for start, secs, alloc in runs.values():
        _hub_events(
            billing,
            [
                {
                    "id": f"hub-start-{uuid.uuid4()}",
                    "kind": "server_start",
                    "user": user,
                    "server": server,
                    "t": start,
                    "gpu": "none",
                    "gpus": 0,
                    "pricing": "on-demand",
                    "options": {"gpu": "none", "gpus": 0},
                }
            ],
        )
        first = start + 0.1 - skew  # the command started 0.1 s after the hub's clock
        last = start + secs
        span = f"{uuid.uuid4().hex}{alloc}-1"
        samples = [first + 1.0 + k for k in range(0, int(secs) - 1, 5)] + [last]
        _hub_events(
            billing,
            [
                {
                    "id": f"activity-{user}-{server}-{span}-{t:.3f}",
                    "kind": "activity",
                    "user": user,
                    "server": server,
                    "span": span,
                    "first": first,
                    "t": t,
                }
                for t in samples
            ]
            + [
                {
                    "id": f"hub-stop-{uuid.uuid4()}",
                    "kind": "server_stop",
                    "user": user,
                    "server": server,
                    "t": last + 0.2,
                }
            ],
        )
    rows = sessions_of(billing, user, server)
    assert len(rows) == 2, rows
    a1, a2 = rows
    # Each attempt billed its own run (from its session's start: at most the skew is cut off),
    # and each lists its own span only.
    assert 29.5 <= a1["billed_seconds"] <= 30.01, a1
    assert 39.5 <= a2["billed_seconds"] <= 40.01, a2
    assert len(a1["observed"]) == 1 and a1["observed"][0]["span"].endswith("a1-1"), a1["observed"]
    assert len(a2["observed"]) == 1 and a2["observed"][0]["span"].endswith("a2-1"), a2["observed"]
    assert 69.0 <= sum(r["billed_seconds"] for r in rows) <= 70.02, rows
