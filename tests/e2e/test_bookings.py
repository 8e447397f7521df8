"""Lab sessions on a real hub: a teacher books cards for class hours, and the class notices.

The hub's pool is 3 simulated RTX 4090s. Before the booking, one user runs an on-demand server
(1 card) and another a spot server (1 card). The teacher books 2 cards for a 10-minute window
starting in 2 minutes: a booking of 3 is refused (the on-demand card cannot be promised); the
spot server gets the usual warning (reason: reserved) and is stopped; nobody else can take the
booked cards; the students' servers are started before the window and are ready when it opens.
A second, short booking shows the end of a window: its servers stop and the cards are free.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from course_helpers import make_course, roster, token_for
from harness import Hub, wait_for

WARNING = 8  # the spot warning, seconds


@pytest.fixture(scope="module")
def lab_hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "bookings",
        simulate="RTX-4090:3",
        extra_args=[
            f"--SpotMarket.warning_seconds={WARNING}",
            "--SpotMarket.tick_interval=1",
            "--BookingKeeper.prestart_seconds=100",
            "--HoldLimits.max_cards_per_course=2",
        ],
    )


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def book(hub: Hub, course: str, token: str, **body) -> dict:
    r = hub.api("POST", f"/gpulab/courses/{course}/bookings", token=token, json=body)
    return {"status": r.status_code, **r.json()}


def preemptions(hub: Hub, user: str) -> list[dict]:
    r = hub.api("GET", "/gpulab/spot/preemptions")
    assert r.status_code == 200, r.text
    return [p for p in r.json()["preemptions"] if p["user"] == user]


def test_a_booked_class_starts_ready_and_takes_cards_from_nobody_else(lab_hub: Hub) -> None:
    hub = lab_hub
    make_course(hub, "ml101", ["prof"], gpu_types=["none", "rtx-4090"])
    t_token = token_for(hub, "prof")
    r = roster(hub, "ml101", "username,role\nann,student\nbea,student\n", t_token)
    assert r.status_code == 200, r.text
    hub.create_user("ondemand")
    hub.create_user("spotter")
    hub.spawn_ready("ondemand", {"gpu": "rtx-4090"})
    hub.spawn_ready("spotter", {"gpu": "rtx-4090", "pricing": "spot"})

    start = time.time() + 120
    # Bad input names the field and holds nothing.
    for body, field in [
        ({"gpu_type": "h100", "cards": 1, "start": iso(start), "minutes": 10}, "gpu_type"),
        ({"gpu_type": "rtx-4090", "cards": 0, "start": iso(start), "minutes": 10}, "cards"),
        ({"gpu_type": "rtx-4090", "cards": 1, "start": "tomorrow", "minutes": 10}, "start"),
        ({"gpu_type": "rtx-4090", "cards": 1, "start": iso(start), "minutes": -5}, "minutes"),
    ]:
        got = book(hub, "ml101", t_token, **body)
        assert (got["status"], got["field"]) == (400, field), got
    # Three cards cannot be promised: one is held by a running on-demand server.
    got = book(hub, "ml101", t_token, gpu_type="rtx-4090", cards=3, start=iso(start), minutes=10)
    assert got["status"] == 409 and got["field"] == "cards"
    assert "at most 2 can be promised" in got["message"]
    assert "1 held by running on-demand servers" in got["message"]
    listed = hub.api("GET", "/gpulab/courses/ml101/bookings", token=t_token).json()
    assert listed["bookings"] == []
    # A TA-less student may not book.
    assert book(hub, "ml101", token_for(hub, "ann"), gpu_type="rtx-4090", cards=1,
                start=iso(start), minutes=10)["status"] in (403, 404)  # fmt: skip

    got = book(hub, "ml101", t_token, gpu_type="rtx-4090", cards=2, start=iso(start), minutes=10)
    assert got["status"] == 201, got
    assert got["state"] in ("scheduled", "starting")

    # Nobody else gets the booked cards, on-demand or spot.
    hub.create_user("late")
    for pricing in ("on-demand", "spot"):
        r = hub.spawn("late", {"gpu": "rtx-4090", "pricing": pricing})
        assert r.status_code == 409, r.text
        assert "held for reservations or lab sessions" in r.json()["message"]
        assert hub.server("late") is None

    # The spot server on a booked card gets the usual warning, then stops.
    warned = wait_for(lambda: preemptions(hub, "spotter"), 30, 0.5, "spotter's warning")
    assert warned[-1]["reason"] == "reserved"
    wait_for(lambda: hub.server("spotter") is None, WARNING + 60, 0.5, "the spot server to stop")
    assert hub.server("ondemand") is not None  # on-demand servers are never reclaimed

    # The students' servers start before the window and are ready when it opens.
    ready_at: dict[str, float] = {}

    def both_ready() -> bool:
        for name in ("ann", "bea"):
            s = hub.server(name)
            if s and s["ready"] and name not in ready_at:
                ready_at[name] = time.time()
        return len(ready_at) == 2

    wait_for(both_ready, max(start - time.time(), 1) + 5, 0.5, "the students' servers")
    assert max(ready_at.values()) < start, (ready_at, start)
    info = hub.api("GET", "/gpulab/courses/ml101", token=t_token).json()
    for name in ("ann", "bea"):
        srv = info["servers"][name]
        assert (srv["gpu_type"], srv["cards"], srv["course"]) == ("rtx-4090", 1, "ml101")
    wait_for(lambda: time.time() >= start, 130, 0.5, "the window to open")
    listed = hub.api("GET", "/gpulab/courses/ml101/bookings", token=t_token).json()
    (b,) = listed["bookings"]
    assert (b["state"], b["cards_in_use"]) == ("open", 2)
    for name in ("ann", "bea"):
        assert hub.server(name)["ready"]
    # Cancel the rest of the class (the teacher ends it early): the hold goes, the servers stay.
    r = hub.api("DELETE", f"/gpulab/courses/ml101/bookings/{b['id']}", token=t_token)
    assert r.status_code == 204, r.text
    for name in ("ann", "bea", "ondemand"):
        hub.stop_server(name)


def test_concurrent_bookings_never_promise_a_card_twice(lab_hub: Hub) -> None:
    hub = lab_hub
    make_course(hub, "par1", ["pa"])
    make_course(hub, "par2", ["pb"])
    for course in ("par1", "par2"):  # a booking holds at most one card per student
        r = roster(hub, course, f"{course}a,student\n{course}b,student\n", hub.token)
        assert r.status_code == 200, r.text
    tokens = {"par1": token_for(hub, "pa"), "par2": token_for(hub, "pb")}
    start = iso(time.time() + 3600)
    body = {"gpu_type": "rtx-4090", "cards": 2, "start": start, "minutes": 30}
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda c: book(hub, c, tokens[c], **body), ["par1", "par2"]))
    assert sorted(a["status"] for a in answers) == [201, 409], answers
    for course, answer in zip(["par1", "par2"], answers, strict=True):
        if answer["status"] == 201:
            r = hub.api("DELETE", f"/gpulab/courses/{course}/bookings/{answer['id']}",
                        token=tokens[course])  # fmt: skip
            assert r.status_code == 204


def test_the_end_of_a_window_stops_its_servers_and_frees_the_cards(lab_hub: Hub) -> None:
    """Also across a hub SIGKILL in the middle of the window: the booking, its card and its
    server are all still there afterwards, and the window's end still stops the server."""
    hub = lab_hub
    make_course(hub, "cv201", ["prof2"])
    t_token = token_for(hub, "prof2")
    assert roster(hub, "cv201", "cat\n", t_token).status_code == 200
    free = hub.free("rtx-4090")
    got = book(hub, "cv201", t_token, gpu_type="rtx-4090", cards=1, start=time.time(),
               minutes=1)  # fmt: skip
    assert got["status"] == 201, got
    assert hub.free("rtx-4090") == free - 1
    s = wait_for(lambda: (hub.server("cat") or {}).get("ready"), 60, 0.5, "cat's server")
    assert s
    hub.kill()
    hub.start()
    (b,) = hub.api("GET", "/gpulab/courses/cv201/bookings", token=t_token).json()["bookings"]
    assert (b["id"], b["cards_in_use"]) == (got["id"], 1)
    assert hub.server("cat")["ready"] and hub.free("rtx-4090") == free - 1
    wait_for(lambda: hub.server("cat") is None, 120, 0.5, "the server to stop at the window's end")
    wait_for(lambda: hub.free("rtx-4090") == free, 30, 0.5, "the card to be free again")
    listed = hub.api("GET", "/gpulab/courses/cv201/bookings", token=t_token).json()
    assert listed["bookings"] == []


