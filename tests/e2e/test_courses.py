"""Courses on a real hub: a course is a JupyterHub group, its staff hold roles scoped to it.

What a teacher, a TA and a student notice: the roster import (all or nothing), the course's
limits on the student's servers (403 naming the course rule, nothing started, no card held),
a TA reaching a student's server of their course and not another course's, staff starting a
student's server only under their own course, and all of it surviving a hub restart.
"""

from __future__ import annotations

import uuid

import requests
from course_helpers import fund_course, make_course, roster, token_for
from harness import PASSWORD, VENV_BIN, Hub, WebSession, approve, wait_for

STUDENT_SERVER_PATH = "api/status"


def course_name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


def server_status(hub: Hub, owner: str, token: str) -> int:
    """What the owner's JupyterLab server answers someone holding ``token``."""
    r = requests.get(
        hub.user_url(owner, STUDENT_SERVER_PATH),
        headers={"Authorization": f"token {token}"},
        timeout=30,
        allow_redirects=False,
    )
    return r.status_code


def test_roster_limits_and_staff_scopes(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    teacher, ta, other_teacher, other_ta = (f"{r}{tag}" for r in ("tch", "ta", "tch2", "ta2"))
    ml, cv = course_name("ml"), course_name("cv")
    make_course(hub, ml, [teacher], [ta], gpu_types=["none", "rtx-4090"], images=["base"])
    make_course(hub, cv, [other_teacher], [other_ta])
    fund_course(hub, ml)  # staff starts are paid by the course's pool only
    t_token, ta_token = token_for(hub, teacher), token_for(hub, ta)
    other_ta_token = token_for(hub, other_ta)
    other_t_token = token_for(hub, other_teacher)
    s1, s2 = f"s1{tag}", f"s2{tag}"

    # A roster with one bad row changes nothing: no user, no member.
    bad = f"username,role\n{s1},student\nNot Valid!,student\n"
    r = roster(hub, ml, bad, t_token)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "roster line 3: username"
    assert "Not Valid!" in r.json()["message"]
    assert hub.api("GET", f"/users/{s1}").status_code == 404
    r = roster(hub, ml, f"{s1},professor\n", t_token)
    assert r.status_code == 400 and r.json()["field"] == "roster line 1: role"
    assert "allowed: student, teacher, ta" in r.json()["message"]
    # A teacher of another course may not import into this one; a TA may not import at all.
    # (JupyterHub answers 404 where the caller holds the scope for other groups only.)
    assert roster(hub, ml, f"{s1},student\n", other_t_token).status_code in (403, 404)
    assert roster(hub, ml, f"{s1},student\n", ta_token).status_code in (403, 404)
    assert hub.api("GET", f"/users/{s1}").status_code == 404

    # Someone the hub already has is invited, not enrolled: the course's staff would reach
    # their server and files. They join when they accept.
    existing = hub.create_user(f"old{tag}")
    r = roster(hub, ml, f"username,role\n{s1},student\n{s2},Learner\n{existing},student\n", t_token)
    assert r.status_code == 200, r.text
    assert sorted(r.json()["added"]) == sorted([s1, s2])
    assert r.json()["invited"] == [existing]
    assert existing not in hub.api("GET", f"/groups/{ml}").json()["users"]
    e_token = token_for(hub, existing)
    r = hub.api("GET", "/gpulab/courses", token=e_token)
    assert [(c["name"], c["role"]) for c in r.json()["courses"]] == [(ml, "invited")]
    assert hub.api("POST", f"/gpulab/courses/{cv}/join", token=e_token).status_code == 404
    assert hub.api("POST", f"/gpulab/courses/{ml}/join", token=e_token).status_code == 200
    assert existing in hub.api("GET", f"/groups/{ml}").json()["users"]
    r = hub.api("DELETE", f"/gpulab/courses/{ml}/members/{existing}", token=t_token)
    assert r.status_code == 204
    # The course is a JupyterHub group with the students as members.
    group = hub.api("GET", f"/groups/{ml}").json()
    assert sorted(group["users"]) == sorted([s1, s2])
    # Staff read their course; others do not.
    assert hub.api("GET", f"/gpulab/courses/{ml}", token=ta_token).status_code == 200
    assert hub.api("GET", f"/gpulab/courses/{ml}", token=other_ta_token).status_code in (403, 404)
    r = hub.api("GET", "/gpulab/courses", token=token_for(hub, s1))
    assert [(c["name"], c["role"]) for c in r.json()["courses"]] == [(ml, "student")]

    # The home page offers the student only the course's GPU types.
    home = hub.api("GET", f"/gpulab/users/{s1}/home").json()
    lab = next(a for a in home["apps"] if a["slug"] == "jupyterlab")
    assert lab["available"] and set(lab["gpu_choices"]) <= {"none", "rtx-4090"}
    # The course allows no A100: refused with the rule, nothing started, no card held.
    free_a100 = hub.free("a100-80g")
    r = hub.spawn(s1, {"gpu": "a100-80g"})
    assert r.status_code == 403, r.text
    assert f"course {ml} does not allow gpu type 'a100-80g'" in r.json()["message"]
    assert "allowed: rtx-4090, none" in r.json()["message"]
    assert hub.server(s1) is None and hub.free("a100-80g") == free_a100
    # Naming a course they do not take is refused too.
    r = hub.spawn(s1, {"gpu": "none", "course": cv})
    assert r.status_code == 403 and f"not a student of course '{cv}'" in r.json()["message"]

    try:
        hub.spawn_ready(s1, {"gpu": "none"})
        assert hub.user(s1)["servers"][""]["user_options"]["course"] == ml
        # The TA reaches the student's server; the other course's TA does not.
        assert server_status(hub, s1, ta_token) == 200
        assert server_status(hub, s1, other_ta_token) in (403, 302)
        # The dashboard's view: the student's server, its mode and course.
        info = hub.api("GET", f"/gpulab/courses/{ml}", token=ta_token).json()
        assert info["servers"][s1]["state"] == "ready"
        assert info["servers"][s1]["course"] == ml
        assert info["servers"][s2] == {"state": "stopped"}
    finally:
        hub.stop_server(s1)

    # Staff start a student's server only under their own course.
    r = hub.api("POST", f"/users/{s2}/server", token=t_token, json={"gpu": "none"})
    assert r.status_code == 403 and r.json()["message"].startswith("course: you may start")
    r = hub.api("POST", f"/users/{s2}/server", token=other_t_token, json={"course": cv})
    assert r.status_code in (403, 404)
    assert hub.server(s2) is None
    r = hub.api("POST", f"/users/{s2}/server", token=t_token, json={"gpu": "none", "course": ml})
    assert r.status_code in (201, 202), r.text
    try:
        hub.wait_ready(s2)
    finally:
        r = hub.api("DELETE", f"/users/{s2}/server", token=ta_token)
        assert r.status_code in (202, 204), r.text
        wait_for(lambda: hub.server(s2) is None, 60, what="the TA's stop")

    # A teacher who already teaches someone in another course enrols them directly.
    make_course(hub, f"x{ml}", [teacher])
    r = roster(hub, f"x{ml}", f"{s1},student\n", t_token)
    assert r.status_code == 200 and r.json()["added"] == [s1] and r.json()["invited"] == []


def test_course_input_errors_name_the_field(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    teacher = f"tch{tag}"
    name = course_name("bad")
    cases = [
        ({"name": "Has Spaces"}, "name"),
        ({"name": name, "limits": {"gpu_types": ["h100"]}}, "limits.gpu_types"),
        ({"name": name, "limits": {"gpus": ["x"]}}, "limits.gpus"),
        ({"name": name, "teachers": ["no way"]}, "teachers"),
        ({"name": name, "colour": "red"}, "colour"),
    ]
    for body, field in cases:
        r = hub.api("POST", "/gpulab/courses", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["field"] == field, (body, r.json())
    assert hub.api("GET", f"/groups/{name}").status_code == 404
    # Only admins create courses.
    make_user = hub.create_user(teacher)
    r = hub.api("POST", "/gpulab/courses", token=token_for(hub, make_user), json={"name": name})
    assert r.status_code == 403
    assert hub.api("GET", f"/groups/{name}").status_code == 404


def test_course_roles_survive_a_hub_restart(hub_factory) -> None:
    cli = [str(VENV_BIN / "gpulab"), "up", "--open-signup"]
    hub = hub_factory("courses-restart", simulate="RTX-4090:1", cli=cli)
    teacher, student = "tchr", "stud"
    make_course(hub, "ml101", [teacher])
    t_token = token_for(hub, teacher)
    assert roster(hub, "ml101", f"{student},student\n", t_token).status_code == 200
    hub.stop()
    hub.start()
    # JupyterHub drops roles its config does not load; gpulab derives them again at start.
    assert hub.api("GET", "/gpulab/courses/ml101", token=t_token).status_code == 200
    assert roster(hub, "ml101", "stud2,ta\n", t_token).status_code == 200
    info = hub.api("GET", "/gpulab/courses/ml101", token=t_token).json()
    assert info["students"] == [student] and info["tas"] == ["stud2"]

    # Open sign-up does not hand a rostered student's account to whoever signs up first under
    # their name (they would spend the course's credit): that sign-up waits for an admin.
    web = WebSession(hub)
    assert web.signup(student, PASSWORD).ok
    assert not web.login(student, PASSWORD)
    fresh = WebSession(hub)
    assert fresh.signup("newcomer", PASSWORD).ok
    assert fresh.login("newcomer", PASSWORD)  # a new name: open sign-up as before
    approve(hub, student)
    assert WebSession(hub).login(student, PASSWORD)
