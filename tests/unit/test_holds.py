"""Holds (monthly reservations, lab-session bookings) in the allocator: held cards are never given
to others, the account's servers take them, a hold that cannot be promised is refused with what
stands in its way, and holds survive a restart (the ledger)."""

from __future__ import annotations

import time

import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.node.allocator import GpuAllocator, NoCapacity
from gpulab.spawners.node.holds import Hold, new_hold_id
from gpulab.spawners.node.inventory import parse_simulate_spec, simulated_devices

CATALOG = load_catalog()


def allocator(tmp_path, spec: str = "RTX-4090:4") -> GpuAllocator:
    devices = simulated_devices(parse_simulate_spec(spec, CATALOG), CATALOG, 0)
    return GpuAllocator(devices, tmp_path / "ledger.json")


def hold(
    account: str,
    cards: int,
    start: float,
    end: float,
    *,
    kind: str = "booking",
    use_from: float | None = None,
    reclaim_from: float | None = None,
) -> Hold:
    return Hold(
        hold_id=new_hold_id(kind),
        kind=kind,
        account=account,
        gpu_type="rtx-4090",
        cards=cards,
        start=start,
        end=end,
        use_from=start if use_from is None else use_from,
        reclaim_from=start if reclaim_from is None else reclaim_from,
        created=time.time(),
    )


def test_reserved_cards_are_never_given_to_others(tmp_path) -> None:
    a = allocator(tmp_path)
    now = time.time()
    h = hold("user:carol", 3, now - 1, now + 3600, kind="reservation")
    a.add_hold(h)
    assert a.counts()["rtx-4090"] == {"total": 4, "free": 1, "held": 3}
    a.allocate("dave/", "rtx-4090", 1)
    for pricing in ("on-demand", "spot"):
        with pytest.raises(NoCapacity, match="held for reservations or lab sessions"):
            a.allocate(f"erin-{pricing}/", "rtx-4090", 1, pricing)
    # Carol's servers take her cards, up to the 3 she reserved; a 4th is refused.
    mine = [a.allocate(f"carol/{i}", "rtx-4090", 1, accounts=["user:carol"]) for i in range(3)]
    assert {x.hold_id for x in mine} == {h.hold_id}
    assert a.counts(accounts=["user:carol"])["rtx-4090"]["free"] == 0
    with pytest.raises(NoCapacity):
        a.allocate("carol/3", "rtx-4090", 1, accounts=["user:carol"])
    # A stopped server's card goes back to the hold, not to everyone.
    a.release("carol/0")
    with pytest.raises(NoCapacity):
        a.allocate("frank/", "rtx-4090", 1)
    assert a.allocate("carol/0", "rtx-4090", 1, accounts=["user:carol"]).hold_id == h.hold_id


def test_a_booking_holds_its_cards_only_from_its_horizon(tmp_path) -> None:
    a = allocator(tmp_path)
    now = time.time()
    # Within its horizon (reclaim_from passed): nobody else may take its cards.
    a.add_hold(
        hold("course:ml101", 2, now + 3600, now + 4200, use_from=now + 3400, reclaim_from=now)
    )
    assert a.counts()["rtx-4090"] == {"total": 4, "free": 2, "held": 2}
    a.allocate("u1/", "rtx-4090", 1)
    a.allocate("u2/", "rtx-4090", 1)
    with pytest.raises(NoCapacity, match="2 held"):
        a.allocate("u3/", "rtx-4090", 1)
    # The course's servers cannot take the booking's cards before its use_from.
    with pytest.raises(NoCapacity):
        a.allocate("s1/", "rtx-4090", 1, accounts=["course:ml101"])


def test_a_hold_far_ahead_denies_nobody_service_now(tmp_path) -> None:
    # Issue 20, attack 7: every card booked 100 days ahead (or reserved for a month eleven
    # months ahead) used to be "held" from the moment it was made.
    a = allocator(tmp_path)
    now = time.time()
    far = now + 100 * 86400
    booking = hold("course:ml101", 4, far, far + 3600, use_from=far - 180, reclaim_from=far - 780)
    a.add_hold(booking)
    a.add_hold(hold("user:carol", 4, far + 86400, far + 40 * 86400, kind="reservation"))
    assert a.counts()["rtx-4090"] == {"total": 4, "free": 4, "held": 0}
    for i in range(4):
        a.allocate(f"u{i}/", "rtx-4090", 1)
    # Still a promise: another hold for the same time is refused.
    with pytest.raises(NoCapacity, match="4 already held"):
        a.add_hold(hold("course:cv201", 1, far, far + 600, reclaim_from=far))


