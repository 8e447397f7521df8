"""Money is enforced from what the hub observes, not from how fresh a server's reports are.

The attack (issue 20): from a notebook the user makes their reporter's spool folder read-only
(its heartbeat loop then fails without a word) and leaves a detached process behind that works
and posts empty heartbeats backdated by a little more than three heartbeat intervals, inside the
session and inside ``silent_timeout``, with the server's own token. Billing used to enforce money
only for sessions with a fresh heartbeat: the server ran on past zero (or past a refusing
course's cap) and kept its cards. Now the hub's observed spans charge the balance and keep the
session under the enforcer's eye, so the server is moved or stopped, and the balance goes below
zero by no more than the bound the README states.

A real hub, the real billing service, real servers with their reporter; the observer samples
every 0.5 s and reports every 1 s, billing enforces every 1 s with a 2 s switch margin.
"""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest
import requests
from billing.client import Billing
from harness import FAST_BILLING_ENV, HB, Hub, wait_for

ENFORCE = 1.0
MARGIN = 2.0
OBSERVE, REPORT = 0.5, 1.0
ENV = {
    **FAST_BILLING_ENV,
    "GPULAB_BILLING_ARGS": (
        f"--BillingService.heartbeat_interval={HB} --BillingService.enforce_interval={ENFORCE} "
        f"--BillingService.switch_margin={MARGIN} --BillingService.silent_timeout=120 "
        "--BillingService.idle_timeout=600"
    ),
}
OBSERVER = [
    f"--ActivityObserver.interval={OBSERVE}",
    f"--ActivityObserver.report_interval={REPORT}",
    "--ActivityObserver.gpu_idle_timeout=0",
    "--ActivityObserver.idle_timeout=0",
]
A100X2_PER_S = 2 * Decimal("2.10") / 3600
A100X2_EDU_PER_S = 2 * Decimal("1.50") / 3600
# The README's bound for these settings: the price x (1.2 x enforce_interval + report_interval +
# interval + the stop's time - switch_margin); 6 s allowed for the stop or switch itself.
STOP_ALLOWANCE = 6.0
DEBT_SECONDS = Decimal(str(1.2 * ENFORCE + REPORT + 1.1 * OBSERVE + STOP_ALLOWANCE - MARGIN))

# Run in the user's notebook: silence the reporter, then leave a worker behind that keeps the
# cards busy and posts empty heartbeats backdated by 3.5 intervals with the server's own token.
ATTACK = f"""
import os, pathlib, subprocess, sys
spool = pathlib.Path.home() / ".local/share/gpulab/spool" / (os.environ.get("JUPYTERHUB_SERVER_NAME") or "default")
spool.mkdir(parents=True, exist_ok=True)
for f in spool.iterdir():
    f.unlink()
spool.chmod(0o555)
code = '''
import json, os, time, urllib.request, uuid
url = os.environ["GPULAB_BILLING_URL"].rstrip("/") + "/api/v1/events"
headers = {{"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"],
           "Content-Type": "application/json"}}
while True:
    beat = {{"id": uuid.uuid4().hex, "kind": "heartbeat", "user": os.environ["JUPYTERHUB_USER"],
            "server": os.environ.get("JUPYTERHUB_SERVER_NAME", ""), "t": time.time() - {3.5 * HB},
            "kernels": []}}
    req = urllib.request.Request(url, json.dumps({{"events": [beat]}}).encode(), headers)
    try:
        urllib.request.urlopen(req, timeout=10).read()
    except Exception:
        pass
    end = time.time() + 0.5
    while time.time() < end:
        pass
'''
p = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid)
"""


@pytest.fixture(scope="module")
def ehub(module_hub_factory):
    h = module_hub_factory("enforce-observed", simulate="A100-80G:2", env=ENV, extra_args=OBSERVER)
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


@pytest.fixture
def user(ehub):
    name = ehub.create_user(f"e{uuid.uuid4().hex[:8]}")
    yield name
    if ehub.server(name) is not None:
        ehub.stop_server(name)


def balance(billing: Billing, user: str) -> Decimal:
    return Decimal(billing.balance(user)["balance"]["exact"])


def last_heartbeat_age(billing: Billing, user: str) -> float:
    with billing.db() as db:
        (hb,) = db.execute(
            "SELECT last_heartbeat_us FROM server_sessions WHERE user = ? AND stopped_us IS NULL",
            (user,),
        ).fetchone()
    return time.time() - (hb or 0) / 1e6


def silence_reporter(hub: Hub, billing: Billing, user: str) -> None:
    """Run the attack from a notebook, then wait until billing's view of the server's heartbeat
    is older than the freshness the enforcer used to require (3 intervals) and stays so."""
    with hub.kernel(user) as k:
        assert k.execute(ATTACK).strip().isdigit()
    wait_for(
        lambda: last_heartbeat_age(billing, user) > 3 * HB + 0.2,
        30,
        0.2,
        "the reporter silenced, only backdated heartbeats arriving",
    )
    # Backdated heartbeats do arrive (inside the session and silent_timeout): it is not silent.
    assert last_heartbeat_age(billing, user) < 3.5 * HB + 3


def gpu_held(hub: Hub, user: str) -> bool:
    s = hub.server(user)
    return bool(s and s["state"].get("allocation", {}).get("gpu_type"))


