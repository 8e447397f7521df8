"""Training jobs between users, and against money (issue 26), with real parts: a root hub, the
local spawner (each job server as its owner's account, in its own cgroup), the real billing
service (its enforcer every second) and the hub's observer.

- A job submitted by one user is invisible to another: not listed, 404 on read, log and cancel
  (the same 404 as a job that does not exist), and never on the other's statement.
- A job that forks a detached process: the process dies when the job ends.
- A job whose balance runs out is stopped by billing's enforcer and ends failed, "balance ran
  out", without being queued again.
- A job server runs no usage reporter (the runner is not a Jupyter server): billing does not stop
  it as "silent" (it is metered from the hub's own observation).
"""

from __future__ import annotations

import os
import time
import uuid
from decimal import Decimal

import pytest
from billing.client import Billing
from harness import FAST_BILLING_ENV, HB, Hub, pids_whose_argv, wait_for
from jobs_helpers import Jobs, job_servers

SILENT = 5.0
ENV = {
    **FAST_BILLING_ENV,
    "GPULAB_BILLING_ARGS": (
        f"--BillingService.heartbeat_interval={HB} --BillingService.enforce_interval=1 "
        f"--BillingService.switch_margin=2 --BillingService.silent_timeout={SILENT} "
        "--BillingService.idle_timeout=600"
    ),
}
OBSERVER = [
    "--ActivityObserver.interval=0.5",
    "--ActivityObserver.report_interval=1",
    "--JobScheduler.interval=0.3",
    "--JobScheduler.retry_seconds=1",
]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")


@pytest.fixture(scope="module")
def ihub(module_hub_factory) -> Hub:
    h = module_hub_factory("jobsiso", simulate="A100-80G:2", env=ENV, extra_args=OBSERVER)
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


def new_user(hub: Hub) -> str:
    return hub.create_user(f"j{uuid.uuid4().hex[:8]}")


def test_another_user_cannot_see_read_cancel_or_be_billed_for_my_job(ihub: Hub) -> None:
    """Issue 26, tests: a job submitted by one user that another cannot see, read, cancel or be
    billed for. Bob, with his own token, asks for Alice's job under his name and under hers:
    every answer is the 404 of a job that does not exist; his list is empty; his cancel stops
    nothing; Alice's job runs to its end and is on her statement only."""
    alice, bob = new_user(ihub), new_user(ihub)
    mine, his = Jobs(ihub, alice), Jobs(ihub, bob)
    billing = Billing(ihub)
    job = mine.submit(command="echo alices-secret; sleep 4", gpu="a100-80g", gpus=1)
    jid = job["id"]
    mine.wait_state(jid, "running")
    missing = his.call("GET", "/999999")
    assert missing.status_code == 404
    for owner in (bob, alice):
        base = f"/gpulab/users/{owner}/jobs/{jid}"
        for method, path in (
            ("GET", ""),
            ("GET", "/log"),
            ("GET", "/log?follow=1"),
            ("DELETE", ""),
        ):
            r = ihub.api(method, base + path, token=his.token)
            assert r.status_code == 404, (owner, method, path, r.status_code, r.text)
            assert r.json() == missing.json(), r.text
            assert "alices-secret" not in r.text
    r = ihub.api("GET", f"/gpulab/users/{alice}/jobs", token=his.token)
    assert r.status_code == 404 and "alices-secret" not in r.text
    assert his.call("GET").json()["jobs"] == []
    r = ihub.api("DELETE", f"/users/{alice}/servers/job-{jid}", token=his.token)
    assert r.status_code in (403, 404), r.text
    assert ihub.api("GET", "/gpulab/admin/jobs", token=his.token).status_code == 403
    every = ihub.api("GET", "/gpulab/admin/jobs?state=running").json()["jobs"]  # the admin
    assert [j["owner"] for j in every if j["id"] == jid] == [alice]
    done = mine.wait_state(jid, "succeeded", "failed", "cancelled")
    assert done["state"] == "succeeded" and done["stopped_by"] is None, done
    assert "alices-secret" in mine.log(jid)

    def on_statement() -> dict | None:
        jobs = billing.usage(alice)["jobs"]["jobs"]
        return next((j for j in jobs if j["job"] == jid and not j["running"]), None)

    line = wait_for(on_statement, 30, 0.5, "Alice's statement to show the job")
    assert line["job_seconds"] > 0
    theirs = billing.usage(bob)
    assert theirs["servers"] == [] and theirs["jobs"]["jobs"] == [], theirs
    assert Decimal(theirs["total"]["amount"]["exact"]) == 0, theirs["total"]


def test_a_detached_process_dies_with_the_job(ihub: Hub) -> None:
    """Issue 26, tests: a job that forks a detached process (its own session, stdio closed, the
    parent gone) which dies with the job: once the command exits, nothing of it runs on."""
    jobs = Jobs(ihub, new_user(ihub))
    mark = str(4000 + uuid.uuid4().int % 1000) + ".5"
    job = jobs.submit(
        command=f"setsid sleep {mark} </dev/null >/dev/null 2>&1 & sleep 3; echo parent-done",
        gpu="none",
        gpus=0,
    )

    def detached() -> list[int]:
        return pids_whose_argv(lambda argv: argv[:2] == ["sleep", mark])

    wait_for(detached, 60, 0.2, "the detached process to run")
    done = jobs.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded", done
    wait_for(lambda: not detached(), 30, 0.2, "the detached process to die with the job")
    assert "parent-done" in jobs.log(job["id"])


