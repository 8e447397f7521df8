"""The course API of the billing service (its real handlers and routes, on a real SQLite store)
with the hub's authentication replaced by fixed token models: who may read, change and top up a
course, bad input answered 400 naming the field with nothing changed, the balance API's
``course``; and the hub's refusal messages for course starts."""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal
from types import SimpleNamespace

import pytest
from billing.courses import TRIAL, course_start, feed
from billing.scenario import heartbeat, kernel
from billing.service import Client, make_service, serve

from gpulab.billing_service.models import MICRO
from gpulab.catalog import load_catalog
from gpulab.hub_config.billing.hooks import BillingHooks, course_refusal
from gpulab.spawners.mixin import SpawnError
from gpulab.spawners.options import parse_options
from gpulab.spawners.request import SpawnRequest

COURSE = "ml101"
READ = "custom:gpulab:course-read"
MANAGE = "custom:gpulab:course-manage"
TOKENS = {
    "admin": {"kind": "user", "name": "admin", "scopes": ["admin:users"]},
    "ta": {"kind": "user", "name": "ta", "scopes": [f"{READ}!group={COURSE}"]},
    "teacher": {
        "kind": "user",
        "name": "teacher",
        "scopes": [f"{READ}!group={COURSE}", f"{MANAGE}!group={COURSE}"],
    },
    "other-ta": {"kind": "user", "name": "ota", "scopes": [f"{READ}!group=cs202"]},
    "student": {"kind": "user", "name": "stud", "scopes": []},
    # A user who signed up as the pool's would-be account name.
    "pool-name": {"kind": "user", "name": f"course:{COURSE}", "scopes": []},
    "outsider": {"kind": "user", "name": "out", "scopes": []},
}


@pytest.fixture
def service(tmp_path, monkeypatch):
    """The billing app on a free port, its store a fresh SQLite file."""
    app = make_service(tmp_path, monkeypatch, TOKENS)
    yield app
    app.executor.shutdown()
    app.engine.dispose()


def test_who_may_read_change_and_top_up_a_course(service) -> None:
    async def scenario(c: Client) -> None:
        # Teachers set the cap and rules; TAs and other courses' staff may not.
        code, body = await c.call("PUT", f"courses/{COURSE}", "teacher", {"cap": "5.00"})
        assert code == 200, body
        assert body["cap"]["exact"] == "5" and body["period"] == "week"
        for token in ("ta", "other-ta", "student", "pool-name"):
            code, body = await c.call("PUT", f"courses/{COURSE}", token, {"cap": "500"})
            assert code == 403, (token, body)
        # TAs, teachers and admins read it; other courses' staff and students do not.
        for token in ("ta", "teacher", "admin"):
            code, body = await c.call("GET", f"courses/{COURSE}", token)
            assert code == 200 and body["cap"]["micro"] == 5 * MICRO, (token, body)
        for token in ("other-ta", "student", "pool-name"):
            code, _ = await c.call("GET", f"courses/{COURSE}", token)
            assert code == 403, token
        # Only admins top up a pool, once per key.
        credit = {"amount": "20.00", "kind": "topup", "idempotency_key": "k1"}
        for token in ("teacher", "pool-name"):
            code, _ = await c.call("POST", f"courses/{COURSE}/credits", token, credit)
            assert code == 403
        code, body = await c.call("POST", f"courses/{COURSE}/credits", "admin", credit)
        assert code == 201 and body["pool_balance"]["exact"] == "20", body
        code, body = await c.call("POST", f"courses/{COURSE}/credits", "admin", credit)
        assert code == 200 and not body["created"] and body["pool_balance"]["exact"] == "20"
        code, _ = await c.call(
            "POST", f"courses/{COURSE}/credits", "admin", {**credit, "amount": "30.00"}
        )
        assert code == 409
        # The user named like the pool has only their own trial credit.
        code, body = await c.call("GET", f"users/course:{COURSE}/balance", "pool-name")
        assert code == 200 and body["balance"]["micro"] == TRIAL
        code, body = await c.call("GET", f"courses/{COURSE}", "admin")
        assert body["pool_balance"]["micro"] == 20 * MICRO

    serve(service, scenario)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cap": "-1.00"}, "cap"),
        ({"cap": "x"}, "cap"),
        ({"period": "month"}, "period"),
        ({"period": "term", "term_start": "2026-09-01"}, "term_end"),
        ({"period": "term", "term_start": "2026-09-01", "term_end": "2026-13-01"}, "term_end"),
        ({"overflow": "never"}, "overflow"),
        ({"cap": "1.00", "colour": "red"}, "colour"),
    ],
)
def test_bad_settings_answer_400_naming_the_field_and_change_nothing(service, body, field) -> None:
    async def scenario(c: Client) -> None:
        good = {"cap": "2.00", "overflow": "refuse"}
        assert (await c.call("PUT", f"courses/{COURSE}", "teacher", good))[0] == 200
        _, before = await c.call("GET", f"courses/{COURSE}", "teacher")
        code, answer = await c.call("PUT", f"courses/{COURSE}", "teacher", body)
        assert code == 400 and answer["field"] == field, answer
        assert answer["message"].startswith(f"{field}: ")
        _, after = await c.call("GET", f"courses/{COURSE}", "teacher")
        assert after == before
        # A bad course name, anywhere: 400 naming `course`, and no course made.
        for method, path in (
            ("GET", "courses/ML_101"),
            ("PUT", "courses/ML_101"),
            ("GET", "users/stud/balance?course=ML_101"),
        ):
            code, answer = await c.call(method, path, "admin", {"cap": "1"})
            assert code == 400 and answer["field"] == "course", answer

    serve(service, scenario)


