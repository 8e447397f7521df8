"""Nothing that costs money on a GET, and course staff's rights checked on every path.

Attacks from issue 20, run against a real hub as a logged-in browser (cookies, XSRF) or with
the staff member's own API token:

- a cross-site link to ``/hub/spawn?opt-gpu=a100-80g&opt-gpus=2&opt-app=sd-webui`` started two
  paid cards in the victim's name: now it shows the form, prefilled, and starts nothing;
- a TA switched a student's server into the student's other course, a teacher did the same with
  a GET of the spawn page, and a teacher who only assists another course enrolled its students
  directly: every path now asks ``hub_config/courses/staff.py`` and answers 403 naming the rule.
"""

from __future__ import annotations

import html
import re
import time
import uuid

import pytest
from course_helpers import fund_course, make_course, roster, token_for
from harness import PASSWORD, Hub, WebSession, approved_user

ATTACK_LINK = "/hub/spawn{user}?opt-gpu=a100-80g&opt-gpus=2&opt-app=sd-webui"


def cards_free(hub: Hub) -> dict[str, int]:
    return {t["slug"]: t["free"] for t in hub.pool()["gpu_types"]}


@pytest.mark.parametrize("path", ["", "/{name}"])
def test_a_link_fills_in_the_form_and_starts_nothing(hub: Hub, path: str) -> None:
    name = approved_user(hub, "victim")
    web = WebSession(hub)
    assert web.login(name, PASSWORD)
    before = cards_free(hub)

    r = web.get(ATTACK_LINK.format(user=path.format(name=name)), allow_redirects=False)
    assert r.status_code == 200, (r.status_code, r.headers.get("Location"), r.text[:300])
    # Nothing started, no card held (so no billing session either: none begins without a start).
    assert hub.server(name) is None
    assert cards_free(hub) == before
    # The form shows the link's choices, for the user to confirm with Start.
    assert re.search(r'name="gpu" value="a100-80g" checked', r.text)
    assert re.search(r'name="gpus"[^>]*value="2"', r.text)
    assert 'name="app" value="sd-webui"' in r.text
    assert "Nothing has started" in r.text

    # Old-style options (no opt- prefix) start nothing either.
    r = web.get("/hub/spawn?gpu=a100-80g&gpus=2", allow_redirects=False)
    assert r.status_code == 200 and hub.server(name) is None

    # A cross-site form POST carries the cookie but not the XSRF token: refused.
    r = web.http.post(
        f"{hub.url}/hub/spawn",
        data={"gpu": "a100-80g", "gpus": "2"},
        allow_redirects=False,
        timeout=60,
    )
    assert r.status_code == 403, r.text[:300]
    assert hub.server(name) is None and cards_free(hub) == before

    # The user's own Start (the form's POST, with XSRF) does start it.
    r = web.post("/hub/spawn", {"gpu": "rtx-4090", "gpus": "1"}, allow_redirects=False)
    assert r.status_code == 302, r.text[:300]
    try:
        hub.wait_ready(name)
        assert hub.free("rtx-4090") == before["rtx-4090"] - 1
    finally:
        hub.stop_server(name)