def test_a_job_whose_balance_runs_out_fails_without_requeue(ihub: Hub) -> None:
    """Issue 26, tests: a job whose balance runs out. Billing's enforcer stops its server (the
    cards go back at once); the job ends failed, "balance ran out", and is not queued again."""
    user = new_user(ihub)
    jobs = Jobs(ihub, user)
    billing = Billing(ihub)
    free = ihub.free("a100-80g")
    job = jobs.submit(command="sleep 600", gpu="a100-80g", gpus=1, max_attempts=5)
    jobs.wait_state(job["id"], "running")
    assert ihub.free("a100-80g") == free - 1
    # The money runs out while it runs (all of it, and a little more).
    balance = billing.balance(user)["balance"]["exact"]
    billing.credit(user, f"-{balance}")
    billing.credit(user, "-0.01")
    done = jobs.wait_state(job["id"], "failed", "cancelled", "succeeded", "queued", timeout=60)
    assert done["state"] == "failed", done
    assert done["reason"] == "balance ran out" and done["stopped_by"] == "billing", done
    assert [a["end"] for a in done["attempts"]] == ["balance"], done
    wait_for(lambda: not job_servers(ihub, user), 30, 0.2, "the job's server to be gone")
    assert ihub.free("a100-80g") == free
    time.sleep(2.0)  # scheduler passes: it stays failed, nothing is started again
    again = jobs.get(job["id"])
    assert again["state"] == "failed" and len(again["attempts"]) == 1, again
    assert not job_servers(ihub, user)


def test_a_job_is_not_stopped_as_silent(ihub: Hub) -> None:
    """Issue 26: a job needs no open browser nor Jupyter server; no usage reporter runs in a job
    server, and billing (which stops servers whose reporter went silent) lets it run: it is
    metered from what the hub observes."""
    jobs = Jobs(ihub, new_user(ihub))
    job = jobs.submit(command=f"sleep {3 * SILENT + 3}; echo slept", gpu="a100-80g", gpus=1)
    done = jobs.wait_state(job["id"], "succeeded", "failed", timeout=120)
    assert done["state"] == "succeeded" and done["stopped_by"] is None, done


def test_billings_move_to_no_gpu_ends_a_job_and_never_reruns_it(hub_factory) -> None:
    """Issue 26 + the guard: billing moves a GPU server whose balance cannot pay its margin to
    no-GPU mode by stopping it and starting it again without a GPU. For a job's server that
    restart would run the job's command a second time, unpaid for on the GPU it was given up for:
    only the platform may start a job-* server, so the move is a stop, and the job ends failed,
    "balance ran out", with no server of it left running."""
    env = {
        **FAST_BILLING_ENV,
        "GPULAB_BILLING_ARGS": (
            f"--BillingService.heartbeat_interval={HB} --BillingService.enforce_interval=1 "
            "--BillingService.switch_margin=90 --BillingService.idle_timeout=600"
        ),
    }
    hub = hub_factory("jobsnogpu", simulate="A100-80G:1", env=env, extra_args=OBSERVER)
    billing = Billing(hub)
    wait_for(billing.up, 30, 0.2, "the billing service")
    user = new_user(hub)
    jobs = Jobs(hub, user)
    job = jobs.submit(command='echo "run-of-$GPULAB_JOB_ID"; sleep 600', gpu="a100-80g", gpus=1)
    jobs.wait_state(job["id"], "running")
    # Left: 0.02, which pays a minute of no-GPU (0.0015) but not 90 s of the A100 (0.0525).
    balance = Decimal(billing.balance(user)["balance"]["exact"])
    billing.credit(user, str(Decimal("0.02") - balance))
    done = jobs.wait_state(job["id"], "failed", "cancelled", "succeeded", "queued", timeout=60)
    assert done["state"] == "failed" and done["reason"] == "balance ran out", done
    assert [a["end"] for a in done["attempts"]] == ["balance"], done
    time.sleep(3.0)  # billing's restart attempt and scheduler passes: nothing runs again
    assert not job_servers(hub, user), hub.user(user)["servers"]
    assert jobs.log(job["id"]).count(f"run-of-{job['id']}") == 1
    assert len(jobs.get(job["id"])["attempts"]) == 1


def test_a_reservation_is_honoured_for_its_holders_job_and_against_others(ihub: Hub) -> None:
    """Issue 26, Queues: reservations are honoured. Alice reserved an A100 for the month; with
    the other card held by someone's server, Bob's job waits (the reserved card is not his, and
    the reason says none is free), while Alice's job starts on her own reserved card."""
    billing = Billing(ihub)
    alice, bob, carol = new_user(ihub), new_user(ihub), new_user(ihub)
    billing.credit(alice, "5000")
    mine, his = Jobs(ihub, alice), Jobs(ihub, bob)
    month = time.strftime("%Y-%m", time.gmtime())
    r = ihub.api(
        "POST",
        "/gpulab/reservations",
        token=mine.token,
        json={
            "account": f"user:{alice}",
            "gpu_type": "a100-80g",
            "cards": 1,
            "month": month,
            "idempotency_key": f"{alice}-{month}",
        },
    )
    assert r.status_code in (200, 201), r.text
    ihub.spawn_ready(carol, {"gpu": "a100-80g"})
    try:
        waiting = his.submit(command="echo bob", gpu="a100-80g", gpus=1)
        job = mine.submit(command="echo alice; sleep 2", gpu="a100-80g", gpus=1)
        done = mine.wait_state(job["id"], "succeeded", "failed")
        assert done["state"] == "succeeded", done
        assert "alice" in mine.log(job["id"])
        bobs = his.get(waiting["id"])
        assert bobs["state"] == "queued", bobs
        assert "waiting for 1 x A100" in bobs["reason"] and "(0 free" in bobs["reason"], bobs
    finally:
        ihub.stop_server(carol)
    his.call("DELETE", f"/{waiting['id']}")