def test_a_booking_far_ahead_holds_nothing_now_and_limits_are_named(lab_hub: Hub) -> None:
    """Issue 20, attack 7: a teacher booked every card 100 days ahead, at no cost, and from that
    moment nobody could start on them. Now a booking holds its cards only from its horizon (the
    keeper's prestart plus a margin before the window); how far ahead and how many cards a course
    may hold at once are operator settings, and a request beyond them names the limit."""
    hub = lab_hub
    make_course(hub, "far1", ["farprof"], gpu_types=["none", "rtx-4090"])
    token = token_for(hub, "farprof")
    assert roster(hub, "far1", "fara,student\nfarb,student\n", hub.token).status_code == 200
    free = hub.free("rtx-4090")
    assert free >= 2, hub.pool()

    def listed() -> list[dict]:
        return hub.api("GET", "/gpulab/courses/far1/bookings", token=token).json()["bookings"]

    # Beyond the horizon setting: refused, naming it; nothing held.
    start = time.time() + 40 * 86400
    got = book(hub, "far1", token, gpu_type="rtx-4090", cards=1, start=iso(start), minutes=60)
    assert (got["status"], got["field"]) == (400, "start"), got
    assert "at most 30 days ahead" in got["message"]
    assert "BookingKeeper.max_days_ahead" in got["message"]
    assert listed() == []

    # 20 days ahead: booked (a promise), but the cards stay free for everyone now.
    start = time.time() + 20 * 86400
    got = book(hub, "far1", token, gpu_type="rtx-4090", cards=2, start=iso(start), minutes=60)
    assert got["status"] == 201, got
    assert hub.free("rtx-4090") == free
    hub.create_user("nowuser")
    hub.spawn_ready("nowuser", {"gpu": "rtx-4090"})
    try:
        assert hub.free("rtx-4090") == free - 1
        hub.stop_server("nowuser")
        # More than the course may hold at once (HoldLimits.max_cards_per_course=2): refused,
        # naming the limit, though a card could be promised then.
        more = book(hub, "far1", token, gpu_type="rtx-4090", cards=1, start=iso(start),
                    minutes=30)  # fmt: skip
        assert (more["status"], more["field"]) == (409, "cards"), more
        assert "HoldLimits.max_cards_per_course" in more["message"]
        assert [b["id"] for b in listed()] == [got["id"]]
    finally:
        if hub.server("nowuser"):
            hub.stop_server("nowuser")
        r = hub.api("DELETE", f"/gpulab/courses/far1/bookings/{got['id']}", token=token)
        assert r.status_code == 204


