"""A spot job on a one-card GPU type is not preempted by the price its own card raises (issue 26,
red-team finding F5), while another user's on-demand start still reclaims it.

Real parts: a root hub with the local spawner, the spot market (a 3 s warning, fast ticks) and
the job scheduler, on a pool of one simulated H100 (floor 2.00, on demand 3.80). Taking the only
card moves the type's published price above the job's bid (utilisation pricing); the market used
to warn and stop the job at once, requeue it, start it again on the same card and warn it again,
so it could never run longer than the warning period. The price is left to the market here (no
pin): that is what the finding was about.
"""

from __future__ import annotations

import os
from decimal import Decimal

import jobs_helpers
import pytest
from harness import Hub, wait_for

WARNING = 3
RUN = 4 * WARNING  # the job's command runs well past the warning period
H100 = "h100-80g"
BID = "2.00"  # the H100's spot floor: the price before the job takes the card

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "jobselfprice",
        simulate="H100-80G:1",
        extra_args=[
            f"--SpotMarket.warning_seconds={WARNING}",
            "--SpotMarket.tick_interval=0.5",
            "--JobScheduler.interval=0.5",
            "--JobScheduler.retry_seconds=1",
        ],
    )


class Jobs(jobs_helpers.Jobs):
    """A user's jobs, and the hub's cancel of everyone's after a test."""

    def cancel_all(self) -> None:
        for j in self.hub.api("GET", "/gpulab/admin/jobs").json().get("jobs", []):
            if j["owner"] == self.user and j["state"] not in ("succeeded", "failed", "cancelled"):
                r = self.hub.api(
                    "DELETE", f"/gpulab/users/{self.user}/jobs/{j['id']}", token=self.token
                )
                assert r.status_code == 202, r.text


def preemptions(hub: Hub, user: str) -> list[dict]:
    r = hub.api("GET", "/gpulab/spot/preemptions")
    assert r.status_code == 200, r.text
    return [p for p in r.json()["preemptions"] if p["user"] == user]


def published_price(hub: Hub) -> Decimal:
    r = hub.api("GET", "/gpulab/spot/prices")
    assert r.status_code == 200, r.text
    return Decimal(next(t["price"] for t in r.json()["gpu_types"] if t["slug"] == H100))


def spot_job(jobs: Jobs, command: str, **extra) -> int:
    return jobs.submit(
        command=command,
        gpu=H100,
        gpus=1,
        pricing="spot",
        max_price=BID,
        checkpoint_interval=0,
        **extra,
    )["id"]


def test_a_spot_job_on_the_only_card_runs_past_the_warning_period(hub: Hub) -> None:
    """The job's one attempt runs its whole command ({RUN} s, four warning periods) and exits 0;
    no preemption is recorded for its owner, though the published price (what billing caps by
    the bid) rose above the bid as soon as the job took the card."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    try:
        assert published_price(hub) == Decimal(BID)
        job_id = spot_job(jobs, f"sleep {RUN}; echo done", name="only card", max_attempts=1)
        wait_for(
            lambda: jobs.get(job_id)["state"] == "running",
            timeout=60,
            interval=0.2,
            what="the spot job to run",
        )
        # The job's own card raised the price the market publishes above its bid.
        wait_for(
            lambda: published_price(hub) > Decimal(BID),
            timeout=10,
            interval=0.2,
            what="the published H100 price to count the job's card",
        )
        job = wait_for(
            lambda: (j := jobs.get(job_id))["state"] in ("succeeded", "failed", "cancelled") and j,
            timeout=RUN + 60,
            interval=0.3,
            what="the job to end",
        )
        assert job["state"] == "succeeded" and job["exit_code"] == 0, job
        assert [a["end"] for a in job["attempts"]] == ["exited"], job["attempts"]
        assert preemptions(hub, user) == []
        wait_for(lambda: hub.free(H100) == 1, timeout=30, what="the card to be free again")
    finally:
        jobs.cancel_all()


def test_another_users_on_demand_start_still_reclaims_the_spot_job(hub: Hub) -> None:
    """Self-pricing aside, the spot job stays a spot job: an on-demand start by another user
    reclaims its card after the warning, and the job waits in the queue again."""
    user, other = hub.create_user(), hub.create_user()
    jobs = Jobs(hub, user)
    try:
        job_id = spot_job(jobs, "sleep 600", name="reclaimed", max_attempts=3)
        wait_for(
            lambda: jobs.get(job_id)["state"] == "running",
            timeout=60,
            interval=0.2,
            what="the spot job to run",
        )
        r = hub.spawn(other, {"gpu": H100})
        assert r.status_code == 202, r.text
        assert "reclaimed" in r.json()["message"], r.text
        hub.wait_ready(other, timeout=WARNING + 60)
        assert hub.server(other)["user_options"]["pricing"] == "on-demand"
        # One preemption, for the other user's start: the waiting on-demand request is demand
        # for the card, which also lifts the market's price above the bid, so the market may
        # name either reason; before it, nothing (the job's own card never warned it).
        records = preemptions(hub, user)
        assert len(records) == 1, records
        assert records[0]["reason"] in ("on-demand-reclaim", "price-above-max"), records
        job = wait_for(
            lambda: (j := jobs.get(job_id))["state"] == "queued" and j["attempts"] and j,
            timeout=60,
            interval=0.3,
            what="the reclaimed job to wait in the queue again",
        )
        assert job["attempts"][-1]["end"] == "preempted", job["attempts"]
    finally:
        jobs.cancel_all()
        if hub.server(other) is not None:
            hub.stop_server(other)
