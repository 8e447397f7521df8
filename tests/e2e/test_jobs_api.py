"""Training jobs through the hub's REST API and the ``gpulab jobs`` CLI, with real parts (issue 26).

A root hub with the local spawner runs each job as its owner's ``job-ID`` server (the job runner
as the user's own account, in the server's cgroup), started by the hub's job scheduler with the
platform's token; the tests act only as users would: their own tokens, the API, the CLI.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time

import pytest
from harness import PASSWORD, Hub, Receiver, WebSession, approved_user, wait_for
from jobs_helpers import Jobs, cli, job_servers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "jobsapi",
        simulate="RTX-4090:2",
        extra_args=[
            "--JobScheduler.interval=0.3",
            "--JobScheduler.retry_seconds=1",
            "--JobScheduler.max_running_per_user=2",
            "--SpotMarket.webhook_allowed_networks=127.0.0.0/8",
        ],
    )


def test_a_job_runs_to_success_and_its_output_is_kept(hub: Hub) -> None:
    """Issue 26, Jobs: submit -> running -> succeeded with exit code 0; stdout and stderr kept
    and readable through the API and `gpulab jobs logs`; it needs no running server and no
    browser; its cards are free again once it ended."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    free = hub.free("rtx-4090")
    job = jobs.submit(
        command="echo hello from $GPULAB_JOB_ID; echo to-stderr >&2; "
        'echo "cards=$CUDA_VISIBLE_DEVICES"; sleep 2',
        gpu="rtx-4090",
        gpus=1,
        name="hello",
    )
    assert job["state"] == "queued" and job["owner"] == user
    running = jobs.wait_state(job["id"], "running", "succeeded")
    if running["state"] == "running":
        assert hub.free("rtx-4090") == free - 1
        assert list(job_servers(hub, user)) == [f"job-{job['id']}"]
    done = jobs.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded", done
    assert done["exit_code"] == 0 and done["attempts"][0]["end"] == "exited"
    out = jobs.log(job["id"])
    assert f"hello from {job['id']}" in out and "to-stderr" in out and "cards=" in out
    wait_for(lambda: not job_servers(hub, user), 30, what="the job's server to be gone")
    assert hub.free("rtx-4090") == free
    r = cli(hub, jobs.token, "logs", str(job["id"]))
    assert r.returncode == 0, r.stderr
    assert f"hello from {job['id']}" in r.stdout
    r = cli(hub, jobs.token, "list")
    assert r.returncode == 0 and "succeeded" in r.stdout and "hello" in r.stdout, r.stdout


def test_a_failing_command_fails_the_job_with_its_exit_code(hub: Hub) -> None:
    """Issue 26, Jobs: exit code kept; a command that exits 3 is a failed job with exit_code 3
    (and no second attempt: a failure of the command is not a preemption)."""
    jobs = Jobs(hub, hub.create_user())
    job = jobs.submit(command="echo about to fail; exit 3", gpu="none", gpus=0)
    done = jobs.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "failed" and done["exit_code"] == 3, done
    assert len(done["attempts"]) == 1
    assert "about to fail" in jobs.log(job["id"])


