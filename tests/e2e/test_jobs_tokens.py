"""A job's server token dies with the job; the queue and the bids have bounds (issue 26, X6).

A real root hub with the local spawner runs each job as its owner's ``job-ID`` server. The tests
act as users would: their own tokens, the jobs API; the job's command writes the token JupyterHub
gave its server into the user's home, where the test (root) reads it back from its data dir.

- F6: every attempt's server token authenticated forever after the job ended (it could submit
  billed jobs, start and stop the owner's servers); one per attempt piled up on the user.
- F7: the queue took any number of jobs of a user; a spot bid below the type's floor (a job that
  can never start) was accepted; ``log?follow=1`` answers had no ``nosniff``.
"""

from __future__ import annotations

import os

import pytest
import requests
from harness import Hub, wait_for, write_in_home
from jobs_helpers import Jobs

from gpulab.spawners.storage.homes import home_name

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")

# The job: its server's token into its home, then it waits until the test lets it end.
SHOW_TOKEN = (
    'echo "$JUPYTERHUB_API_TOKEN" > job-token.tmp && mv job-token.tmp job-token; '
    "until [ -e go ]; do sleep 0.2; done; echo done"
)


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "jobtokens",
        simulate="RTX-4090:2",
        extra_args=[
            "--JobScheduler.interval=0.3",
            "--JobScheduler.retry_seconds=1",
            "--JobScheduler.max_running_per_user=1",
            "--JobScheduler.max_queued_per_user=2",
        ],
    )


def _job_token(hub: Hub, user: str) -> str:
    path = hub.data_dir / "users" / home_name(user) / "job-token"
    return wait_for(
        lambda: path.exists() and path.read_text().strip(), 60, what="the job's token in its home"
    )


def _server_tokens(hub: Hub, jobs: Jobs) -> list[str]:
    r = hub.api("GET", f"/users/{jobs.user}/tokens", token=jobs.token)
    assert r.status_code == 200, r.text
    return [t["note"] for t in r.json()["api_tokens"] if "/job-" in (t.get("note") or "")]


def test_a_jobs_server_token_works_while_it_runs_and_dies_with_the_job(hub: Hub) -> None:
    """Issue 26 F6 (security): the token a job's server gets is the owner's credential only
    while the job runs: once the job has ended (it exits by itself, or it is cancelled) the same
    token is refused on /hub/api/user and cannot submit a job, and no job-server token is left
    on the user."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    home = hub.data_dir / "users" / home_name(user)
    job = jobs.submit(command=SHOW_TOKEN, gpu="none", gpus=0, name="token")
    jobs.wait_state(job["id"], "running")
    token = _job_token(hub, user)
    r = hub.api("GET", "/user", token=token)
    assert r.status_code == 200 and r.json()["name"] == user, r.text

    write_in_home(home, "go", "")
    done = jobs.wait_state(job["id"], "succeeded", "failed")
    assert done["state"] == "succeeded", done
    r = hub.api("GET", "/user", token=token)
    assert r.status_code in (401, 403), f"the ended job's token still works: {r.status_code}"
    r = hub.api(
        "POST",
        f"/gpulab/users/{user}/jobs",
        token=token,
        json={"command": "echo stale", "gpu": "none", "gpus": 0},
    )
    assert r.status_code in (401, 403), r.text
    assert _server_tokens(hub, jobs) == []

    # A cancelled job's token dies with it too.
    (home / "job-token").unlink()
    (home / "go").unlink()
    job = jobs.submit(command=SHOW_TOKEN, gpu="none", gpus=0, name="token2")
    jobs.wait_state(job["id"], "running")
    token = _job_token(hub, user)
    assert hub.api("GET", "/user", token=token).status_code == 200
    assert jobs.call("DELETE", f"/{job['id']}").status_code == 202
    done = jobs.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert done["state"] == "cancelled", done
    r = hub.api("GET", "/user", token=token)
    assert r.status_code in (401, 403), f"the cancelled job's token still works: {r.status_code}"
    assert _server_tokens(hub, jobs) == []


def test_queued_jobs_of_a_user_are_capped(hub: Hub) -> None:
    """Issue 26 F7: a user's queue has a bound (``JobScheduler.max_queued_per_user``, 2 here):
    the submit over it is 429 naming the limit and creates nothing; a running job does not
    count, and once a queued job is cancelled the user may queue again."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    running = jobs.submit(command="sleep 600", gpu="none", gpus=0)
    jobs.wait_state(running["id"], "running")
    # max_running_per_user is 1: these two wait, and fill the queue.
    waiting = [jobs.submit(command="echo later", gpu="none", gpus=0) for _ in range(2)]
    r = jobs.call("POST", json={"command": "echo one too many", "gpu": "none", "gpus": 0})
    assert r.status_code == 429, r.text
    assert "max_queued_per_user" in r.text and "2" in r.text, r.text
    listed = jobs.call("GET").json()["jobs"]
    assert sorted(j["id"] for j in listed) == sorted([running["id"], *(w["id"] for w in waiting)])
    assert jobs.call("DELETE", f"/{waiting[0]['id']}").status_code == 202
    again = jobs.submit(command="echo room again", gpu="none", gpus=0)
    assert again["state"] == "queued"
    for j in (running, waiting[1], again):
        jobs.call("DELETE", f"/{j['id']}")
    jobs.wait_state(running["id"], "cancelled")


def test_a_spot_bid_below_the_types_floor_is_refused(hub: Hub) -> None:
    """Issue 26 F7: a spot job bidding less than the lowest spot price its GPU type can ever have
    (the catalog's spot floor, 0.30 for the RTX 4090) could never start: it is 400 naming
    ``max_price`` and the floor, and nothing is queued; a bid at the floor is taken."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    spec = {"command": "echo spot", "gpu": "rtx-4090", "gpus": 1, "pricing": "spot"}
    r = jobs.call("POST", json={**spec, "max_price": "0.01"})
    assert r.status_code == 400, r.text
    assert "max_price" in r.text and "0.30" in r.text, r.text
    assert jobs.call("GET").json()["jobs"] == []
    ok = jobs.submit(**spec, max_price="0.30")
    jobs.call("DELETE", f"/{ok['id']}")


def test_a_followed_log_is_not_sniffed(hub: Hub) -> None:
    """Issue 26 F7: the job log's answers, followed (while the job runs, and after it ended) or
    not, say ``X-Content-Type-Options: nosniff`` (its text is the user's own output, never a page
    of the hub's origin)."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    command = "echo '<script>alert(1)</script>'; until [ -e go ]; do sleep 0.2; done"
    job = jobs.submit(command=command, gpu="none", gpus=0)
    jobs.wait_state(job["id"], "running")
    url = f"{hub.url}/hub/api/gpulab/users/{user}/jobs/{job['id']}/log"
    auth = {"Authorization": f"token {jobs.token}"}
    with requests.get(f"{url}?follow=1", headers=auth, stream=True, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers.get("X-Content-Type-Options") == "nosniff", r.headers
        assert r.headers["Content-Type"].startswith("text/plain")
        write_in_home(hub.data_dir / "users" / home_name(user), "go", "")
        assert "<script>" in r.text
    jobs.wait_state(job["id"], "succeeded", "failed")
    for query in ("", "?follow=1"):
        r = requests.get(f"{url}{query}", headers=auth, timeout=30)
        assert r.status_code == 200 and "<script>" in r.text
        assert r.headers.get("X-Content-Type-Options") == "nosniff", (query, r.headers)
