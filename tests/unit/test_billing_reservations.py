"""Prepaid reservations (hybrid billing) on the store (real SQLite and a real PostgreSQL) and
through the service's real handlers: the prepaid amount exact, charged once per id (replays,
concurrent duplicates, a billing process SIGKILLed between the charge and its answer), 402 with
nothing changed, usage inside a reservation charged 0 and outside it on demand, forged tags billed
normally, course reservations paid from the pool (never counting towards a cap), statements
showing each part, and bad input answered 400 naming the field."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from alembic import command
from billing.courses import PRICES, TRIAL, audit, balance, enforcer_app, feed, paid, pool
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from billing.reservations import reserve, tagged_start
from billing.scenario import heartbeat, kernel, server_stop
from billing.service import make_service, serve
from sqlalchemy import func, select
from tornado.escape import url_escape
from tornado.template import Loader

from gpulab.billing_service import courses, ledger, reservations, statements
from gpulab.billing_service.app import TEMPLATES
from gpulab.billing_service.chart import bar_chart
from gpulab.billing_service.csv_export import render
from gpulab.billing_service.db import alembic_config, make_engine
from gpulab.billing_service.enforce import Enforcer
from gpulab.billing_service.hub_links import HubLinks
from gpulab.billing_service.models import (
    MICRO,
    CourseCharge,
    CourseLedgerEntry,
    LedgerEntry,
    Reservation,
    ServerSession,
)
from gpulab.billing_service.rating import PriceBook, format_money
from gpulab.catalog import load_catalog

MONDAY = datetime(2026, 6, 1, tzinfo=UTC).timestamp()
HOUR = 3600
A100_MONTHLY = 1_850_000  # catalog monthly_price of a100-80g per card-hour
A100_ON_DEMAND = 2_100_000
A100_EDU = 1_500_000
FAR = round(MONDAY * MICRO) + 400 * 86_400 * MICRO  # a statement's "to" after every test's time


def name(prefix: str = "u") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def rid() -> str:
    return f"res-{uuid.uuid4().hex[:10]}"


def body(account: str, start: float, end: float, cards: int = 1, gpu: str = "a100-80g", **kw):
    return {
        "id": kw.pop("id", None) or rid(),
        "account": account,
        "gpu_type": gpu,
        "cards": cards,
        "start": start,
        "end": end,
        **kw,
    }


def topup(engine, user: str, amount: str) -> None:
    with engine.begin() as conn:
        ledger.credit(
            conn,
            user,
            "topup",
            int(Decimal(amount) * MICRO),
            uuid.uuid4().hex,
            0,
            trial_micro=TRIAL,
        )


def pool_topup(engine, course: str, amount: str, cap: str = "0") -> None:
    with engine.begin() as conn:
        current = courses.Settings.of(courses.get(conn, course))
        settings = courses.parse_settings({"cap": cap}, current)
        courses.put_settings(conn, course, settings, 0, "teacher")
        ledger.credit(
            conn, ledger.pool(course), "topup", int(Decimal(amount) * MICRO), uuid.uuid4().hex, 0
        )


def reservation_entries(engine, res_id: str) -> list:
    with engine.connect() as conn:
        key = f"reservation:{res_id}"
        users = conn.execute(select(LedgerEntry).where(LedgerEntry.idempotency_key == key)).all()
        pools = conn.execute(
            select(CourseLedgerEntry).where(CourseLedgerEntry.idempotency_key == key)
        ).all()
    return [*users, *pools]


def run(user: str, t0: float, seconds: float, start_event: dict, server: str = "") -> list:
    """A server started by ``start_event`` with one kernel alive from t0 for ``seconds``."""
    kid = f"k-{uuid.uuid4().hex[:6]}"
    out = [start_event, kernel("kernel_start", user, kid, t0, server)]
    t = 60.0
    while t < seconds:
        out.append(heartbeat(user, t0 + t, [kid], server))
        t += 60.0
    out.append(kernel("kernel_stop", user, kid, t0 + seconds, server))
    out.append(server_stop(user, t0 + seconds, server))
    return out


def session_of(engine, user: str, server: str = ""):
    with engine.connect() as conn:
        return conn.execute(
            select(ServerSession).where(ServerSession.user == user, ServerSession.server == server)
        ).one()


def usage(engine, user: str) -> dict:
    with engine.connect() as conn:
        return statements.usage(conn, PRICES, user, 0, FAR)


# ---- the prepaid amount and its charge --------------------------------------------------------


def test_the_prepaid_amount_is_exact() -> None:
    # 2 cards x 1.85 x 720 h (30 days) = 2,664.00 exactly.
    assert reservations.amount_micro(A100_MONTHLY, 2, 0, 720 * HOUR * MICRO) == 2_664 * MICRO
    # 1 card x 0.55 x 1001 s = 0.152930555...: rounded once, half to even, to the micro-unit.
    assert reservations.amount_micro(550_000, 1, 0, 1001 * MICRO) == 152_931
    # Exactly half a micro-unit: to the even neighbour (1 card-second at 1.80: 0.0005 = 500).
    assert reservations.amount_micro(1_800_000, 1, 0, MICRO) == 500
    assert reservations.amount_micro(1, 1, 0, 1_800 * MICRO) == 0  # 0.5 micro -> 0 (even)
    assert reservations.amount_micro(3, 1, 0, 1_800 * MICRO) == 2  # 1.5 micro -> 2 (even)


def test_a_user_reservation_is_charged_once_to_the_balance(engine) -> None:
    user = name()
    topup(engine, user, "3000")
    before = balance(engine, user)
    b = body(f"user:{user}", MONDAY, MONDAY + 720 * HOUR, cards=2)
    out = reserve(engine, b)
    assert out["created"] and out["amount"]["micro"] == 2_664 * MICRO
    assert out["price_per_card_hour"] == "1.85" and out["hours"] == 720
    assert (out["start"], out["end"], out["cards"]) == (b["start"], b["end"], 2)
    assert out["balance"]["micro"] == before - 2_664 * MICRO == balance(engine, user)
    (entry,) = reservation_entries(engine, b["id"])
    assert entry.kind == "reservation" and entry.amount_micro == -2_664 * MICRO
    assert b["id"] in entry.note and "2 x a100-80g" in entry.note and entry.actor == "hub"
    # The same id and terms again: the same record, no second charge.
    again = reserve(engine, b)
    assert not again["created"] and again["amount"] == out["amount"]
    assert balance(engine, user) == before - 2_664 * MICRO
    # The same id with other terms: refused, nothing changed.
    for change in ({"cards": 3}, {"end": b["end"] + 1}, {"account": f"user:{name()}"}):
        with pytest.raises(reservations.Conflict):
            reserve(engine, {**b, **change})
    assert len(reservation_entries(engine, b["id"])) == 1
    with engine.connect() as conn:
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)
    # An odd window: 1001 s of one rtx-4090 at 0.55: 0.152931.
    odd = reserve(engine, body(f"user:{user}", MONDAY, MONDAY + 1001, gpu="rtx-4090"))
    assert odd["amount"]["micro"] == 152_931
    assert balance(engine, user) == before - 2_664 * MICRO - 152_931


def test_concurrent_duplicates_charge_once(engine) -> None:
    user = name()
    topup(engine, user, "100")
    b = body(f"user:{user}", MONDAY, MONDAY + 10 * HOUR, cards=2)  # 37.00
    results: list[dict] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def post() -> None:
        try:
            barrier.wait(30)
            results.append(reserve(engine, b))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=post) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(r["created"] for r in results) == [False] * 5 + [True]
    assert {r["amount"]["micro"] for r in results} == {37 * MICRO}
    assert balance(engine, user) == TRIAL + 100 * MICRO - 37 * MICRO
    assert len(reservation_entries(engine, b["id"])) == 1
    with engine.connect() as conn:
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)


def test_an_account_that_cannot_pay_it_all_is_refused_and_nothing_changes(engine) -> None:
    user, course = name(), f"c{uuid.uuid4().hex[:8]}"
    b = body(f"user:{user}", MONDAY, MONDAY + 720 * HOUR, cards=2)
    with pytest.raises(reservations.PaymentRequired) as e:
        reserve(engine, b)
    assert e.value.field == "balance"
    assert e.value.message.startswith(
        f"Your balance (CNY 10.00) cannot prepay reservation {b['id']}: 2 x a100-80g for 720 h "
        "at CNY 1.85/card-hour = CNY 2664.00"
    )
    # Nothing stays: no reservation, no entry, the balance as it was (the trial credit only,
    # as for any account billing sees).
    assert balance(engine, user) in (None, TRIAL)
    assert not reservation_entries(engine, b["id"])
    with engine.connect() as conn:
        assert reservations.get(conn, b["id"]) is None
    # Paid once the balance holds it: the id was never used.
    topup(engine, user, "2654")
    assert reserve(engine, b)["created"]
    assert balance(engine, user) == 0
    # A pool that cannot pay: the same, naming the pool.
    pool_topup(engine, course, "5.00")
    cb = body(f"course:{course}", MONDAY, MONDAY + 3 * HOUR)  # 5.55
    with pytest.raises(reservations.PaymentRequired) as e:
        reserve(engine, cb)
    assert e.value.message.startswith(
        f"The credit pool of course {course} (CNY 5.00) cannot prepay reservation {cb['id']}"
    )
    assert pool(engine, course) == 5 * MICRO and not reservation_entries(engine, cb["id"])


# ---- usage inside a reservation ---------------------------------------------------------------


def test_a_tagged_session_costs_nothing_inside_the_window_and_on_demand_outside(engine) -> None:
    user = name()
    topup(engine, user, "10")
    b = body(f"user:{user}", MONDAY + HOUR, MONDAY + 2 * HOUR)  # one card-hour: 1.85
    reserve(engine, b)
    before = balance(engine, user)
    # A server on the reservation from 10 minutes before it starts to 10 minutes after it ends.
    t0 = MONDAY + HOUR - 600
    feed(engine, run(user, t0, HOUR + 1200, tagged_start(user, t0, b["id"])))
    s = session_of(engine, user)
    assert s.reservation == b["id"] and s.billed_us == (HOUR + 1200) * MICRO
    assert s.charged_micro == A100_ON_DEMAND * 1200 // HOUR == 700_000
    assert balance(engine, user) == before - 700_000
    # An untagged server of the same user at the same time (overflow): on demand, in full.
    feed(engine, run(user, t0, HOUR, tagged_start(user, t0, None, server="x"), server="x"))
    assert session_of(engine, user, "x").charged_micro == A100_ON_DEMAND
    # The statement shows each part: the prepaid reservation, usage in it (0), the rest.
    u = usage(engine, user)
    (res,) = u["reservations"]
    assert (res["id"], res["cards"], res["gpu_type"], res["amount"]["micro"]) == (
        b["id"],
        1,
        "a100-80g",
        A100_MONTHLY,
    )
    assert res["from"] == "2026-06-01T01:00:00Z" and res["to"] == "2026-06-01T02:00:00Z"
    assert u["prepaid"] == {"reservations": statements.money(A100_MONTHLY), "seconds": HOUR}
    row = next(r for r in u["servers"] if r["server"] == "")
    assert row["prepaid_seconds"] == HOUR and row["amount"]["micro"] == 700_000
    assert row["reservation"]["applied"] and row["reservation"]["id"] == b["id"]
    assert [
        (r["billed_seconds"], r["price_per_card_hour"], r.get("prepaid")) for r in row["rates"]
    ] == [
        (600, "2.10", None),
        (HOUR, "0", True),
        (600, "2.10", None),
    ]
    other = next(r for r in u["servers"] if r["server"] == "x")
    assert other["reservation"] is None and other["prepaid_seconds"] == 0
    assert sum(d["micro"] for d in u["daily"]) == u["total"]["amount"]["micro"]
    rows = list(csv.DictReader(io.StringIO(render(u))))
    (rrow,) = [r for r in rows if r["row"] == "reservation"]
    assert (rrow["reservation"], rrow["amount_CNY"], rrow["pricing"]) == (
        b["id"],
        "1.85",
        "prepaid",
    )
    (srv,) = [r for r in rows if r["row"] == "server" and r["server"] == ""]
    assert (srv["reservation"], srv["prepaid_seconds"], srv["amount_CNY"]) == (
        b["id"],
        "3600.0",
        "0.7",
    )
    prepaid_rates = [r for r in rows if r["row"] == "rate" and r["reservation"]]
    assert [(r["price_per_card_hour"], r["prepaid_seconds"]) for r in prepaid_rates] == [
        ("0", "3600.0")
    ]
    with engine.connect() as conn:
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)


def test_the_statement_page_shows_each_part(sqlite_engine) -> None:
    """The page's template with a real statement: the reservation's prepaid line, the session's
    prepaid seconds (charged 0) and its time on demand, and an ignored tag named as such."""
    user = name()
    b = body(f"user:{user}", MONDAY + HOUR, MONDAY + 2 * HOUR)
    reserve(sqlite_engine, b)
    t0 = MONDAY + HOUR - 600
    feed(sqlite_engine, run(user, t0, HOUR + 1200, tagged_start(user, t0, b["id"])))
    forged = tagged_start(user, t0, "res-forged", server="f")
    feed(sqlite_engine, run(user, t0, 600, forged, server="f"))
    u = usage(sqlite_engine, user)
    with sqlite_engine.begin() as conn:
        bal = statements.balance_info(conn, PRICES, user, 0, 30 * MICRO, [2 * MICRO])
    html = (
        Loader(str(TEMPLATES))
        .load("statement.html")
        .generate(
            me=user,
            name=user,
            usage=u,
            chart=bar_chart(u["daily"], u["currency"], u["time_zone"]),
            spend_total=format_money(sum(d["micro"] for d in u["daily"])),
            balance=bal,
            overview=None,
            rows=statements.page_rows(u, [], MONDAY + 3 * HOUR, open_end=False),
            period=statements.human_period(u, MONDAY + 3 * HOUR),
            prefix="/services/billing/",
            hub=HubLinks("/hub/"),
            hub_admin=False,
            service_name="billing",
            from_arg="",
            to_arg="",
            xsrf="",
            url_escape=url_escape,
        )
        .decode()
    )
    assert f'<tr class="reservation" data-reservation="{b["id"]}">' in html
    assert "a100-80g x1" in html and "1.85" in html
    assert "3600.0 s prepaid, charged 0; 1200.0 s on demand" in html
    assert "reservation res-forged not applied (reservation res-forged is unknown" in html


def test_forged_tags_are_billed_normally(engine) -> None:
    alice, mallory = name("alice"), name("mallory")
    topup(engine, alice, "100")
    a100 = body(f"user:{alice}", MONDAY, MONDAY + 10 * HOUR, cards=2)
    rtx = body(f"user:{mallory}", MONDAY, MONDAY + 10 * HOUR, gpu="rtx-4090")
    topup(engine, mallory, "100")
    reserve(engine, a100)
    reserve(engine, rtx)
    course = f"c{uuid.uuid4().hex[:8]}"
    pool_topup(engine, course, "100")
    course_res = body(f"course:{course}", MONDAY, MONDAY + 10 * HOUR)
    reserve(engine, course_res)
    t0 = MONDAY + HOUR
    cases = {
        "other-user": tagged_start(mallory, t0, a100["id"], server="other-user"),
        "unknown": tagged_start(mallory, t0, "res-never-paid", server="unknown"),
        "other-type": tagged_start(mallory, t0, rtx["id"], gpu="a100-80g", server="other-type"),
        "too-many-cards": tagged_start(alice, t0, a100["id"], gpus=3, server="too-many-cards"),
        "not-the-course": tagged_start(mallory, t0, course_res["id"], server="not-the-course"),
    }
    for server, start in cases.items():
        feed(engine, run(start["user"], t0, HOUR, start, server=server))
    for server, start in cases.items():
        s = session_of(engine, start["user"], server)
        assert s.charged_micro == A100_ON_DEMAND * s.gpus, server
    u = usage(engine, mallory)
    ignored = {r["server"]: r["reservation"] for r in u["servers"]}
    assert not ignored["unknown"]["applied"] and "unknown" in ignored["unknown"]["reason"]
    assert "not to user" in ignored["other-user"]["reason"]
    assert "is for rtx-4090" in ignored["other-type"]["reason"]
    assert u["prepaid"]["seconds"] == 0
    assert all(r["prepaid_seconds"] == 0 for r in u["servers"])
    rows = [r for r in csv.DictReader(io.StringIO(render(u))) if r["row"] == "server"]
    assert all(r["note"].startswith("reservation tag ignored") for r in rows)
    audit(engine, course, [alice, mallory])


def test_a_course_reservation_is_paid_from_the_pool_and_counts_towards_no_cap(engine) -> None:
    student, course = name("s"), f"c{uuid.uuid4().hex[:8]}"
    pool_topup(engine, course, "100", cap="1.00")
    b = body(f"course:{course}", MONDAY + HOUR, MONDAY + 11 * HOUR, cards=2)  # 37.00
    out = reserve(engine, b, actor="hub")
    assert out["balance"]["micro"] == pool(engine, course) == 63 * MICRO
    (entry,) = reservation_entries(engine, b["id"])
    assert entry.kind == "reservation" and entry.amount_micro == -37 * MICRO and entry.user == ""
    # A student's course server on the reservation: 30 minutes before it (education price,
    # split with the pool up to the cap), 5 hours inside it (0).
    t0 = MONDAY + HOUR - 1800
    start = tagged_start(student, t0, b["id"], course=course)
    feed(engine, run(student, t0, 1800 + 5 * HOUR, start))
    s = session_of(engine, student)
    assert s.charged_micro == A100_EDU // 2 == 750_000
    assert paid(engine, student) == (750_000, 0)  # all of it from the pool, within the cap
    with engine.connect() as conn:
        rows = conn.execute(select(CourseCharge).where(CourseCharge.session_id == s.id)).all()
        used = courses.used(conn, course, student, courses.week_start(round(MONDAY * MICRO)))
    assert sum(r.amount_micro for r in rows) == 750_000 and used == 750_000
    assert pool(engine, course) == 63 * MICRO - 750_000
    assert balance(engine, student) == TRIAL
    # The course's statement shows its reservation's charge to the pool.
    with engine.connect() as conn:
        info = statements.course_info(conn, course, round(MONDAY * MICRO), "CNY")
    (res,) = info["reservations"]
    assert res["id"] == b["id"] and res["amount"]["micro"] == 37 * MICRO
    assert res["paid_by"] == "course" and info["reservations_total"]["micro"] == 37 * MICRO
    # The student's statement: the session on the course's reservation, prepaid seconds.
    u = usage(engine, student)
    (row,) = u["servers"]
    assert (
        row["reservation"]["account"] == f"course:{course}" and row["prepaid_seconds"] == 5 * HOUR
    )
    assert u["reservations"] == []  # the course paid it, not the student
    # The same student's session outside the course is not on the course's reservation.
    other = tagged_start(student, MONDAY + 2 * HOUR, b["id"], server="own")
    feed(engine, run(student, MONDAY + 2 * HOUR, HOUR, other, server="own"))
    assert session_of(engine, student, "own").charged_micro == A100_ON_DEMAND
    audit(engine, course, [student])


def test_a_reservation_recorded_after_its_tagged_session_re_rates_it(engine) -> None:
    user = name()
    topup(engine, user, "10")
    res_id = rid()
    feed(engine, run(user, MONDAY, HOUR, tagged_start(user, MONDAY, res_id)))
    assert session_of(engine, user).charged_micro == A100_ON_DEMAND
    before = balance(engine, user)
    reserve(engine, body(f"user:{user}", MONDAY + 1800, MONDAY + 2 * HOUR, id=res_id))
    # 1.5 card-hours prepaid (2.775); the session's half hour inside it is refunded (1.05).
    assert session_of(engine, user).charged_micro == A100_ON_DEMAND // 2
    assert balance(engine, user) == before - 2_775_000 + 1_050_000
    with engine.connect() as conn:
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)


def test_inside_its_reservation_a_server_is_not_stopped_for_money(engine) -> None:
    user = name()
    now = float(int(time.time()))
    topup(engine, user, "8.50")  # with the trial: 18.50, what 10 card-hours cost
    reserve(engine, body(f"user:{user}", now - HOUR, now + 9 * HOUR))
    assert balance(engine, user) == 0
    events = [
        tagged_start(user, now - 1800, None, server="plain"),
        kernel("kernel_start", user, "k2", now - 1800, "plain"),
        heartbeat(user, now - 1, ["k2"], "plain"),
    ]
    res_id = usage(engine, user)["reservations"][0]["id"]
    events += [
        tagged_start(user, now - 1800, res_id),
        kernel("kernel_start", user, "k", now - 1800),
        heartbeat(user, now - 1, ["k"]),
    ]
    feed(engine, events)
    app = enforcer_app(engine, zero_balance_action="stop")
    decisions = {s.server: a for a, s, _ in Enforcer(app).decide() if s.user == user}
    assert decisions == {"plain": "stop"}  # the on-demand server only
    with engine.connect() as conn:
        info = statements.balance_info(
            conn, PRICES, user, time.time_ns() // 1000, 30 * MICRO, [2 * MICRO]
        )
    assert info["burn_rate_per_hour"]["micro"] == A100_ON_DEMAND  # the reserved one burns 0


def test_a_catalog_type_without_a_monthly_price_cannot_be_reserved() -> None:
    cat = load_catalog()
    h100 = cat.gpu_types["h100-80g"].model_copy(update={"monthly_price": None})
    prices = PriceBook(cat.model_copy(update={"gpu_types": {**cat.gpu_types, "h100-80g": h100}}))
    with pytest.raises(reservations.ReservationError) as e:
        reservations.parse(body("user:a", MONDAY, MONDAY + 1, gpu="h100-80g"), prices)
    assert e.value.field == "gpu_type" and "allowed" in str(e.value)
    assert "h100-80g" not in str(e.value).split("allowed")[1]
    assert "a100-80g" in str(e.value).split("allowed")[1]


# ---- a billing process SIGKILLed ----------------------------------------------------------------

KILLER = """
import json, sys, time
sys.path.insert(0, {tests!r})
from billing.reservations import reserve
from gpulab.billing_service import reservations
from gpulab.billing_service.db import make_engine
from billing.courses import PRICES, TRIAL
engine = make_engine({url!r})
body = json.loads({body!r})
if {mode!r} == "answered":
    reserve(engine, body)  # committed: charged
    print("charged", flush=True)