def test_staff_start_switch_launch_and_form_only_under_their_own_course(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    # The teacher uses the hub in a browser (a signed-up, approved account with a password).
    teacher = approved_user(hub, "teach")
    ta, other = f"aa{tag}", f"tb{tag}"
    course_a, course_b = f"a{tag}", f"b{tag}"
    make_course(hub, course_a, [teacher], [ta])
    make_course(hub, course_b, [other])
    fund_course(hub, course_a)  # staff starts are paid by the course's pool only
    student = f"st{tag}"
    # The student takes both courses (the admin enrols them directly).
    assert roster(hub, course_a, f"{student},student\n", hub.token).json()["added"] == [student]
    assert roster(hub, course_b, f"{student},student\n", hub.token).json()["added"] == [student]
    t_token, ta_token = token_for(hub, teacher), token_for(hub, ta)
    rule = f"you may start {student}'s server only under a course you teach or assist"

    def refused(r, what: str) -> None:
        assert r.status_code == 403, (what, r.status_code, r.text[:300])
        text = html.unescape(r.text)  # the spawn page escapes its error message
        assert rule in text and course_a in text, (what, text[:300])

    # Switch: the TA (and the teacher) of A moving the running server into B.
    hub.spawn_ready(student, {"gpu": "none", "course": course_a})
    try:
        before = cards_free(hub)
        for token in (ta_token, t_token):
            r = hub.api(
                "POST", f"/gpulab/users/{student}/switch", token=token, json={"course": course_b}
            )
            refused(r, "switch")
            r = hub.api(
                "POST",
                f"/gpulab/users/{student}/switch",
                token=token,
                json={"course": course_b, "gpu": "rtx-4090"},
            )
            refused(r, "switch with a card")
        server = hub.server(student)
        assert server["ready"] and server["user_options"]["course"] == course_a
        assert cards_free(hub) == before
        # Staff reach inside the student's server, and with it its own token (attack wave, issue
        # 21): with that token a TA of A moved it into B (B's pool paid) and prepaid a month of
        # cards from the student's own balance. The token moves no server between courses, and
        # spends nothing ahead.
        with hub.kernel(student) as k:
            server_token = k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
        r = hub.api(
            "POST", f"/gpulab/users/{student}/switch", token=server_token, json={"course": course_b}
        )
        assert r.status_code == 400 and "course: a running server keeps its course" in r.text, (
            r.status_code,
            r.text[:300],
        )
        r = hub.api(
            "POST",
            "/gpulab/reservations",
            token=server_token,
            json={
                "account": f"user:{student}",
                "gpu_type": "rtx-4090",
                "cards": 1,
                "month": time.strftime("%Y-%m", time.gmtime()),
                "idempotency_key": uuid.uuid4().hex,
            },
        )
        assert r.status_code == 403, (r.status_code, r.text[:300])
        assert hub.server(student)["user_options"]["course"] == course_a
        assert cards_free(hub) == before
        # Within course A the TA may switch it (the rule allows, not only forbids).
        r = hub.api(
            "POST", f"/gpulab/users/{student}/switch", token=ta_token, json={"datasets": []}
        )
        assert r.status_code == 202, r.text
        hub.wait_ready(student)
    finally:
        hub.stop_server(student)

    before = cards_free(hub)
    web = WebSession(hub)
    assert web.login(teacher, PASSWORD)
    # The spawn page's GET naming course B: refused (it used to start the server under B).
    r = web.get(
        f"/hub/spawn/{student}?opt-course={course_b}&opt-gpu=rtx-4090", allow_redirects=False
    )
    refused(r, "form GET")
    assert hub.server(student) is None
    # Under course A the teacher sees the student's form (and nothing starts).
    r = web.get(f"/hub/spawn/{student}?opt-course={course_a}", allow_redirects=False)
    assert r.status_code == 200 and hub.server(student) is None, r.text[:300]
    # The spawn form's POST (with XSRF) naming course B.
    r = web.post(
        f"/hub/spawn/{student}",
        {"course": course_b, "gpu": "rtx-4090", "gpus": "1"},
        allow_redirects=False,
    )
    refused(r, "form POST")
    # App launch and the REST start (a spot bid that would queue, too) naming course B.
    r = hub.api(
        "POST",
        f"/gpulab/users/{student}/apps/jupyterlab/launch",
        token=t_token,
        json={"course": course_b},
    )
    refused(r, "launch")
    for body in (
        {"gpu": "rtx-4090", "course": course_b},
        {"gpu": "rtx-4090", "course": course_b, "pricing": "spot", "max_price": "0.01"},
    ):
        refused(hub.api("POST", f"/users/{student}/server", token=ta_token, json=body), "REST")
    assert hub.server(student) is None
    assert cards_free(hub) == before
    queue = hub.api("GET", "/gpulab/spot/queue").json()
    assert student not in str(queue)


def test_only_a_teacher_of_a_student_enrols_them_directly(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    teacher = f"tq{tag}"
    course_a, course_c = f"qa{tag}", f"qc{tag}"
    make_course(hub, course_a, [teacher])
    # The teacher of A only assists C.
    make_course(hub, course_c, [f"tc{tag}"], [teacher])
    student = f"sc{tag}"
    assert roster(hub, course_c, f"{student},student\n", hub.token).json()["added"] == [student]

    r = roster(hub, course_a, f"{student},student\n", token_for(hub, teacher))
    assert r.status_code == 200, r.text
    assert r.json()["added"] == [] and r.json()["invited"] == [student]
    assert student not in hub.api("GET", f"/groups/{course_a}").json()["users"]


def test_nobody_enrols_themselves_and_staff_are_not_students(hub: Hub) -> None:
    """Attack 05: a teacher named themselves as a student in their course's roster and the
    course's pool paid for their own server. A roster row naming the caller is refused (400), a
    row making a TA a student is refused (403, only an admin changes roles), and so is naming a
    student as a TA; nothing changes."""
    tag = uuid.uuid4().hex[:5]
    teacher, ta, student = f"ts{tag}", f"as{tag}", f"ss{tag}"
    course = f"se{tag}"
    make_course(hub, course, [teacher], [ta])
    t_token = token_for(hub, teacher)
    assert roster(hub, course, f"{student},student\n", hub.token).status_code == 200

    r = roster(hub, course, f"{student},student\n{teacher},student\n", t_token)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "roster line 2: username"
    r = roster(hub, course, f"{ta},student\n", t_token)
    assert r.status_code == 403 and r.json()["field"] == "roster line 1: role", r.text
    r = hub.api("PATCH", f"/gpulab/courses/{course}", token=t_token, json={"tas": [ta, student]})
    assert r.status_code == 403 and r.json()["field"] == "tas", r.text

    info = hub.api("GET", f"/gpulab/courses/{course}", token=t_token).json()
    assert info["teachers"] == [teacher] and info["tas"] == [ta]
    assert info["students"] == [student]