def test_cancel_a_running_job_and_a_queued_one(hub: Hub) -> None:
    """Issue 26, Jobs: cancel. A running job's server is stopped and its cards are free at once,
    the job is cancelled (through the jobs API, or by stopping its server through JupyterHub's
    API); a queued job is cancelled before it ever starts."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    free = hub.free("rtx-4090")
    long = jobs.submit(command="sleep 600", gpu="rtx-4090", gpus=1)
    jobs.wait_state(long["id"], "running")
    assert hub.free("rtx-4090") == free - 1
    r = jobs.call("DELETE", f"/{long['id']}")
    assert r.status_code == 202, r.text
    done = jobs.wait_state(long["id"], "cancelled", "failed", "succeeded")
    assert done["state"] == "cancelled" and done["attempts"][-1]["end"] == "cancelled", done
    wait_for(lambda: not job_servers(hub, user), 30, what="the job's server to stop")
    assert hub.free("rtx-4090") == free

    # Stopping a job's server through JupyterHub's own API (the owner's token) cancels it too.
    other_long = jobs.submit(command="sleep 600", gpu="rtx-4090", gpus=1)
    jobs.wait_state(other_long["id"], "running")
    r = hub.api("DELETE", f"/users/{user}/servers/job-{other_long['id']}", token=jobs.token)
    assert r.status_code in (202, 204), r.text
    done = jobs.wait_state(other_long["id"], "cancelled", "failed", "succeeded", "queued")
    assert done["state"] == "cancelled" and done["stopped_by"] == "user", done
    wait_for(lambda: not job_servers(hub, user), 30, what="the job's server to stop")

    # A job that cannot start (more cards than are free) waits; cancelled, it never starts.
    other = hub.create_user()
    hub.spawn_ready(other, {"gpu": "rtx-4090", "gpus": 2})
    try:
        queued = jobs.submit(command="echo never", gpu="rtx-4090", gpus=1)
        time.sleep(1.0)  # a few scheduler passes: it must still wait (no card is free)
        assert jobs.get(queued["id"])["state"] == "queued"
        r = jobs.call("DELETE", f"/{queued['id']}")
        assert r.status_code == 202 and r.json()["state"] == "cancelled", r.text
    finally:
        hub.stop_server(other)
    time.sleep(1.0)  # passes with the cards free again: a cancelled job stays cancelled
    j = jobs.get(queued["id"])
    assert j["state"] == "cancelled" and j["attempts"] == [], j
    assert not job_servers(hub, user)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"gpu": "rtx-4090", "gpus": 1}, "command"),
        ({"command": "true", "gpu": "rtx-4090", "gpus": 9}, "gpus"),
        ({"command": "true", "gpu": "h100-80g", "gpus": 1}, "gpu"),
        ({"command": "true", "gpu": "rtx-4090", "gpus": 1, "cwd": "../bob"}, "cwd"),
        ({"command": "true", "gpu": "rtx-4090", "gpus": 1, "nodes": 2}, "nodes"),
        ({"command": "true", "gpu": "rtx-4090", "gpus": 1, "priority": 10}, "priority"),
        ({"command": "true", "gpu": "rtx-4090", "gpus": 1, "sneaky": 1}, "sneaky"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_creates_nothing(
    hub: Hub, spec: dict, field: str
) -> None:
    """Issue 26 (house rule): a bad job is 400 naming the field and what is allowed; no job, no
    server, no card, no charge."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    free = hub.free("rtx-4090")
    r = jobs.call("POST", json=spec)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body.get("field") == field and body["message"].startswith(f"{field}:"), body
    assert jobs.call("GET").json()["jobs"] == []
    assert not job_servers(hub, user) and hub.free("rtx-4090") == free


