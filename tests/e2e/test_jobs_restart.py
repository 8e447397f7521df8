"""Training jobs outlive the hub process (issue 26: "jobs that outlive the browser"; the hub's
own restarts too), with real parts: a root hub with the local spawner, SIGKILLed as in a crash
(its servers and the proxy stay), then started again on the same data dir.

- A job running when the hub dies keeps running; the restarted hub restores its server, sees it
  end and finishes the job once (no second attempt, no second run).
- A job the hub was about to start, and jobs still queued, are neither lost nor started twice.
"""

from __future__ import annotations

import os
import re

import pytest
from harness import Hub, wait_for
from jobs_helpers import Jobs, job_servers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")

FAST = ["--JobScheduler.interval=0.3", "--JobScheduler.retry_seconds=1"]


def runs_of(text: str, job_id: int) -> int:
    return len(re.findall(rf"^run-of-{job_id}$", text, re.M))


def test_a_job_survives_a_hub_killed_and_restarted_and_runs_once(hub_factory) -> None:
    """Issue 26, Done-when (restart): the hub SIGKILLed while a job runs; restarted, it keeps
    the job (its server restored), sees it end with its exit code and finishes it: succeeded,
    one attempt, the command ran once; its card is free afterwards."""
    hub: Hub = hub_factory("jobsrestart", simulate="RTX-4090:1", extra_args=FAST)
    user = hub.create_user()
    jobs = Jobs(hub, user)
    job = jobs.submit(
        command='echo "run-of-$GPULAB_JOB_ID"; sleep 6; echo finished', gpu="rtx-4090", gpus=1
    )
    jid = job["id"]
    jobs.wait_state(jid, "running")
    wait_for(lambda: runs_of(jobs.log(jid), jid) == 1, 30, 0.2, "the command to print")
    pid = hub.user(user)["servers"][f"job-{jid}"]["state"]["pid"]
    hub.kill()
    os.kill(pid, 0)  # the job's server outlives the hub, as it would in a real crash
    hub.start()
    done = jobs.wait_state(jid, "succeeded", "failed", "queued", timeout=120)
    assert done["state"] == "succeeded", done
    assert done["exit_code"] == 0 and len(done["attempts"]) == 1, done
    out = jobs.log(jid)
    assert runs_of(out, jid) == 1 and "finished" in out, out
    wait_for(lambda: not job_servers(hub, user), 30, what="the job's server to be gone")
    assert hub.free("rtx-4090") == 1


def test_queued_and_starting_jobs_are_neither_lost_nor_started_twice(hub_factory) -> None:
    """Issue 26 (restart): jobs queued behind a running one when the hub is SIGKILLed are all
    there after the restart and each runs exactly once (the store's append-only record and the
    allocator's ledger; a job saved as starting whose server never appeared is requeued)."""
    hub: Hub = hub_factory("jobsrestart2", simulate="RTX-4090:1", extra_args=FAST)
    user = hub.create_user()
    jobs = Jobs(hub, user)
    ids = [
        jobs.submit(command='echo "run-of-$GPULAB_JOB_ID"; sleep 2', gpu="rtx-4090", gpus=1)["id"]
        for _ in range(3)
    ]
    jobs.wait_state(ids[0], "running", "succeeded")
    hub.kill()
    hub.start()
    for jid in ids:
        done = jobs.wait_state(jid, "succeeded", "failed", timeout=120)
        assert done["state"] == "succeeded", done
        assert runs_of(jobs.log(jid), jid) == 1, jobs.log(jid)
    listed = jobs.call("GET").json()["jobs"]
    assert sorted(j["id"] for j in listed) == sorted(ids)
    wait_for(lambda: not job_servers(hub, user), 30, what="the job servers to be gone")
    assert hub.free("rtx-4090") == 1


def test_a_job_stopped_by_the_hubs_own_shutdown_is_requeued_not_failed(hub_factory) -> None:
    """Issue 26 (restart): `gpulab up` stopped (SIGTERM, Ctrl-C) stops every server before it
    exits, a running job's included; the job's command did not fail (its exit code is the stop's
    143): the next hub requeues it as lost work and runs it to its end."""
    hub: Hub = hub_factory("jobsshutdown", simulate="RTX-4090:1", extra_args=FAST)
    user = hub.create_user()
    jobs = Jobs(hub, user)
    job = jobs.submit(
        command='echo "run-of-$GPULAB_JOB_ID"; [ "$GPULAB_JOB_ATTEMPT" = 1 ] && sleep 600; true',
        gpu="rtx-4090",
        gpus=1,
    )
    jid = job["id"]
    jobs.wait_state(jid, "running")
    wait_for(lambda: runs_of(jobs.log(jid), jid) == 1, 30, 0.2, "the command to print")
    hub.stop()
    hub.start()
    done = jobs.wait_state(jid, "succeeded", "failed", "cancelled", timeout=120)
    assert done["state"] == "succeeded", done
    assert [a["end"] for a in done["attempts"]] == ["lost", "exited"], done["attempts"]
    assert runs_of(jobs.log(jid), jid) == 2
