"""Course money end to end: a real hub, a course (a group with course properties) and a student.

The admin sets the course's cap and tops up its pool through billing's API; the student's start
is refused while the course cannot pay it, then their real kernel is paid from the pool at the
education price; with ``overflow: refuse`` the enforcer stops the server at the cap, and the pool
pays no more than the cap.
"""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest
import requests
from billing.client import Billing, user_token
from course_helpers import make_course as staff_course
from course_helpers import roster as staff_roster
from course_helpers import token_for
from harness import FAST_BILLING_ENV, HB, wait_for

ENV = {
    **FAST_BILLING_ENV,
    "GPULAB_BILLING_ARGS": (
        f"--BillingService.heartbeat_interval={HB} --BillingService.enforce_interval=1 "
        "--BillingService.idle_timeout=300 --BillingService.switch_margin=2 "
        "--BillingService.silent_timeout=60"
    ),
}
A100_EDU_PER_S = Decimal("1.50") / 3600


@pytest.fixture(scope="module")
def chub(module_hub_factory):
    h = module_hub_factory(
        "course-money-hub",
        simulate="A100-80G:2",
        env=ENV,
        extra_args=["--ActivityObserver.bill_observed=False"],
    )
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


@pytest.fixture
def billing(chub) -> Billing:
    return Billing(chub)


def make_course(hub, student: str) -> str:
    course = f"cm{uuid.uuid4().hex[:6]}"
    r = hub.api("POST", f"/groups/{course}")
    assert r.status_code == 201, r.text
    r = hub.api(
        "PUT",
        f"/groups/{course}/properties",
        json={"gpulab_course": {"display_name": "Course money", "teachers": [], "tas": []}},
    )
    assert r.status_code == 200, r.text
    r = hub.api("POST", f"/groups/{course}/users", json={"users": [student]})
    assert r.status_code == 200, r.text
    return course


