"""Course administration without curl, through the APIs the dashboard's forms post to (issue 22).

Points of issue 22 this covers, each failing on the code before it:

- a typo in a teacher's (or TA's) name made a hub account: now a 400 naming the field, nobody is
  created and no course either;
- a roster import said only "new: ...": its answer now reports per row what happened (new
  account, invitation sent to an existing user, already a member, added);
- an invited user could only accept through the API: they can also decline (the home page's
  buttons), and nobody answers an invitation for someone else;
- a booking for tomorrow must not take cards off "free" now, and cards held for a lab session
  about to begin are explained (``held_now`` of the pool API, which the home page shows);
- a student of a course creates no course, imports no roster, books and cancels nothing.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from course_helpers import make_course, roster, token_for
from harness import Hub


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def test_course_staff_are_existing_users_and_a_typo_is_an_error(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    prof = hub.create_user(f"prof{tag}")
    typo = f"proff{tag}"
    name = f"typo{tag}"
    r = hub.api("POST", "/gpulab/courses", json={"name": name, "teachers": [typo]})
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "teachers"
    assert f"'{typo}' is not a user of this hub" in r.json()["message"]
    assert hub.api("GET", f"/users/{typo}").status_code == 404  # no account made
    assert hub.api("GET", f"/groups/{name}").status_code == 404  # no course either
    r = hub.api("POST", "/gpulab/courses", json={"name": name, "teachers": [prof], "tas": [typo]})
    assert (r.status_code, r.json()["field"]) == (400, "tas"), r.text
    assert hub.api("GET", f"/users/{typo}").status_code == 404

    r = hub.api("POST", "/gpulab/courses", json={"name": name, "teachers": [prof]})
    assert r.status_code == 201, r.text
    # A change of staff naming nobody the hub has: refused, nothing made, nothing changed.
    r = hub.api("PATCH", f"/gpulab/courses/{name}", json={"tas": [typo]})
    assert (r.status_code, r.json()["field"]) == (400, "tas"), r.text
    assert hub.api("GET", f"/users/{typo}").status_code == 404
    assert hub.api("GET", f"/gpulab/courses/{name}").json()["tas"] == []


def test_a_roster_reports_per_row_what_happened(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    course = f"rep{tag}"
    make_course(hub, course, [f"rt{tag}"])
    teacher = token_for(hub, f"rt{tag}")
    existing = hub.create_user(f"ex{tag}")
    fresh, member = f"new{tag}", f"mem{tag}"
    assert roster(hub, course, f"{member},student\n", hub.token).status_code == 200

    # The teacher's import: a new name, an existing user they do not teach, a member.
    r = roster(
        hub, course, f"username,role\n{fresh},student\n{existing},student\n{member},\n", teacher
    )
    assert r.status_code == 200, r.text
    report = {row["username"]: row for row in r.json()["report"]}
    assert (report[fresh]["outcome"], report[fresh]["message"]) == ("new", "new account")
    assert report[fresh]["line"] == 2
    assert report[existing]["outcome"] == "invited"
    assert report[existing]["message"].startswith("invitation sent (existing user")
    assert (report[member]["outcome"], report[member]["message"]) == ("member", "already a member")
    assert existing in r.json()["course"]["invited"]

    # An admin's import of an existing user adds them directly, and says so.
    other = hub.create_user(f"ot{tag}")
    r = roster(hub, course, f"{other},student\n", hub.token)
    assert r.status_code == 200, r.text
    assert [(x["username"], x["outcome"]) for x in r.json()["report"]] == [(other, "added")]


def test_an_invitation_is_answered_by_the_invited_only(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    course = f"inv{tag}"
    make_course(hub, course, [f"it{tag}"])
    teacher = token_for(hub, f"it{tag}")
    alice, mallory = hub.create_user(f"al{tag}"), hub.create_user(f"ma{tag}")
    assert roster(hub, course, f"{alice},student\n", teacher).json()["invited"] == [alice]
    a_token, m_token = token_for(hub, alice), token_for(hub, mallory)

    # Mallory answers for nobody but herself: she has no invitation, alice keeps hers.
    for verb in ("join", "decline"):
        r = hub.api("POST", f"/gpulab/courses/{course}/{verb}", token=m_token)
        assert r.status_code == 404, (verb, r.text)
    course_now = hub.api("GET", f"/gpulab/courses/{course}").json()
    assert course_now["invited"] == [alice] and mallory not in course_now["students"]

    # Alice sees it, declines it; it is gone and cannot be accepted afterwards.
    listed = hub.api("GET", "/gpulab/courses", token=a_token).json()["courses"]
    assert [(c["name"], c["role"]) for c in listed] == [(course, "invited")]
    r = hub.api("POST", f"/gpulab/courses/{course}/decline", token=a_token)
    assert r.status_code == 200, r.text
    assert hub.api("GET", "/gpulab/courses", token=a_token).json()["courses"] == []
    assert hub.api("POST", f"/gpulab/courses/{course}/join", token=a_token).status_code == 404
    course_now = hub.api("GET", f"/gpulab/courses/{course}").json()
    assert course_now["invited"] == [] and alice not in course_now["students"]


def test_a_student_administers_nothing(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    course = f"stu{tag}"
    make_course(hub, course, [f"st{tag}"], gpu_types=["none", "rtx-4090"])
    student = f"pupil{tag}"
    assert roster(hub, course, f"{student},student\n{student}b,student\n", hub.token).ok
    teacher, s_token = token_for(hub, f"st{tag}"), token_for(hub, student)
    start = iso(time.time() + 86400)
    booking = {"gpu_type": "rtx-4090", "cards": 1, "start": start, "minutes": 60}
    r = hub.api("POST", f"/gpulab/courses/{course}/bookings", token=teacher, json=booking)
    assert r.status_code == 201, r.text
    booked = r.json()["id"]
    try:
        attempts = [
            ("POST", "/gpulab/courses", {"name": f"mine{tag}", "teachers": [student]}),
            ("POST", f"/gpulab/courses/{course}/bookings", booking),
            ("DELETE", f"/gpulab/courses/{course}/bookings/{booked}", None),
            ("PATCH", f"/gpulab/courses/{course}", {"display_name": "pwned"}),
        ]
        for method, path, body in attempts:
            r = hub.api(method, path, token=s_token, json=body)
            assert r.status_code in (403, 404), (method, path, r.status_code, r.text)
        r = roster(hub, course, f"{student}x,student\n", s_token)
        assert r.status_code in (403, 404), r.text
        assert hub.api("GET", f"/groups/mine{tag}").status_code == 404
        assert hub.api("GET", f"/users/{student}x").status_code == 404
        listed = hub.api("GET", f"/gpulab/courses/{course}/bookings", token=teacher).json()
        assert [b["id"] for b in listed["bookings"]] == [booked]
        assert hub.api("GET", f"/gpulab/courses/{course}").json()["display_name"] != "pwned"
    finally:
        hub.api("DELETE", f"/gpulab/courses/{course}/bookings/{booked}", token=teacher)


def test_cards_held_now_are_explained_and_tomorrow_holds_none(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:5]
    course = f"held{tag}"
    make_course(hub, course, [f"ht{tag}"], gpu_types=["none", "rtx-4090"])
    r = hub.api("PATCH", f"/gpulab/courses/{course}", json={"display_name": f"Lab {tag}"})
    assert r.status_code == 200, r.text
    assert roster(hub, course, f"ha{tag},student\nhb{tag},student\n", hub.token).ok
    teacher = token_for(hub, f"ht{tag}")
    free = hub.free("rtx-4090")
    assert free >= 1, hub.pool()

    def held() -> list[dict]:
        pool = hub.api("GET", "/gpulab/pool").json()
        return [h for h in pool["held_now"] if h["for"] == f"Lab {tag}'s lab"]

    made = []
    try:
        tomorrow = {"gpu_type": "rtx-4090", "cards": 1, "start": iso(time.time() + 86400),
                    "minutes": 60}  # fmt: skip
        r = hub.api("POST", f"/gpulab/courses/{course}/bookings", token=teacher, json=tomorrow)
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
        assert hub.free("rtx-4090") == free and held() == []

        # A session starting in 10 minutes holds its card from now (prestart 180 s + margin
        # 600 s): it is off "free", and the pool says for whom and when.
        start = time.time() + 600
        soon = {"gpu_type": "rtx-4090", "cards": 1, "start": iso(start), "minutes": 60}
        r = hub.api("POST", f"/gpulab/courses/{course}/bookings", token=teacher, json=soon)
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
        assert hub.free("rtx-4090") == free - 1
        [h] = held()
        assert (h["gpu_type"], h["cards"], h["kind"], h["begun"]) == (
            "rtx-4090",
            1,
            "booking",
            False,
        )
        assert abs(h["start"] - start) < 1 and abs(h["end"] - start - 3600) < 1
        r = hub.api("DELETE", f"/gpulab/courses/{course}/bookings/{made.pop()}", token=teacher)
        assert r.status_code == 204
        assert hub.free("rtx-4090") == free and held() == []
    finally:
        for booking in made:
            hub.api("DELETE", f"/gpulab/courses/{course}/bookings/{booking}", token=teacher)


def test_an_existing_user_named_ta_is_invited_not_made_ta(hub: Hub) -> None:
    """Issue 22, attack F2: a teacher's roster row ``username,ta`` made an existing user a TA at
    once ("added (existing user)"), with power over the students' servers and the course pool,
    without being asked. Now it is an invitation (like a student row) that records the role: the
    user reaches nothing of the course until they accept, and accepting makes them a TA."""
    tag = uuid.uuid4().hex[:5]
    course = f"tai{tag}"
    make_course(hub, course, [f"tt{tag}"])
    teacher = token_for(hub, f"tt{tag}")
    student = hub.create_user(f"ts{tag}")
    assert roster(hub, course, f"{student},student\n", hub.token).status_code == 200
    mal = hub.create_user(f"tm{tag}")
    m_token = token_for(hub, mal)

    r = roster(hub, course, f"username,role\n{mal},ta\n", teacher)
    assert r.status_code == 200, r.text
    (row,) = r.json()["report"]
    assert (row["outcome"], row["role"]) == ("invited", "ta"), row
    assert row["message"].startswith("invitation sent (existing user")
    assert r.json()["added"] == [] and mal not in r.json()["course"]["tas"]

    # Not a TA yet: no course read, no start of a student's server.
    assert hub.api("GET", f"/gpulab/courses/{course}", token=m_token).status_code in (403, 404)
    r = hub.api("POST", f"/users/{student}/server", token=m_token,
                json={"gpu": "none", "course": course})  # fmt: skip
    assert r.status_code in (403, 404), r.text
    assert hub.server(student) is None
    listed = hub.api("GET", "/gpulab/courses", token=m_token).json()["courses"]
    assert [(c["name"], c["role"], c.get("invited_as")) for c in listed] == [
        (course, "invited", "ta")
    ]

    # Accepting makes them a TA (not a student) and the invitation is gone.
    r = hub.api("POST", f"/gpulab/courses/{course}/join", token=m_token)
    assert r.status_code == 200, r.text
    assert r.json()["role"] == "ta"
    now = hub.api("GET", f"/gpulab/courses/{course}", token=m_token)
    assert now.status_code == 200, now.text
    assert mal in now.json()["tas"] and mal not in now.json()["students"]
    assert now.json()["invited"] == []