def watch_until_cards_return(hub: Hub, billing: Billing, user: str, timeout: float) -> Decimal:
    """Wait for the server to lose its cards (moved to no-GPU or stopped); the lowest balance
    seen meanwhile."""
    low = [balance(billing, user)]

    def released() -> bool:
        low.append(balance(billing, user))
        return not gpu_held(hub, user)

    wait_for(released, timeout, 0.5, "the enforcer to take the cards back")
    return min(low)


def gpu_session_closed(billing: Billing, user: str) -> dict | None:
    gpu = [s for s in billing.usage(user)["servers"] if s["gpu_type"] == "a100-80g"]
    return gpu[0] if gpu and gpu[0]["stopped"] else None


def test_a_silenced_reporter_with_backdated_heartbeats_cannot_run_past_zero(ehub, user) -> None:
    billing = Billing(ehub)
    ehub.spawn_ready(user, {"gpu": "a100-80g", "gpus": 2})
    free = ehub.free("a100-80g")
    silence_reporter(ehub, billing, user)
    # About 15 s of 2x A100 left (plus what the attack has run up so far is already charged).
    billing.credit(user, str(Decimal("0.0175") - balance(billing, user)))
    low = watch_until_cards_return(ehub, billing, user, 60)
    assert ehub.free("a100-80g") == free + 2
    session = wait_for(lambda: gpu_session_closed(billing, user), 30, 0.5, "the GPU session closed")
    assert session["observed"], session  # billed from what the hub saw, not from any report
    # Never below the bound, then or after the GPU session's last charge.
    floor = -A100X2_PER_S * DEBT_SECONDS
    final = balance(billing, user)
    assert min(low, final) >= floor, (low, final, floor)


def make_course(hub: Hub, billing: Billing, student: str, body: dict) -> str:
    course = f"ce{uuid.uuid4().hex[:6]}"
    assert hub.api("POST", f"/groups/{course}").status_code == 201
    r = hub.api(
        "PUT",
        f"/groups/{course}/properties",
        json={"gpulab_course": {"display_name": "Enforced", "teachers": [], "tas": []}},
    )
    assert r.status_code == 200, r.text
    r = hub.api("POST", f"/groups/{course}/users", json={"users": [student]})
    assert r.status_code == 200, r.text
    put_course(billing, course, body)
    r = billing.post(
        f"api/v1/courses/{course}/credits",
        {"amount": "5.00", "kind": "topup", "idempotency_key": f"{course}-1"},
    )
    assert r.status_code == 201, r.text
    return course


def put_course(billing: Billing, course: str, body: dict) -> None:
    r = requests.put(
        billing.base + f"api/v1/courses/{course}",
        headers={"Authorization": f"token {billing.hub.token}"},
        json=body,
        timeout=30,
    )
    assert r.status_code == 200, r.text


def course_used(billing: Billing, user: str, course: str) -> Decimal:
    status = billing.get(f"api/v1/users/{user}/balance", params={"course": course}).json()
    return Decimal(status["course"]["used"]["exact"])


def test_the_same_trick_cannot_run_a_refusing_course_past_its_cap(ehub, user) -> None:
    billing = Billing(ehub)
    course = make_course(ehub, billing, user, {"cap": "1.00", "overflow": "refuse"})
    ehub.spawn_ready(user, {"gpu": "a100-80g", "gpus": 2, "course": course})
    silence_reporter(ehub, billing, user)
    cap = (course_used(billing, user, course) + 12 * A100X2_EDU_PER_S).quantize(Decimal("0.000001"))
    put_course(billing, course, {"cap": str(cap)})
    wait_for(lambda: ehub.server(user) is None, 60, 0.5, "the refusing course to stop the server")
    session = wait_for(lambda: gpu_session_closed(billing, user), 30, 0.5, "the GPU session closed")
    by_course = Decimal(session["paid_by"]["course"]["exact"])
    personal = Decimal(session["paid_by"]["personal"]["exact"])
    assert by_course <= cap  # the pool never pays beyond the cap
    # The student pays the tail past the cap, within the bound.
    assert personal <= A100X2_EDU_PER_S * DEBT_SECONDS, (personal, by_course, cap)


def test_a_refusing_course_runs_on_its_pool_for_a_student_with_nothing_of_their_own(
    ehub, user
) -> None:
    """Only the pool pays a refusing course's session: a personal balance of 0 must not stop it
    ("balance used up") while the pool can pay."""
    billing = Billing(ehub)
    course = make_course(ehub, billing, user, {"cap": "1.00", "overflow": "refuse"})
    billing.credit(user, str(-balance(billing, user)))
    assert balance(billing, user) == 0
    ehub.spawn_ready(user, {"gpu": "a100-80g", "course": course})
    k = ehub.kernel(user)
    try:
        k.send("import time\nend = time.time() + 60\nwhile time.time() < end: pass")
        before = course_used(billing, user, course)
        one_card = A100X2_EDU_PER_S / 2

        def paid_by_the_pool_for_8_seconds() -> bool:
            assert gpu_held(ehub, user), "the course server lost its card"
            return course_used(billing, user, course) - before >= 8 * one_card

        wait_for(paid_by_the_pool_for_8_seconds, 60, 0.5, "the pool to pay 8 s of work")
        assert gpu_held(ehub, user)
        assert balance(billing, user) == 0
    finally:
        k.close()