def test_an_account_holds_at_most_its_limit_at_once(tmp_path) -> None:
    from traitlets.config import Config

    from gpulab.spawners.node.holds import HoldLimits

    config = Config()
    config.HoldLimits.max_cards_per_user = 3
    config.HoldLimits.max_cards_per_course = 5
    limits = HoldLimits(config=config)
    now = time.time()
    held = [hold("user:carol", 2, now, now + 3600, kind="reservation")]
    # Overlapping: 2 + 2 > 3, named with its setting; later (no overlap) it fits.
    problem = limits.problem(held, hold("user:carol", 2, now + 60, now + 600), now)
    assert problem is not None and "HoldLimits.max_cards_per_user" in problem
    assert "at most 3 card(s) at once" in problem and "at most 1 more" in problem
    assert limits.problem(held, hold("user:carol", 3, now + 3600, now + 7200), now) is None
    assert limits.problem(held, hold("user:dave", 3, now, now + 600), now) is None
    course = limits.problem([], hold("course:ml101", 6, now, now + 600), now)
    assert course is not None and "HoldLimits.max_cards_per_course" in course
    config.HoldLimits.max_cards_per_user = 0  # no limit
    assert HoldLimits(config=config).problem(held, hold("user:carol", 9, now, now + 9), now) is None


def test_bookings_at_different_times_share_cards_and_overlaps_are_refused(tmp_path) -> None:
    a = allocator(tmp_path)
    now = time.time()
    # Running on-demand servers count against a booking (they have no end); spot ones do not
    # (they are reclaimed with a warning before the window).
    a.allocate("u1/", "rtx-4090", 1)
    a.allocate("spotty/", "rtx-4090", 1, "spot")
    a.add_hold(hold("course:ml101", 2, now + 3600, now + 4200))
    # Later the same day: the same cards again.
    a.add_hold(hold("course:cv201", 3, now + 7200, now + 7800))
    overlapping = hold("course:nlp", 2, now + 4000, now + 5000)
    with pytest.raises(NoCapacity) as e:
        a.add_hold(overlapping)
    message = str(e.value)
    assert "2 rtx-4090 card(s) requested, at most 1 can be promised" in message
    assert "1 held by running on-demand servers" in message
    assert "2 already held for other reservations or lab sessions" in message
    assert overlapping.hold_id not in {h.hold_id for h in a.holds}
    a.add_hold(hold("course:nlp", 1, now + 4000, now + 5000))


def test_holds_survive_a_restart_and_can_be_dropped(tmp_path) -> None:
    a = allocator(tmp_path)
    now = time.time()
    h = hold("course:ml101", 2, now - 5, now + 600)
    a.add_hold(h)
    a.add_hold(h)  # idempotent by id
    x = a.allocate("s1/", "rtx-4090", 1, accounts=["course:ml101"])
    b = allocator(tmp_path)
    assert [k.hold_id for k in b.holds] == [h.hold_id]
    assert b.get("s1/").hold_id == h.hold_id == x.hold_id
    assert b.counts()["rtx-4090"] == {"total": 4, "free": 2, "held": 1}
    b.drop_hold(h.hold_id)
    assert allocator(tmp_path).holds == []
    assert allocator(tmp_path).counts()["rtx-4090"]["free"] == 3


def test_an_ended_hold_binds_nobody(tmp_path) -> None:
    a = allocator(tmp_path, "RTX-4090:1")
    now = time.time()
    a.holds  # noqa: B018 (nothing yet)
    h = hold("course:ml101", 1, now - 600, now - 1)
    a._state.holds[h.hold_id] = h  # recorded earlier, ended since
    assert a.allocate("anyone/", "rtx-4090", 1).hold_id is None


def test_a_course_holds_at_most_one_card_per_student(tmp_path) -> None:
    """Attack 01: a course's bookings serve one card per student, so what the course can use
    bounds what it may hold (summed over types and overlapping holds), below the operator's
    setting; a course without students may hold nothing."""
    from gpulab.spawners.node.holds import HoldLimits

    limits = HoldLimits()  # max_cards_per_course 32
    now = time.time()
    use = (1, "one card per student; course ml101 has 1 student(s)")
    new = hold("course:ml101", 2, now, now + 600)
    problem = limits.problem([], new, now, use_limit=use)
    assert problem is not None and "1 student(s)" in problem and "at most 1 card(s)" in problem
    assert limits.problem([], hold("course:ml101", 1, now, now + 600), now, use_limit=use) is None
    held = [hold("course:ml101", 1, now, now + 600)]
    later = hold("course:ml101", 1, now + 300, now + 900)
    assert "already holds 1" in limits.problem(held, later, now, use_limit=use)
    assert limits.problem([], new, now, use_limit=(0, "no students")) is not None