def test_only_the_platform_starts_job_servers(hub: Hub) -> None:
    """Issue 26 (contract): a user's own start of a server named job-* (REST POST, PUT, a rename
    by PATCH, the spawn form) is 403 naming server_name and starts or creates nothing, even for
    an existing job's name; their token cannot make a job server run their own options."""
    name = approved_user(hub, "jobguard")
    web = WebSession(hub)
    assert web.login(name, PASSWORD)
    jobs = Jobs(hub, name)
    free = hub.free("rtx-4090")
    for path, method, body in (
        (f"/users/{name}/servers/job-1", "POST", {"gpu": "rtx-4090"}),
        (f"/users/{name}/servers/job-1-0", "POST", {}),
        (f"/users/{name}/servers/job-7", "PUT", {}),
        (f"/users/{name}/servers/lab", "PATCH", {"name": "job-9"}),
    ):
        r = hub.api(method, path, token=jobs.token, json=body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        assert r.json().get("field") == "server_name", r.text
    r = web.post(f"/hub/spawn/{name}/job-1", {"gpu": "rtx-4090"}, allow_redirects=False)
    assert r.status_code == 403, r.status_code
    assert web.get(f"/hub/spawn/{name}/job-1").status_code == 403
    assert not job_servers(hub, name) and hub.free("rtx-4090") == free


def test_jobs_list_says_why_a_job_waits(hub: Hub) -> None:
    """Issue 26, Queues: `gpulab jobs list` says why each waits: here, the only free cards are
    held by another user's server; when they are freed, the job starts by itself."""
    user, other = hub.create_user(), hub.create_user()
    jobs = Jobs(hub, user)
    hub.spawn_ready(other, {"gpu": "rtx-4090", "gpus": 2})
    try:
        job = jobs.submit(command="echo ran", gpu="rtx-4090", gpus=1, name="waiter")

        def waiting() -> str | None:
            r = cli(hub, jobs.token, "list")
            assert r.returncode == 0, r.stderr
            line = next(ln for ln in r.stdout.splitlines() if "waiter" in ln)
            return line if "queued" in line and "waiting for 1" in line else None

        line = wait_for(waiting, 30, 0.5, "the list to say why the job waits")
        assert "RTX" in line or "rtx" in line, line
        assert jobs.get(job["id"])["state"] == "queued"
    finally:
        hub.stop_server(other)
    done = jobs.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded", done


def test_the_owner_is_told_when_a_job_ends(hub: Hub) -> None:
    """Issue 26, Jobs: notified on end: the user's own webhook gets a signed job-succeeded and a
    job-failed event (X-Gpulab-Event, HMAC with their webhook secret), and the home page's
    notices say how each job ended."""
    receiver = Receiver()
    try:
        user = hub.create_user()
        jobs = Jobs(hub, user)
        url = receiver.url
        r = hub.api(
            "PUT", f"/gpulab/spot/settings/{user}", token=jobs.token, json={"webhook_url": url}
        )
        assert r.status_code == 200, r.text
        secret = r.json()["webhook_secret"]
        good = jobs.submit(command="echo ok", gpu="none", gpus=0)
        bad = jobs.submit(command="exit 5", gpu="none", gpus=0)
        for job in (good, bad):
            jobs.wait_state(job["id"], "succeeded", "failed")

        def events() -> dict | None:
            got = {}
            for headers, body in receiver.deliveries:
                data = json.loads(body)
                got[data["job"]["id"]] = (headers, body, data)
            return got if {good["id"], bad["id"]} <= set(got) else None

        got = wait_for(events, 30, 0.2, "both webhooks")
        for job, event, state in (
            (good, "job-succeeded", "succeeded"),
            (bad, "job-failed", "failed"),
        ):
            headers, body, data = got[job["id"]]
            assert headers["X-Gpulab-Event"] == event and data["event"] == event
            assert data["job"]["state"] == state and data["job"]["owner"] == user
            sign = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
            assert headers["X-Gpulab-Signature"] == sign
        assert got[bad["id"]][2]["job"]["exit_code"] == 5
    finally:
        receiver.close()
    r = hub.api("GET", f"/gpulab/users/{user}/notices")
    texts = [n["message"] for n in r.json()["notices"] if n["kind"] == "job"]
    assert f"Job {good['id']} succeeded." in texts, texts
    assert any(t.startswith(f"Job {bad['id']} failed") for t in texts), texts


def test_a_job_outlives_the_users_own_server(hub: Hub) -> None:
    """Issue 26, Jobs: a job needs no running server. The user also has their notebook server
    (same account); stopping it, which ends every process of that server, leaves the job
    running on its card to its end (the stop's last sweep used to kill every process of the
    account once the server's cgroup was gone: the job died with exit 137)."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    hub.spawn_ready(user, {"gpu": "none"})
    job = jobs.submit(command="echo start; sleep 6; echo end", gpu="rtx-4090", gpus=1)
    jobs.wait_state(job["id"], "running")
    hub.stop_server(user)
    time.sleep(1.5)  # the stop's sweeps are synchronous; give the scheduler passes to see them
    assert jobs.get(job["id"])["state"] == "running"
    done = jobs.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded" and done["exit_code"] == 0, done
    assert "end" in jobs.log(job["id"])


def test_a_job_finds_the_servers_own_python(hub: Hub) -> None:
    """Issue 26, Jobs: "runs a command ... in the user's account and image": `python train.py`
    (what JupyterLab's Jobs panel submits) finds the server's own Python and its packages, as
    the user's terminal does (bash -l's /etc/profile used to reset PATH: command not found)."""
    jobs = Jobs(hub, hub.create_user())
    job = jobs.submit(
        command="python -c 'import sys, jupyterhub; print(\"prefix\", sys.prefix)'",
        gpu="none",
        gpus=0,
    )
    done = jobs.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded", (done, jobs.log(job["id"]))
    assert "prefix " in jobs.log(job["id"])


def test_a_users_jobs_over_the_limit_wait_and_say_why(hub: Hub) -> None:
    """Issue 26, Queues: per-user limits on running jobs (here 2): a third job waits, its reason
    naming the limit, while another user's job is not held back by it; it starts by itself when
    one of the two ends."""
    user, other = hub.create_user(), hub.create_user()
    jobs, theirs = Jobs(hub, user), Jobs(hub, other)
    first = [jobs.submit(command="sleep 10", gpu="none", gpus=0) for _ in range(2)]
    third = jobs.submit(command="echo third", gpu="none", gpus=0)
    for job in first:
        jobs.wait_state(job["id"], "running")
    waiting = jobs.get(third["id"])
    assert waiting["state"] == "queued", waiting
    assert "you have 2 jobs running (the limit is 2 at once)" in waiting["reason"], waiting
    own = theirs.submit(command="echo theirs", gpu="none", gpus=0)
    theirs_done = theirs.wait_state(own["id"], "succeeded", "failed")
    assert theirs_done["state"] == "succeeded", theirs_done
    assert jobs.get(third["id"])["state"] == "queued"
    done = jobs.wait_state(third["id"], "succeeded", "failed", timeout=60)
    assert done["state"] == "succeeded", done