def test_a_course_holds_one_card_per_student_for_a_bounded_window(lab_hub: Hub) -> None:
    """Attack 01: a teacher of a course with ONE student booked every card for 12 h windows,
    chained for weeks, at no cost, and everyone else was refused every GPU. A booking's cards
    serve one server per student, one card each: a course holds at once (all its overlapping
    bookings) at most one card per student, and a window lasts at most
    BookingKeeper.max_window_hours (8 h). Refusals name the limit and the numbers; nothing held."""
    hub = lab_hub
    make_course(hub, "one1", ["oneprof"])
    token = token_for(hub, "oneprof")
    assert roster(hub, "one1", "onestud,student\n", hub.token).status_code == 200

    def listed() -> list[dict]:
        return hub.api("GET", "/gpulab/courses/one1/bookings", token=token).json()["bookings"]

    start = time.time() + 3 * 3600
    got = book(hub, "one1", token, gpu_type="rtx-4090", cards=2, start=iso(start), minutes=60)
    assert (got["status"], got["field"]) == (409, "cards"), got
    assert "1 student(s)" in got["message"] and "at most 1 card(s)" in got["message"], got
    got = book(hub, "one1", token, gpu_type="rtx-4090", cards=1, start=iso(start), minutes=720)
    assert (got["status"], got["field"]) == (400, "minutes"), got
    assert "BookingKeeper.max_window_hours" in got["message"] and "12.00" in got["message"]
    assert listed() == []

    # One card for the one student is booked; a second, overlapping booking is refused.
    first = book(hub, "one1", token, gpu_type="rtx-4090", cards=1, start=iso(start), minutes=60)
    assert first["status"] == 201, first
    try:
        more = book(hub, "one1", token, gpu_type="rtx-4090", cards=1,
                    start=iso(start + 1800), minutes=60)  # fmt: skip
        assert (more["status"], more["field"]) == (409, "cards"), more
        assert "already holds 1" in more["message"]
        assert [b["id"] for b in listed()] == [first["id"]]
    finally:
        r = hub.api("DELETE", f"/gpulab/courses/one1/bookings/{first['id']}", token=token)
        assert r.status_code == 204