async def capped_pool_with(c: Client, service, events) -> None:
    """The course capped at 1.00 a period (refusing past it), its pool funded with 50, and
    ``events`` fed to billing."""
    await c.call("PUT", f"courses/{COURSE}", "admin", {"cap": "1.00", "overflow": "refuse"})
    await c.call(
        "POST",
        f"courses/{COURSE}/credits",
        "admin",
        {"amount": "50", "idempotency_key": uuid.uuid4().hex},
    )
    await asyncio.get_running_loop().run_in_executor(None, feed, service.engine, events)


def test_the_balance_api_says_where_a_student_stands(service) -> None:
    now = time.time()
    events = [
        course_start("stud", now - 3600, COURSE),
        kernel("kernel_start", "stud", "k", now - 3600),
        heartbeat("stud", now - 1, ["k"]),
    ]

    async def scenario(c: Client) -> None:
        await capped_pool_with(c, service, events)
        code, body = await c.call("GET", f"users/stud/balance?course={COURSE}", "student")
        assert code == 200, body
        course = body["course"]
        assert course["name"] == COURSE and course["overflow"] == "refuse"
        # 3599 s at 1.50/h: 1.4996, of which the pool pays the cap (1.00) if this week holds it
        # all (else less: the seconds before Monday count in last week).
        assert course["cap"]["micro"] == MICRO
        assert course["used"]["micro"] + course["left"]["micro"] == MICRO
        assert course["available"]["micro"] == course["left"]["micro"]
        assert course["pool_balance"]["micro"] == 50 * MICRO - _pool_paid(service)
        assert course["period_start"] and course["period_end"]
        code, info = await c.call("GET", f"courses/{COURSE}", "ta")
        (student,) = info["students"]
        assert student["user"] == "stud" and student["used"] == course["used"]
        # The statement says who paid.
        code, usage = await c.call("GET", "users/stud/usage?from=2000-01-01", "student")
        (s,) = usage["servers"]
        assert s["course"] == COURSE
        paid = s["paid_by"]
        assert paid["course"]["micro"] + paid["personal"]["micro"] == s["amount"]["micro"]

    serve(service, scenario)


def _pool_paid(service) -> int:
    from gpulab.billing_service import ledger

    with service.engine.connect() as conn:
        return 50 * MICRO - ledger.balance(conn, ledger.pool(COURSE))


# ---- the hub's refusals ------------------------------------------------------------------------


def record(**kw) -> dict:
    out = {
        "name": COURSE,
        "cap": {"exact": "5"},
        "used": {"exact": "5"},
        "left": {"exact": "0"},
        "available": {"exact": "0"},
        "pool_balance": {"exact": "100"},
        "period": "week",
        "term_start": None,
        "term_end": None,
        "overflow": "refuse",
        "in_period": True,
    }
    for k, v in kw.items():
        out[k] = {"exact": v} if k in ("cap", "used", "left", "available", "pool_balance") else v
    return out


