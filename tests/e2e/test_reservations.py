"""Monthly reservations end to end: a real hub with 3 simulated A100s and its billing service.

Before the reservation, a spot server holds all three cards. Alice reserves one card for the
month: billing charges the month up front, the spot server gets the usual warning (reason
``reserved``) and is stopped, nobody else gets her card, her server on it costs nothing more, and
a server bigger than her reservation is billed on demand. Bad requests name the field and hold
nothing; one the balance cannot prepay is refused (402) and holds nothing.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from billing.client import Billing, user_token
from harness import FAST_BILLING_ENV, HB, Hub, wait_for

WARNING = 8
ENV = {
    **FAST_BILLING_ENV,
    "GPULAB_BILLING_ARGS": f"--BillingService.heartbeat_interval={HB} --BillingService.idle_timeout=300",
}


@pytest.fixture(scope="module")
def rhub(module_hub_factory) -> Hub:
    hub = module_hub_factory(
        "reservations",
        simulate="A100-80G:3",
        env=ENV,
        extra_args=[
            f"--SpotMarket.warning_seconds={WARNING}",
            "--SpotMarket.tick_interval=1",
            "--ActivityObserver.bill_observed=False",
            "--HoldLimits.max_cards_per_user=2",
        ],
    )
    wait_for(Billing(hub).up, 30, 0.2, "the billing service")
    return hub


def month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


def reserve(hub: Hub, token: str, **body) -> tuple[int, dict]:
    r = hub.api("POST", "/gpulab/reservations", token=token, json=body)
    return r.status_code, r.json()


def preempted(hub: Hub, user: str) -> list[dict]:
    r = hub.api("GET", "/gpulab/spot/preemptions")
    return [p for p in r.json()["preemptions"] if p["user"] == user]


def run_kernel(hub: Hub, user: str, seconds: float) -> None:
    with hub.kernel(user) as k:
        assert k.execute(f"import time; time.sleep({seconds}); print('ok')").strip() == "ok"


def test_a_reserved_card_is_the_accounts_prepaid_and_overflow_is_billed(rhub: Hub) -> None:
    hub, billing = rhub, Billing(rhub)
    for name in ("spotty", "alice", "bob", "carol", "dave"):
        hub.create_user(name)
    billing.credit("alice", "5000")
    alice = user_token(hub, "alice")
    hub.spawn_ready("spotty", {"gpu": "a100-80g", "gpus": 3, "pricing": "spot"})

    # Bad requests name the field and hold nothing.
    key = {"idempotency_key": "alice-month-a100"}
    for body, field in [
        ({"account": "user:alice", "gpu_type": "h100", "cards": 1, "month": month()}, "gpu_type"),
        ({"account": "user:alice", "gpu_type": "a100-80g", "cards": 0, "month": month()}, "cards"),
        (
            {"account": "user:alice", "gpu_type": "a100-80g", "cards": 1, "month": "2020-01"},
            "month",
        ),
        ({"account": "alice", "gpu_type": "a100-80g", "cards": 1, "month": month()}, "account"),
    ]:
        status, answer = reserve(hub, alice, **body, **key)
        assert (status, answer["field"]) == (400, field), answer
    status, answer = reserve(
        hub, alice, account="user:bob", gpu_type="a100-80g", cards=1, month=month(), **key
    )
    assert (status, answer["field"]) == (403, "account")
    # Dave's trial credit cannot prepay a month of an A100: refused, nothing held.
    status, answer = reserve(
        hub,
        user_token(hub, "dave"),
        account="user:dave",
        gpu_type="a100-80g",
        cards=1,
        month=month(),
        idempotency_key="dave-month",
    )
    assert status == 402, answer
    assert hub.api("GET", "/gpulab/reservations").json()["reservations"] == []

    before = Decimal(billing.balance("alice")["balance"]["exact"])
    body = {"account": "user:alice", "gpu_type": "a100-80g", "cards": 1, "month": month(), **key}
    status, res = reserve(hub, alice, **body)
    assert status == 201, res
    start = datetime.fromisoformat(res["start"].replace("Z", "+00:00")).timestamp()
    end = datetime.fromisoformat(res["end"].replace("Z", "+00:00")).timestamp()
    hours = Decimal(str(end - start)) / 3600
    prepaid = Decimal(billing.balance("alice")["balance"]["exact"])
    charged = before - prepaid
    # The month's remaining hours at 1.85 per card-hour (start is the second of the request).
    expected = (Decimal("1.85") * hours).quantize(Decimal("0.000001"), ROUND_HALF_EVEN)
    assert abs(charged - expected) <= Decimal("0.00001"), (charged, expected)
    # The same key again: the same reservation, charged once.
    status, again = reserve(hub, alice, **body)
    assert status == 200 and again["id"] == res["id"]
    assert Decimal(billing.balance("alice")["balance"]["exact"]) == prepaid

    # The spot server on the reserved card gets the usual warning, then stops.
    warned = wait_for(lambda: preempted(hub, "spotty"), 30, 0.5, "spotty's warning")
    assert warned[-1]["reason"] == "reserved"
    wait_for(lambda: hub.server("spotty") is None, WARNING + 60, 0.5, "the spot server to stop")

    # Nobody else gets Alice's card: two of three are free for them.
    hub.spawn_ready("bob", {"gpu": "a100-80g", "gpus": 2})
    r = hub.spawn("carol", {"gpu": "a100-80g"})
    assert r.status_code == 409 and "held for reservations" in r.json()["message"], r.text
    assert hub.server("carol") is None

    # Alice's server on her card costs nothing more.
    hub.spawn_ready("alice", {"gpu": "a100-80g"})
    assert hub.server("alice")["user_options"]["gpu"] == "a100-80g"
    run_kernel(hub, "alice", 3)
    hub.stop_server("alice")
    hub.stop_server("bob")

    def closed(n: int):
        servers = billing.usage("alice")["servers"]
        done = [s for s in servers if s["stopped"]]
        return done if len(done) >= n else None

    (inside,) = wait_for(lambda: closed(1), 30, 0.5, "alice's session closed")
    assert inside["amount"]["micro"] == 0, inside
    assert Decimal(billing.balance("alice")["balance"]["exact"]) == prepaid

    # A server bigger than the reservation is billed on demand (overflow), all its cards.
    hub.spawn_ready("alice", {"gpu": "a100-80g", "gpus": 2})
    run_kernel(hub, "alice", 3)
    hub.stop_server("alice")
    sessions = wait_for(lambda: closed(2), 30, 0.5, "the overflow session closed")
    overflow = max(sessions, key=lambda s: s["started"])
    assert overflow["amount"]["micro"] > 0
    assert Decimal(billing.balance("alice")["balance"]["exact"]) < prepaid
    listed = hub.api("GET", "/gpulab/reservations", token=alice).json()["reservations"]
    assert [r["id"] for r in listed] == [res["id"]]
    assert time.time() < end


def next_month(ahead: int = 1) -> str:
    today = datetime.now(UTC)
    index = today.year * 12 + today.month - 1 + ahead
    return f"{index // 12:04d}-{index % 12 + 1:02d}"


def test_a_reservation_ahead_holds_nothing_now_and_limits_are_named(rhub: Hub) -> None:
    """Issue 20, attack 7: a user reserved cards for a month eleven months ahead, and from that
    moment nobody could start on them. Now a reservation holds its cards only within its month;
    how far ahead (the current or next month) and how many cards a user may hold at once are
    operator settings, and a request beyond them names the limit, holds and charges nothing."""
    hub, billing = rhub, Billing(rhub)
    hub.create_user("erin")
    hub.create_user("frank")
    billing.credit("erin", "20000")
    erin = user_token(hub, "erin")

    def erins() -> list[str]:
        listed = hub.api("GET", "/gpulab/reservations", token=erin).json()["reservations"]
        return [r["id"] for r in listed]

    before = Decimal(billing.balance("erin")["balance"]["exact"])
    body = {"account": "user:erin", "gpu_type": "a100-80g"}
    # Eleven months ahead: beyond the setting, named; nothing held, nothing charged.
    status, answer = reserve(
        hub, erin, **body, cards=1, month=next_month(11), idempotency_key="erin-far-away"
    )
    assert (status, answer["field"]) == (400, "month"), answer
    assert "ReservationsConfig.max_months_ahead" in answer["message"]
    # More cards than a user may hold at once: named; nothing held, nothing charged.
    status, answer = reserve(
        hub, erin, **body, cards=3, month=next_month(), idempotency_key="erin-too-many"
    )
    assert (status, answer["field"]) == (409, "cards"), answer
    assert "HoldLimits.max_cards_per_user" in answer["message"]
    assert erins() == []
    assert Decimal(billing.balance("erin")["balance"]["exact"]) == before

    # Next month, two cards: reserved and prepaid, but nothing is held this month.
    free = hub.free("a100-80g")
    status, res = reserve(
        hub, erin, **body, cards=2, month=next_month(), idempotency_key="erin-next-month"
    )
    assert status == 201, res
    assert erins() == [res["id"]]
    assert hub.free("a100-80g") == free
    hub.spawn_ready("frank", {"gpu": "a100-80g", "gpus": free})
    hub.stop_server("frank")