def test_a_booking_cannot_start_in_the_past_and_an_open_one_is_listed_as_held(
    lab_hub: Hub,
) -> None:
    """Issue 22, attack F5: a teacher booked a window that began 30 minutes ago (201, state open)
    and it held cards at once, while /hub/api/gpulab/pool's held_now did not list the open lab
    once its students' servers took its cards, so everyone else saw "0 free" with no reason.
    Now a start more than BookingKeeper.start_grace_seconds in the past is a 400 naming start
    (nothing held), and a booking starting now is in held_now while its servers use the cards."""
    hub = lab_hub
    make_course(hub, "past1", ["pastprof"])
    token = token_for(hub, "pastprof")
    assert roster(hub, "past1", "pastann,student\n", hub.token).status_code == 200
    free = hub.free("rtx-4090")

    got = book(hub, "past1", token, gpu_type="rtx-4090", cards=1,
               start=iso(time.time() - 1800), minutes=60)  # fmt: skip
    assert (got["status"], got["field"]) == (400, "start"), got
    assert "in the past" in got["message"] and "start_grace_seconds" in got["message"], got
    assert hub.free("rtx-4090") == free
    listed = hub.api("GET", "/gpulab/courses/past1/bookings", token=token).json()["bookings"]
    assert listed == []

    got = book(hub, "past1", token, gpu_type="rtx-4090", cards=1, start=iso(time.time()),
               minutes=5)  # fmt: skip
    assert got["status"] == 201, got
    try:
        wait_for(lambda: (hub.server("pastann") or {}).get("ready"), 60, 0.5, "pastann's server")

        def held() -> list[dict]:
            return [h for h in hub.pool()["held_now"] if "Course past1" in h["for"]]

        (h,) = held() or [None]
        assert h is not None, hub.pool()["held_now"]
        assert (h["gpu_type"], h["cards"], h["begun"]) == ("rtx-4090", 1, True), h
    finally:
        r = hub.api("DELETE", f"/gpulab/courses/past1/bookings/{got['id']}", token=token)
        assert r.status_code == 204
        if hub.server("pastann"):
            hub.stop_server("pastann")
