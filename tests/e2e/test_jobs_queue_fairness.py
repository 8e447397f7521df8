"""A job that can never start must not hold its place in the queue (issue 26, F0/F3).

A real root hub with the local spawner and two simulated RTX 4090 cards; users act only as users
would: their own tokens, the jobs API. Before the fix, a job naming a course its owner is not a
student of was accepted (201) and then waited forever ("Not allowed: course: ...") as the first
job in line, keeping every card of its type from every other user's jobs, at no cost to anyone.
"""

from __future__ import annotations

import os

import pytest
from harness import Hub, wait_for
from jobs_helpers import Jobs, job_servers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "jobsfair",
        simulate="RTX-4090:2",
        extra_args=[
            "--JobScheduler.interval=0.3",
            "--JobScheduler.retry_seconds=1",
            "--JobScheduler.max_running_per_user=1",
        ],
    )


def make_course(hub: Hub, course: str, student: str) -> None:
    r = hub.api("POST", f"/groups/{course}")
    assert r.status_code == 201, r.text
    r = hub.api(
        "PUT",
        f"/groups/{course}/properties",
        json={"gpulab_course": {"display_name": course, "teachers": [], "tas": []}},
    )
    assert r.status_code == 200, r.text
    r = hub.api("POST", f"/groups/{course}/users", json={"users": [student]})
    assert r.status_code == 200, r.text


def test_a_made_up_course_is_refused_at_submit_and_blocks_no_one(hub: Hub) -> None:
    """Issue 26, F0/F3 (fair queue; bad input is 400 naming the field and changes nothing): a
    job naming a course its owner is not a student of is 400 naming ``course``; nothing is
    queued, no server, no card; another user's job of the same GPU type then starts on the free
    cards and runs to its end. Failed before the fix: the job was accepted (201) and queued."""
    attacker, victim = hub.create_user(), hub.create_user()
    mine, theirs = Jobs(hub, attacker), Jobs(hub, victim)
    free = hub.free("rtx-4090")
    r = mine.call(
        "POST",
        json={"command": "sleep 5", "gpu": "rtx-4090", "gpus": 2, "course": "nonexist"},
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body.get("field") == "course", body
    assert body["message"].startswith("course:") and "nonexist" in body["message"], body
    assert mine.call("GET").json()["jobs"] == []
    assert not job_servers(hub, attacker) and hub.free("rtx-4090") == free

    job = theirs.submit(command="echo victim-job-ran", gpu="rtx-4090", gpus=1)
    done = theirs.wait_state(job["id"], "succeeded", "failed", timeout=60)
    assert done["state"] == "succeeded", done
    assert "victim-job-ran" in theirs.log(job["id"])


def test_a_start_the_course_rule_refuses_fails_the_job_instead_of_waiting_forever(
    hub: Hub,
) -> None:
    """Issue 26, F0: a job accepted while its owner was a student of its course, whose start is
    then refused by the course rule (they left the course meanwhile: 403, which waiting does not
    change), ends failed with that refusal as its reason, holding no place in the queue.
    Failed before the fix: it went back to the queue for good ("Not allowed: course: ...")."""
    student = hub.create_user()
    course = f"fair{student[-6:]}"
    make_course(hub, course, student)
    jobs = Jobs(hub, student)
    # The first job runs (max_running_per_user=1), so the course job waits behind it.
    first = jobs.submit(command="sleep 600", gpu="none", gpus=0, course=course)
    jobs.wait_state(first["id"], "running")
    later = jobs.submit(command="echo never", gpu="rtx-4090", gpus=1, course=course)
    wait_for(
        lambda: jobs.get(later["id"])["reason"].startswith("you have 1 job running"),
        30,
        0.2,
        "the course job to wait behind the first",
    )
    r = hub.api("DELETE", f"/groups/{course}/users", json={"users": [student]})
    assert r.status_code == 200, r.text
    r = jobs.call("DELETE", f"/{first['id']}")
    assert r.status_code == 202, r.text
    done = jobs.wait_state(later["id"], "failed", "succeeded", "cancelled", timeout=60)
    assert done["state"] == "failed", done
    assert f"not a student of course '{course}'" in done["reason"], done
    assert "echo never" not in jobs.log(later["id"])
    wait_for(lambda: not job_servers(hub, student), 30, what="the job servers to be gone")