def put_course(billing: Billing, course: str, body: dict) -> dict:
    r = requests.put(
        billing.base + f"api/v1/courses/{course}",
        headers={"Authorization": f"token {billing.hub.token}"},
        json=body,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_pool_pays_up_to_the_cap_and_a_refusing_course_stops_the_server(chub, billing) -> None:
    student = chub.create_user(f"s{uuid.uuid4().hex[:8]}")
    course = make_course(chub, student)
    put_course(billing, course, {"cap": "0.01", "overflow": "refuse"})
    r = billing.post(
        f"api/v1/courses/{course}/credits",
        {"amount": "5.00", "kind": "topup", "idempotency_key": f"{course}-1"},
    )
    assert r.status_code == 201, r.text

    # One minute of an A100 at the education price (1.50/h) is 0.025: a cap of 0.01 refuses it.
    r = chub.spawn(student, {"gpu": "a100-80g", "course": course})
    assert r.status_code == 402, r.text
    message = r.json()["message"]
    assert f"Your weekly cap in course {course} has CNY 0.01 left" in message, message
    assert "the course refuses usage beyond the cap" in message
    assert chub.server(student) is None

    # With a cap of 1.00 it starts; a kernel runs ~10 s and is paid by the pool.
    put_course(billing, course, {"cap": "1.00"})
    chub.spawn_ready(student, {"gpu": "a100-80g", "course": course})
    chub.kernel(student)  # alive until the server stops
    time.sleep(10)
    info = billing.balance(student, user_token(chub, student))
    assert info["balance"]["exact"] == "10"  # the trial credit, untouched
    # Now lower the cap to a little above what was used: the enforcer stops the server once
    # what is left cannot pay switch_margin (2 s) more, and the pool pays no more than the cap.
    status = billing.get(f"api/v1/users/{student}/balance", params={"course": course}).json()
    used = Decimal(status["course"]["used"]["exact"])
    cap = (used + 6 * A100_EDU_PER_S).quantize(Decimal("0.000001"))
    put_course(billing, course, {"cap": str(cap)})
    wait_for(lambda: chub.server(student) is None, 60, 0.5, "the enforcer to stop the server")

    def settled():
        usage = billing.usage(student)
        (s,) = usage["servers"]
        return usage if s["stopped"] else None

    usage = wait_for(settled, 30, 0.5, "the stop in the statement")
    (s,) = usage["servers"]
    assert s["course"] == course and s["pricing"] == "on-demand"
    assert s["rates"][0]["price_per_card_hour"] == "1.50"
    by_course = Decimal(s["paid_by"]["course"]["exact"])
    personal = Decimal(s["paid_by"]["personal"]["exact"])
    assert by_course + personal == Decimal(s["amount"]["exact"])
    assert by_course <= cap  # never beyond the cap
    # The tail between the cap and the stop is the student's, and small (the enforcer's lag).
    assert personal <= 10 * A100_EDU_PER_S
    balance = Decimal(billing.balance(student)["balance"]["exact"])
    assert balance == Decimal(10) - personal
    r = billing.get(f"api/v1/courses/{course}")
    assert r.status_code == 200, r.text
    info = r.json()
    assert Decimal(info["pool_balance"]["exact"]) == Decimal(5) - by_course
    (row,) = info["students"]
    assert row["user"] == student and Decimal(row["used"]["exact"]) == by_course
    # The student's statement page says who paid; the student cannot read the course, nor set it.
    token = user_token(chub, student)
    page = billing.get("", token)
    assert page.status_code == 200 and f"course {course} (education price)" in page.text
    assert f"paid by the course {s['paid_by']['course']['display']}" in page.text
    assert billing.get(f"api/v1/courses/{course}", token).status_code == 403
    r = requests.put(
        billing.base + f"api/v1/courses/{course}",
        headers={"Authorization": f"token {token}"},
        json={"cap": "100"},
        timeout=30,
    )
    assert r.status_code == 403


def test_a_server_staff_start_is_paid_by_the_pool_never_by_the_student(chub, billing) -> None:
    """Attack 02: a teacher started a student's server on A100s under their course (empty pool,
    overflow "personal"), ran their own work in it, and billing charged the STUDENT's balance.
    A server someone other than its owner starts is the course pool's alone: refused at start,
    naming the pool, when the pool cannot pay; once the pool can, the student's balance never
    moves and the server is stopped at the cap. The student's own start is billed as usual."""
    tag = uuid.uuid4().hex[:6]
    teacher, student = chub.create_user(f"t{tag}"), chub.create_user(f"s{tag}")
    course = f"sp{tag}"
    staff_course(chub, course, [teacher])
    assert staff_roster(chub, course, f"{student},student\n", chub.token).status_code == 200
    t_token = token_for(chub, teacher)
    opts = {"gpu": "a100-80g", "course": course}

    r = chub.api("POST", f"/users/{student}/server", token=t_token, json=opts)
    assert r.status_code == 402, r.text
    message = r.json()["message"]
    assert f"paid by course {course}'s pool only" in message, message
    assert chub.server(student) is None
    assert billing.balance(student)["balance"]["exact"] == "10"

    # A pool that can pay: the teacher's start runs on it; the student's balance never moves,
    # and the server is stopped when the cap is used up (as if overflow were "refuse").
    r = billing.post(
        f"api/v1/courses/{course}/credits",
        {"amount": "5.00", "kind": "topup", "idempotency_key": f"{course}-1"},
    )
    assert r.status_code == 201, r.text
    put_course(billing, course, {"cap": "1.00"})
    r = chub.api("POST", f"/users/{student}/server", token=t_token, json=opts)
    assert r.status_code in (201, 202), r.text
    chub.wait_ready(student)
    chub.kernel(student)
    time.sleep(4)
    status = billing.get(f"api/v1/users/{student}/balance", params={"course": course}).json()
    used = Decimal(status["course"]["used"]["exact"])
    put_course(billing, course, {"cap": str((used + 4 * A100_EDU_PER_S).quantize(Decimal("1e-6")))})
    wait_for(lambda: chub.server(student) is None, 60, 0.5, "the enforcer to stop the server")
    usage = wait_for(
        lambda: (u := billing.usage(student)) and all(s["stopped"] for s in u["servers"]) and u,
        30, 0.5, "the stop in the statement",
    )  # fmt: skip
    (s,) = usage["servers"]
    assert Decimal(s["paid_by"]["personal"]["exact"]) == 0, s
    assert Decimal(s["paid_by"]["course"]["exact"]) > 0, s
    assert billing.balance(student)["balance"]["exact"] == "10"

    # The student's own start under the course is billed as usual (overflow "personal").
    put_course(billing, course, {"cap": "0"})
    r = chub.api("POST", f"/users/{student}/server", token=token_for(chub, student), json=opts)
    assert r.status_code in (201, 202), r.text
    chub.wait_ready(student)
    chub.stop_server(student)