else:
    with engine.begin() as conn:  # killed before the commit
        reservations.create(
            conn, PRICES, reservations.parse(body, PRICES), time.time_ns() // 1000,
            actor="hub", trial_micro=TRIAL,
        )
        print("charged", flush=True)
        time.sleep(600)
time.sleep(600)  # the answer never goes out
"""


@pytest.mark.parametrize("mode", ["answered", "uncommitted"])
def test_billing_killed_between_charge_and_answer_then_the_retry_charges_once(engine, mode) -> None:
    user = name()
    topup(engine, user, "50")
    before = balance(engine, user)
    b = body(f"user:{user}", MONDAY, MONDAY + 10 * HOUR, cards=2)  # 37.00
    url = engine.url.render_as_string(hide_password=False)
    script = KILLER.format(
        tests=str(Path(__file__).parents[1]), url=url, body=json.dumps(b), mode=mode
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "charged"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    committed = mode == "answered"
    assert balance(engine, user) == before - (37 * MICRO if committed else 0)
    # The hub got no answer and retries with the same id: one charge in all.
    out = reserve(engine, b)
    assert out["created"] is not committed
    assert reserve(engine, b)["created"] is False
    assert balance(engine, user) == before - 37 * MICRO
    assert len(reservation_entries(engine, b["id"])) == 1
    with engine.connect() as conn:
        assert ledger.balance(conn, user) == ledger.recompute_balance(conn, user)
        assert (
            conn.execute(
                select(func.count()).select_from(Reservation).where(Reservation.id == b["id"])
            ).scalar()
            == 1
        )


# ---- the API ----------------------------------------------------------------------------------

COURSE = "ml101"
READ = "custom:gpulab:course-read"
TOKENS = {
    "hub": {"kind": "service", "name": "hub-hooks", "scopes": ["admin:users"]},
    "alice": {"kind": "user", "name": "alice", "scopes": []},
    "bob": {"kind": "user", "name": "bob", "scopes": []},
    "ta": {"kind": "user", "name": "ta", "scopes": [f"{READ}!group={COURSE}"]},
    "other-ta": {"kind": "user", "name": "ota", "scopes": [f"{READ}!group=cs202"]},
}


@pytest.fixture
def service(tmp_path, monkeypatch):
    app = make_service(tmp_path, monkeypatch, TOKENS)
    yield app
    app.executor.shutdown()
    app.engine.dispose()


def test_the_api_reserves_once_refuses_and_lists(service) -> None:
    good = body("user:alice", MONDAY, MONDAY + 2 * HOUR, id="res-alice-1")  # 3.70

    async def scenario(c) -> None:
        # Only the hub's hooks and admins reserve.
        for token in ("alice", "ta"):
            code, _ = await c.call("POST", "reservations", token, good)
            assert code == 403, token
        code, out = await c.call("POST", "reservations", "hub", good)
        assert code == 201 and out["amount"]["exact"] == "3.7", out
        assert out["balance"]["micro"] == TRIAL - 3_700_000 and out["actor"] == "hub-hooks"
        code, again = await c.call("POST", "reservations", "hub", good)
        assert code == 200 and not again["created"] and again["id"] == "res-alice-1"
        code, conflict = await c.call("POST", "reservations", "hub", {**good, "cards": 2})
        assert code == 409 and "other terms" in conflict["message"]
        # 402: the whole amount or nothing.
        big = body("user:alice", MONDAY, MONDAY + 720 * HOUR, cards=4)
        code, refused = await c.call("POST", "reservations", "hub", big)
        assert code == 402 and refused["field"] == "balance", refused
        assert refused["message"].startswith("Your balance (CNY 6.30) cannot prepay")
        code, bal = await c.call("GET", "users/alice/balance", "alice")
        assert bal["balance"]["micro"] == TRIAL - 3_700_000
        # A course's reservation, paid from its pool.
        await c.call(
            "POST",
            f"courses/{COURSE}/credits",
            "hub",
            {"amount": "20", "idempotency_key": "pool-1"},
        )
        course_res = body(f"course:{COURSE}", MONDAY, MONDAY + HOUR, id="res-ml101-1")
        code, out = await c.call("POST", "reservations", "hub", course_res)
        assert code == 201 and out["balance"]["micro"] == 20 * MICRO - A100_MONTHLY, out
        code, info = await c.call("GET", f"courses/{COURSE}", "ta")
        assert [r["id"] for r in info["reservations"]] == ["res-ml101-1"]
        # Who lists what.
        code, mine = await c.call("GET", "reservations?account=user:alice", "alice")
        assert code == 200 and [r["id"] for r in mine["reservations"]] == ["res-alice-1"]
        for token, account in (("bob", "user:alice"), ("alice", f"course:{COURSE}")):
            code, _ = await c.call("GET", f"reservations?account={account}", token)
            assert code == 403, (token, account)
        code, _ = await c.call("GET", f"reservations?account=course:{COURSE}", "other-ta")
        assert code == 403
        code, listed = await c.call("GET", f"reservations?account=course:{COURSE}", "ta")
        assert code == 200 and [r["id"] for r in listed["reservations"]] == ["res-ml101-1"]
        code, everything = await c.call("GET", "reservations", "hub")
        assert {r["id"] for r in everything["reservations"]} == {"res-alice-1", "res-ml101-1"}
        code, answer = await c.call("GET", "reservations", "alice")
        assert code == 400 and answer["field"] == "account"
        code, answer = await c.call("GET", "reservations?account=alice", "hub")
        assert code == 400 and answer["field"] == "account"
        # The usage API and the statement page's data show the reservation as its own line.
        code, u = await c.call("GET", "users/alice/usage?from=2000-01-01", "alice")
        assert [r["id"] for r in u["reservations"]] == ["res-alice-1"]

    serve(service, scenario)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpu_type": "tpu-v5"}, "gpu_type"),
        ({"gpu_type": None}, "gpu_type"),
        ({"cards": 0}, "cards"),
        ({"cards": -1}, "cards"),
        ({"cards": 1.5}, "cards"),
        ({"cards": True}, "cards"),
        ({"end": MONDAY}, "end"),
        ({"end": MONDAY - 1}, "end"),
        ({"end": MONDAY + 400 * 86_400}, "end"),
        ({"start": "monday"}, "start"),
        ({"start": -5}, "start"),
        ({"account": "alice"}, "account"),
        ({"account": "group:ml101"}, "account"),
        ({"account": "course:ML 101"}, "account"),
        ({"account": "user:"}, "account"),
        ({"account": 7}, "account"),
        ({"id": ""}, "id"),
        ({"id": "res 1"}, "id"),
        ({"id": "x" * 129}, "id"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_input_answers_400_naming_the_field_and_changes_nothing(service, change, field) -> None:
    good = body("user:alice", MONDAY, MONDAY + HOUR, id="res-good")

    async def scenario(c) -> None:
        code, answer = await c.call("POST", "reservations", "hub", {**good, **change})
        assert code == 400 and answer["field"] == field, answer
        assert answer["message"].startswith(f"{field}: ")
        if field == "gpu_type":
            assert "a100-80g" in answer["message"] and "allowed" in answer["message"]
        code, listed = await c.call("GET", "reservations", "hub")
        assert listed["reservations"] == []
        code, bal = await c.call("GET", "users/alice/balance", "alice")
        assert bal["balance"]["micro"] == TRIAL

    serve(service, scenario)


def test_a_body_that_is_not_an_object_names_the_body(service) -> None:
    async def scenario(c) -> None:
        code, answer = await c.call("POST", "reservations", "hub", [1, 2])
        assert code == 400 and answer["field"] == "body"

    serve(service, scenario)


def test_the_migration_adds_reservations_and_tags_earlier_sessions(tmp_path) -> None:
    """0002 -> 0003 on a store with a session the hub reported with a reservation tag, and back."""
    engine = make_engine(f"sqlite:///{tmp_path / 'old.sqlite'}")
    cfg = alembic_config()

    def to(revision: str, down: bool = False) -> None:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(cfg, revision)

    to("0002")
    with engine.begin() as conn:
        for i, options in enumerate(['{"reservation": "res-7"}', "{}", "not json"]):
            conn.exec_driver_sql(
                "INSERT INTO server_sessions (start_event, user, server, gpu_type, gpus, pricing,"
                " options, started_us, billed_us, charged_micro) VALUES"
                f" ('e{i}', 'alice', '{i}', 'a100-80g', 1, 'on-demand', ?, 0, 0, 0)",
                (options,),
            )
    to("head")
    with engine.connect() as conn:
        tags = dict(conn.exec_driver_sql("SELECT server, reservation FROM server_sessions").all())
        assert conn.exec_driver_sql("SELECT count(*) FROM reservations").scalar() == 0
    assert tags == {"0": "res-7", "1": None, "2": None}
    to("0002", down=True)
    to("head")
