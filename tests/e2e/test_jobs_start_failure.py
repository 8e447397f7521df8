"""A job whose server start is refused for good fails once, with the start's own error (issue 26).

A real root hub with the local spawner; its config adds one test-only ``pre_spawn_hook`` that
raises for a job server whose command carries a marker, so JupyterHub's POST of that server (the
job scheduler's start, with the platform's token) answers 500 at once. The scheduler then ends the
attempt as ``start_failed``. Before commit 83899bb the start task's ``finally`` cleared the busy
mark the end task had just set, so the next pass ended the same attempt a second time, as
``lost``: the job was requeued and ran again, and the start error was lost. The user sees the job
only through the jobs API, with their own token.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import require
from harness import ConfigFileHub, Receiver, wait_for
from jobs_helpers import Jobs, job_servers

MARKER = "gpulab-test-refuse-start"
REFUSAL = "test-only refusal of this job server"

CONFIG = """\
import asyncio

from tornado import web

from gpulab.hub_config.config import configure
from gpulab.hub_config.jobs import logs
from gpulab.spawners.jobs.launch import launch_for

configure(c)
c.JobScheduler.interval = 0.3
c.JobScheduler.retry_seconds = 1
c.SpotMarket.webhook_allowed_networks = ["127.0.0.0/8"]


def refuse_marked_job_servers(spawner):
    # Test only: a job server whose command carries the marker is refused before it starts
    # (JupyterHub's POST of the server answers 500 at once, with this message).
    launch = launch_for(spawner.owner)
    if launch is not None and {marker!r} in launch.command:
        raise web.HTTPError(500, {refusal!r})


c.Spawner.pre_spawn_hook = refuse_marked_job_servers

# Test only: an attempt's end takes a second longer (its output is archived for real, then it
# waits), so that scheduler passes surely run while it ends, as on a loaded hub.
_archive_attempt = logs.archive_attempt


async def slow_archive_attempt(*args, **kwargs):
    done = await _archive_attempt(*args, **kwargs)
    await asyncio.sleep(1.0)
    return done


logs.archive_attempt = slow_archive_attempt
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory, chp_installed):
    require(os.geteuid() == 0, "root (job servers run as the users' own accounts)")
    root = Path(tmp_path_factory.mktemp("jobs-start-failure"))
    config = root / "site" / "jupyterhub_config.py"
    config.parent.mkdir(parents=True)
    config.write_text(CONFIG.format(marker=MARKER, refusal=REFUSAL))
    hub = ConfigFileHub(root / "data", config)
    hub.extra_env.update(GPULAB_ADMIN_TOKEN=hub.token, GPULAB_SIMULATE_GPUS="RTX-4090:1")
    hub.start()
    yield hub
    hub.stop()


def test_a_refused_start_fails_the_job_once_with_its_error(hub: ConfigFileHub) -> None:
    """Issue 26 (Jobs: a job's state and why; exit/attempts kept; a failure of the start is not a
    preemption): a job whose server the hub refuses to start (POST answered 500) ends failed
    exactly once: one attempt, ended ``start_failed``, its note and the job's reason carrying the
    start's own error; it is not requeued nor run again, and no job server is left. Failed on the
    code before 83899bb (the attempt ended a second time as ``lost`` and the job was queued)."""
    receiver = Receiver()

    def deliveries() -> list[dict]:
        return [json.loads(body) for _, body in receiver.deliveries]

    try:
        user = hub.create_user()
        jobs = Jobs(hub, user)
        url = receiver.url
        r = hub.api(
            "PUT", f"/gpulab/spot/settings/{user}", token=jobs.token, json={"webhook_url": url}
        )
        assert r.status_code == 200, r.text
        refused = jobs.submit(command=f"echo {MARKER}; sleep 1", gpu="none", gpus=0)
        done = jobs.wait_state(refused["id"], "failed", "succeeded", "cancelled")
        assert done["attempts"][0]["end"] == "start_failed", done
        # Scheduler passes go on: a job submitted after it starts, runs and ends (and its webhook
        # arrives). By then a second end of the refused attempt (the old bug: on the very next
        # pass) would have happened and been announced.
        later = jobs.submit(command="echo later-job-ran", gpu="none", gpus=0)
        assert jobs.wait_state(later["id"], "succeeded", "failed")["state"] == "succeeded"
        assert "later-job-ran" in jobs.log(later["id"])
        wait_for(
            lambda: any(d["job"]["id"] == later["id"] for d in deliveries()),
            30,
            0.2,
            "the later job's webhook",
        )
        wait_for(lambda: not job_servers(hub, user), 30, what="the job servers to be gone")
    finally:
        receiver.close()

    job = jobs.get(refused["id"])
    assert job["state"] == "failed", job
    assert len(job["attempts"]) == 1, job["attempts"]
    attempt = job["attempts"][0]
    assert attempt["end"] == "start_failed", attempt
    assert REFUSAL in attempt["note"], attempt
    assert job["reason"].startswith("could not start") and REFUSAL in job["reason"], job
    assert job["exit_code"] is None, job
    # It never ran: the command's marker is nowhere in its output.
    assert f"echo {MARKER}" not in jobs.log(refused["id"])
    # The owner is told once that it failed: one webhook, one notice (the old code announced
    # each of its ends).
    told = [d["event"] for d in deliveries() if d["job"]["id"] == refused["id"]]
    assert told == ["job-failed"], told
    r = hub.api("GET", f"/gpulab/users/{user}/notices")
    assert r.status_code == 200, r.text
    notices = [
        n["message"]
        for n in r.json()["notices"]
        if n["kind"] == "job" and n["message"].startswith(f"Job {refused['id']} ")
    ]
    assert len(notices) == 1 and "failed" in notices[0], notices
    # The hub ended that attempt once (the old code logged a second end, "lost" or again).
    ended = [
        line
        for line in hub.log_path.read_text(errors="replace").splitlines()
        if f"Job {refused['id']} of {user}: attempt" in line
    ]
    assert len(ended) == 1 and "start_failed" in ended[0], ended
