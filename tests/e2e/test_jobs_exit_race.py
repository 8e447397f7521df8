"""A job's exit code survives JupyterHub's own poll finding its server stopped first (issue 26).

A real root hub with the local spawner and the billing service. JupyterHub polls every server
each second (``c.Spawner.poll_interval = 1``), and the hub's config adds one test-only wrapper of
the job scheduler's watch: a running job is looked at only once its server is no longer active,
so JupyterHub's poll always notices the job runner's exit first, stops the server and drops its
spawner, as it did for about half of the jobs on a live hub (red team, finding F1). Before the
fix the scheduler then read no exit code (the spawner that saw it was gone) and recorded
``node_failed``: the job was requeued, ran again from scratch and was billed again. The user
sees their jobs through the jobs API with their own token, and their statement from billing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from billing.client import Billing
from conftest import require
from harness import FAST_BILLING_ENV, ConfigFileHub, wait_for
from jobs_helpers import Jobs, job_servers

CONFIG = """\
from gpulab.hub_config.config import configure
from gpulab.hub_config.jobs.scheduler import JobScheduler

configure(c)
c.Spawner.poll_interval = 1
c.JobScheduler.interval = 0.3
c.JobScheduler.retry_seconds = 1

_watch = JobScheduler._watch


async def watch_after_hubs_own_poll(self, job, now):
    # Test only: a running job is watched only once its server is no longer active, so that
    # JupyterHub's own poll always sees the job runner's exit first (and drops its spawner).
    # A job whose command says UNSEEN is not watched while starting either: it runs and ends
    # before any pass of the scheduler saw it ready.
    unseen = job.state == "starting" and "UNSEEN" in job.spec.command
    if (job.state == "running" or unseen) and job.attempt is not None:
        spawners = [self.spawner_of(job, name) for name in job.attempt.servers]
        if any(s is not None and s.active for s in spawners):
            return
    await _watch(self, job, now)


JobScheduler._watch = watch_after_hubs_own_poll
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory, chp_installed):
    require(os.geteuid() == 0, "root (job servers run as the users' own accounts)")
    root = Path(tmp_path_factory.mktemp("jobs-exit-race"))
    config = root / "site" / "jupyterhub_config.py"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG)
    hub = ConfigFileHub(root / "data", config)
    hub.extra_env.update(
        FAST_BILLING_ENV, GPULAB_ADMIN_TOKEN=hub.token, GPULAB_SIMULATE_GPUS="RTX-4090:2"
    )
    hub.start()
    wait_for(Billing(hub).up, 30, 0.2, "the billing service")
    yield hub
    hub.stop()


def test_jobs_ending_together_keep_their_exit_codes_and_run_once(hub: ConfigFileHub) -> None:
    """Issue 26 (a job's state, exit code and attempts kept; only preemption or a node failure
    requeues; billed for what ran): four jobs (two on a card each, two without one) that end
    together, two with exit code 0 and two with 3, while JupyterHub's poll finds each server
    stopped before the scheduler looks. Each job ends ``exited`` with its own exit code after
    exactly one attempt (succeeded for 0, failed for 3), its command ran once (one line of its
    output), no job server is left, and the owner's statement has one session per job. Failed
    before the fix: the attempts ended ``node_failed`` with no exit code and the jobs ran again."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    billing = Billing(hub)
    wanted = {}
    for gpu, gpus, code in (("rtx-4090", 1, 0), ("rtx-4090", 1, 3), ("none", 0, 0), ("none", 0, 3)):
        job = jobs.submit(
            command=f"echo command-of-job-$GPULAB_JOB_ID-ran; sleep 4; exit {code}",
            gpu=gpu,
            gpus=gpus,
            max_attempts=3,
        )
        wanted[job["id"]] = code
    done = {jid: jobs.wait_state(jid, "succeeded", "failed", "cancelled") for jid in wanted}
    for jid, code in wanted.items():
        job = done[jid]
        assert [(a["end"], a["exit_code"]) for a in job["attempts"]] == [("exited", code)], (
            job["attempts"],
            job["reason"],
        )
        assert job["exit_code"] == code, job
        assert job["state"] == ("succeeded" if code == 0 else "failed"), job
        assert jobs.log(jid).count(f"command-of-job-{jid}-ran") == 1, jobs.log(jid)
    wait_for(lambda: not job_servers(hub, user), 30, what="the job servers to be gone")

    def on_statement() -> dict | None:
        lines = {j["job"]: j for j in billing.usage(user)["jobs"]["jobs"] if not j["running"]}
        return lines if set(wanted) <= set(lines) else None

    lines = wait_for(on_statement, 30, 0.5, "the statement to show every job")
    for jid in wanted:
        assert len(lines[jid]["sessions"]) == 1, lines[jid]
    # Nothing started again after the ends (a requeued attempt would be a second session).
    again = {jid: jobs.get(jid) for jid in wanted}
    assert all(len(j["attempts"]) == 1 for j in again.values()), again


def test_a_job_that_ends_before_the_scheduler_saw_it_ready_keeps_its_exit(
    hub: ConfigFileHub,
) -> None:
    """Issue 26 (a job's exit code kept; only preemption or a node failure requeues): a job whose
    runner starts, runs its command and exits, and whose server JupyterHub's poll stops, all
    before a pass of the scheduler saw it ready (a loaded hub). It ends ``exited`` with its own
    exit code after one attempt and runs once. Failed before the fix: the attempt ended as a
    start that was lost, and the job was queued again and ran a second time."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    job = jobs.submit(command="echo UNSEEN-$GPULAB_JOB_ID; exit 4", gpu="none", gpus=0)
    done = jobs.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert [(a["end"], a["exit_code"]) for a in done["attempts"]] == [("exited", 4)], done
    assert done["state"] == "failed" and done["exit_code"] == 4, done
    assert jobs.log(job["id"]).count(f"UNSEEN-{job['id']}") == 1, jobs.log(job["id"])