def test_refusal_messages_name_the_reason() -> None:
    need, bal = Decimal("0.25"), Decimal("3.00")
    msg = course_refusal(record(), bal, need, "A100-80G x1", 10, "CNY")
    assert msg == (
        "Your weekly cap in course ml101 (CNY 5.00) is used up: CNY 5.00 of 5.00 this week; "
        "the course refuses usage beyond the cap."
    )
    msg = course_refusal(
        record(used="4.90", left="0.10", available="0.10"), bal, need, "A100-80G x1", 10, "CNY"
    )
    assert "has CNY 0.10 left" in msg and "CNY 0.25 for 10 minutes of A100-80G x1" in msg
    msg = course_refusal(
        record(used="0", left="5", available="0.10", pool_balance="0.10"), bal, need, "X", 10, "CNY"
    )
    assert msg.startswith("The credit pool of course ml101 has CNY 0.10 left")
    msg = course_refusal(
        record(period="term", in_period=False, term_start="2026-09-01", term_end="2027-01-15"),
        bal,
        need,
        "X",
        10,
        "CNY",
    )
    assert "only during its term (2026-09-01 to 2027-01-15)" in msg
    assert course_refusal(record(available="0.25", left="0.25"), bal, need, "X", 10, "CNY") is None
    # Overflow personal: the pool's share plus the student's own balance.
    personal = record(overflow="personal", available="0.10", left="0.10")
    assert course_refusal(personal, Decimal("0.15"), need, "X", 10, "CNY") is None
    msg = course_refusal(personal, Decimal("0.05"), need, "X", 10, "CNY")
    assert msg.startswith("Course ml101 can pay CNY 0.10 more for you this week")
    assert "your balance is CNY 0.05" in msg


def test_the_hub_asks_with_the_course_and_refuses(monkeypatch) -> None:
    catalog = load_catalog()
    hooks = BillingHooks("http://billing.invalid/", "t" * 32, min_minutes=10)
    asked: list[str] = []

    async def call(method, path, body=None):
        asked.append(path)
        return {"balance": {"exact": "100"}, "course": record()}

    monkeypatch.setattr(hooks, "_call_when_up", call)
    opts = parse_options({"gpu": "a100-80g", "course": COURSE}, catalog)
    spawner = SimpleNamespace(
        # No monthly reservation to run on.
        pool=SimpleNamespace(
            catalog=catalog, allocator=SimpleNamespace(usable_hold=lambda *a: None)
        ),
        user=SimpleNamespace(name="stud"),
        name="",  # the default server
        owner="stud",
    )
    with pytest.raises(SpawnError) as e:
        asyncio.run(hooks.check_balance(spawner, SpawnRequest("stud/", {}, opts)))
    assert e.value.status_code == 402 and "is used up" in e.value.log_message % e.value.args
    assert asked == [f"api/v1/users/stud/balance?course={COURSE}"]


def test_a_course_pool_is_not_read_by_anyone_through_their_own_balance(service) -> None:
    """Attack (issue 21 wave): any user asked ``users/ME/balance?course=C`` and read C's pool
    balance, cap and rules. Now only who ran a server under C, its staff and admins see it."""
    now = time.time()
    events = [course_start("stud", now - 600, COURSE), heartbeat("stud", now - 1, [])]

    async def scenario(c: Client) -> None:
        await capped_pool_with(c, service, events)
        code, body = await c.call("GET", f"users/out/balance?course={COURSE}", "outsider")
        assert code == 403 and "course" not in body, body
        code, body = await c.call("GET", f"users/out/balance?course={COURSE}", "other-ta")
        assert code == 403, body
        code, body = await c.call("GET", "users/out/balance", "outsider")
        assert code == 200 and "course" not in body, body
        code, body = await c.call("GET", f"users/stud/balance?course={COURSE}", "student")
        assert code == 200 and body["course"]["name"] == COURSE, body
        code, body = await c.call("GET", f"users/stud/balance?course={COURSE}", "ta")
        assert code == 403, body  # the TA is not stud: require_user first
        code, body = await c.call("GET", f"users/stud/balance?course={COURSE}", "admin")
        assert code == 200 and body["course"]["pool_balance"]["micro"] > 0, body

    serve(service, scenario)
