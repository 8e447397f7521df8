"""Lab sessions: a teacher books N cards of a type for a course's class hours.

``POST /hub/api/gpulab/courses/C/bookings`` (``custom:gpulab:course-manage!group=C``) with
``{"gpu_type": "rtx-4090", "cards": 2, "start": "2026-12-01T14:00:00Z", "minutes": 90}`` makes a
hold (:mod:`gpulab.spawners.node.holds`) for the course, or is refused when it cannot be honoured
(409 naming what stands in the way). From then on:

- the booked cards are kept from everyone else (on-demand and new spot servers);
- spot servers already on them get the market's usual warning so that they are gone by the time
  the students' servers start (``reclaim_from``);
- ``prestart_seconds`` before the window the :class:`BookingKeeper` starts a server with one card
  for each student of the course (in roster order, as many as there are cards), so that students
  are in JupyterLab at once when class starts;
- at the end of the window the servers that took the booked cards are stopped and the hold is
  dropped, its cards free again.

``GET .../bookings`` lists them (staff), ``DELETE .../bookings/ID`` cancels one (teachers).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jupyterhub.scopes import needs_scope
from traitlets import Float, Int
from traitlets.config import SingletonConfigurable

from gpulab.catalog import NO_GPU, Catalog
from gpulab.hub_config.courses import groups
from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.handlers import CourseAPIHandler
from gpulab.hub_config.scopes import COURSE_MANAGE_SCOPE, COURSE_READ_SCOPE
from gpulab.spawners.courses import Course
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.market.hub_client import HubClient
from gpulab.spawners.node.allocator import NoCapacity
from gpulab.spawners.node.holds import Hold, HoldLimits, account_for_course, new_hold_id
from gpulab.spawners.node.pool import GpuPool

STATE_FILE = "bookings-state.json"
FIELDS = ("gpu_type", "cards", "start", "minutes", "end")
# Seconds between tries to start a lab session's servers that did not start yet.
RETRY_SECONDS = 3.0


class BookingKeeper(SingletonConfigurable):
    """Keeps lab-session bookings: starts the students' servers before the window, stops them
    and frees the cards after it. Also ends monthly reservations at their month's end."""

    prestart_seconds = Float(
        180.0,
        config=True,
        help="""How long before a lab session's window the students' servers are started, so
        that they are ready when class starts (spot servers on the booked cards get their
        warning that much earlier, plus the market's warning).""",
    )
    max_minutes = Int(
        12 * 60, config=True, help="The longest lab session a teacher may book, in minutes."
    )
    max_window_hours = Float(
        8.0,
        config=True,
        help="""The longest window one lab-session booking may cover, in hours (a booking holds
        its cards for its whole window; a longer one is refused, 400, field minutes).""",
    )
    max_days_ahead = Int(
        30,
        config=True,
        help="""How far ahead (days) a lab session may be booked: a booking's start more than this
        many days from now is refused (400, field start).""",
    )
    start_grace_seconds = Float(
        60.0,
        config=True,
        help="""How far in the past (seconds) a lab session's start may lie when it is booked (a
        clock a little behind, a form sent slowly). A start further back is refused (400, field
        start): a booking would otherwise hold cards at once for a window already under way.""",
    )
    hold_margin_seconds = Float(
        600.0,
        config=True,
        help="""How long before its servers are started (``prestart_seconds`` before the window)
        a booking begins to hold its cards: from then on nobody else may start on them and spot
        servers on them get their warning. Before that the booking holds nothing (only another
        booking for the same time is refused). At least the spot market's warning plus 5 s.""",
    )
    interval = Float(
        1.0, config=True, help="Seconds between looks at the bookings (with 10% jitter)."
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._task: asyncio.Task | None = None
        self._busy: set[str] = set()

    # ---- state: which bookings had their servers started (survives a hub restart) ----------

    def _state_path(self, pool: GpuPool) -> Path:
        return Path(pool.data_dir) / STATE_FILE

    def _read_state(self, pool: GpuPool) -> dict[str, Any]:
        try:
            return json.loads(self._state_path(pool).read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _write_state(self, pool: GpuPool, state: dict[str, Any]) -> None:
        path = self._state_path(pool)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)

    # ---- the loop ----------------------------------------------------------------------------

    def start(self, app: Any, hub: HubClient, after: Any = None) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run(app, hub, after))

    async def _run(self, app: Any, hub: HubClient, after: Any) -> None:
        if after is not None:
            await after
        pool = GpuPool.instance()
        while True:
            try:
                await self.tick(app, pool, hub, time.time())
            except Exception:
                self.log.exception("Lab-session bookings: a look at the bookings failed")
            await asyncio.sleep(self.interval * (1 + random.uniform(0, 0.1)))

    async def tick(self, app: Any, pool: GpuPool, hub: HubClient, now: float) -> None:
        state = self._read_state(pool)
        changed = False
        for hold in list(pool.allocator.holds):
            if hold.kind == "reservation" and now >= hold.end:
                # A month's end: its servers run on, billed on demand from now.
                pool.allocator.drop_hold(hold.hold_id)
                continue
            if hold.kind != "booking" or hold.hold_id in self._busy:
                continue
            done = state.setdefault(hold.hold_id, {"servers": [], "tried": 0.0})
            self._busy.add(hold.hold_id)
            try:
                if now >= hold.end:
                    await self._close(pool, hub, hold)
                    state.pop(hold.hold_id, None)
                    changed = True
                elif hold.use_from <= now and now - done["tried"] >= RETRY_SECONDS:
                    # Every student gets a server once (a booking made at class time too); a
                    # start that failed (a spot server still leaving its card) is tried again.
                    done["servers"] += await self._prestart(app, hub, hold, done["servers"])
                    done["tried"] = now
                    changed = True
            finally:
                self._busy.discard(hold.hold_id)
        if changed:
            self._write_state(pool, state)

    async def _prestart(
        self, app: Any, hub: HubClient, hold: Hold, already: list[str]
    ) -> list[str]:
        course = hold.account.removeprefix("course:")
        found = groups.find(app.db, course)
        if found is None:
            return []
        names = [n for n in groups.students(found[0])[: hold.cards] if n not in already]
        if not names:
            return []
        options = {"gpu": hold.gpu_type, "gpus": 1, "course": course}

        async def one(name: str) -> str | None:
            user = app.users[name] if name in app.users else None
            spawner = user.spawners.get("") if user is not None else None
            if spawner is not None and (spawner.active or spawner.pending):
                return name  # already running (or starting): theirs to keep
            code, body = await hub.start_server(f"{name}/", options)
            if code not in (201, 202):
                self.log.warning(
                    "Lab session %s: %s's server not started yet: %s %s",
                    hold.hold_id,
                    name,
                    code,
                    body,
                )
                return None
            return name

        started = [n for n in await asyncio.gather(*(one(n) for n in names)) if n]
        if started:
            self.log.info(
                "Lab session %s of %s: started %d server(s) before the window",
                hold.hold_id,
                course,
                len(started),
            )
        return started

    async def _close(self, pool: GpuPool, hub: HubClient, hold: Hold) -> None:
        owners = [a.owner for a in pool.allocator.allocations if a.hold_id == hold.hold_id]
        await asyncio.gather(*(hub.stop_server(owner) for owner in owners))
        pool.allocator.drop_hold(hold.hold_id)
        self.log.info(
            "Lab session %s ended: stopped %d server(s), cards free", hold.hold_id, len(owners)
        )


def _parse_time(field: str, value: Any) -> float:
    if isinstance(value, bool):
        raise CourseError(400, field, f"must be an ISO time or Unix seconds, not {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    raise CourseError(
        400, field, f"must be an ISO time (2026-12-01T14:00:00Z) or Unix seconds, not {value!r}"
    )


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def booking_json(hold: Hold, used: int, now: float) -> dict[str, Any]:
    if now < hold.use_from:
        state = "scheduled"
    elif now < hold.start:
        state = "starting"
    elif now < hold.end:
        state = "open"
    else:
        state = "ended"
    return {
        "id": hold.hold_id,
        "course": hold.account.removeprefix("course:"),
        "gpu_type": hold.gpu_type,
        "cards": hold.cards,
        "cards_in_use": used,
        "start": _iso(hold.start),
        "end": _iso(hold.end),
        "servers_from": _iso(hold.use_from),
        "state": state,
        "label": hold.label,
    }


@dataclass(frozen=True)
class BookingAsk:
    """A lab-session booking as asked, checked whole: the type, the cards and the window."""

    gpu_type: str
    cards: int
    start: float
    end: float


def parse_booking(
    body: dict, course: Course, catalog: Catalog, keeper: BookingKeeper, now: float
) -> BookingAsk:
    """The booking ``body`` asks for, or :class:`CourseError` naming the first wrong field.

    Pure (no pool, no request), so every refusal is tested without a hub: a known type the
    course allows, whole cards, a window that is not over and does not start in the past (beyond
    ``start_grace_seconds``), not longer than a session or
    ``max_window_hours``, and not further ahead than ``max_days_ahead``.
    """
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise CourseError(400, unknown[0], f"unknown field; allowed: {', '.join(FIELDS)}")
    gpu_type = body.get("gpu_type")
    allowed = [g for g in course.limits.allowed("gpu_types", catalog) if g != NO_GPU]
    if gpu_type not in catalog.gpu_types:
        raise CourseError(
            400, "gpu_type", f"unknown GPU type {gpu_type!r}; allowed: {', '.join(allowed)}"
        )
    if gpu_type not in allowed:
        raise CourseError(
            403,
            "gpu_type",
            f"course {course.name} does not allow {gpu_type!r}; allowed: "
            f"{', '.join(allowed) or 'none'}",
        )
    cards = body.get("cards")
    if isinstance(cards, bool) or not isinstance(cards, int) or cards < 1:
        raise CourseError(400, "cards", f"must be a whole number of at least 1, not {cards!r}")
    start = _parse_time("start", body.get("start"))
    if "end" in body and "minutes" in body:
        raise CourseError(400, "end", "give end or minutes, not both")
    if "end" in body:
        end = _parse_time("end", body["end"])
    else:
        minutes = body.get("minutes")
        if isinstance(minutes, bool) or not isinstance(minutes, int | float) or minutes <= 0:
            raise CourseError(
                400, "minutes", f"must be a positive number of minutes, not {minutes!r}"
            )
        end = start + float(minutes) * 60
    if end <= now:
        raise CourseError(400, "start", f"the window {_iso(start)}-{_iso(end)} is over")
    if start < now - keeper.start_grace_seconds:
        raise CourseError(
            400,
            "start",
            f"{_iso(start)} is in the past; a lab session starts now or later (at most "
            f"{keeper.start_grace_seconds:g} s ago, BookingKeeper.start_grace_seconds)",
        )
    if end <= start:
        raise CourseError(400, "end", "must be after start")
    if end - start > keeper.max_minutes * 60:
        raise CourseError(
            400, "minutes", f"a lab session lasts at most {keeper.max_minutes} minutes"
        )
    if end - start > keeper.max_window_hours * 3600:
        raise CourseError(
            400,
            "minutes",
            f"a lab-session booking covers at most {keeper.max_window_hours:g} hours "
            f"(BookingKeeper.max_window_hours); this one asks {(end - start) / 3600:.2f}",
        )
    if start > now + keeper.max_days_ahead * 86400:
        raise CourseError(
            400,
            "start",
            f"lab sessions are booked at most {keeper.max_days_ahead} days ahead "
            "(BookingKeeper.max_days_ahead)",
        )
    return BookingAsk(gpu_type=gpu_type, cards=cards, start=start, end=end)


class BookingsAPIHandler(CourseAPIHandler):
    @property
    def keeper(self) -> BookingKeeper:
        return BookingKeeper.instance(config=self.settings["config"])

    def bookings(self, course: str) -> list[Hold]:
        account = account_for_course(course)
        return sorted(
            (h for h in self.pool.allocator.holds if h.kind == "booking" and h.account == account),
            key=lambda h: h.start,
        )

    @needs_scope(COURSE_READ_SCOPE)
    def get(self, group_name: str) -> None:
        self.course(group_name)
        now = time.time()
        alloc = self.pool.allocator
        out = [booking_json(h, alloc.hold_used(h.hold_id), now) for h in self.bookings(group_name)]
        self.write(json.dumps({"bookings": out}))

    @needs_scope(COURSE_MANAGE_SCOPE)
    def post(self, group_name: str) -> None:
        group, course = self.course(group_name)
        body = self.json_object_body()
        now = time.time()
        keeper = self.keeper
        ask = parse_booking(body, course, self.pool.catalog, keeper, now)
        gpu_type, cards, start, end = ask.gpu_type, ask.cards, ask.start, ask.end
        warning = SpotMarket.instance(config=self.settings["config"]).warning_seconds
        use_from = max(now, start - keeper.prestart_seconds)
        margin = max(keeper.hold_margin_seconds, warning + 5)
        hold = Hold(
            hold_id=new_hold_id("booking"),
            kind="booking",
            account=account_for_course(course.name),
            gpu_type=gpu_type,
            cards=cards,
            start=start,
            end=end,
            use_from=use_from,
            reclaim_from=max(now, use_from - margin),
            created=now,
            label=f"course {course.name}'s lab session {_iso(start)}-{_iso(end)}",
        )
        limits = HoldLimits.instance(config=self.settings["config"])
        # A booking's cards serve one server per student, one card each: a course never holds
        # more cards at once (all types and overlapping bookings together) than it has students.
        n = len(groups.students(group))
        use = (n, f"one card per student; course {course.name} has {n} student(s)")
        try:
            self.pool.allocator.add_hold(
                hold, lambda holds, h: limits.problem(holds, h, now, use_limit=use)
            )
        except NoCapacity as e:
            raise CourseError(409, "cards", str(e)) from None
        self.log.info("Booked %s: %d %s for %s", hold.hold_id, cards, gpu_type, hold.label)
        self.set_status(201)
        self.write(json.dumps(booking_json(hold, 0, now)))


class BookingAPIHandler(BookingsAPIHandler):
    @needs_scope(COURSE_MANAGE_SCOPE)
    def delete(self, group_name: str, booking: str) -> None:
        self.course(group_name)
        if booking not in {h.hold_id for h in self.bookings(group_name)}:
            raise CourseError(404, "booking", f"no booking {booking!r} in course {group_name}")
        self.pool.allocator.drop_hold(booking)
        self.set_status(204)


ROUTES = [
    (r"/api/gpulab/courses/([^/]+)/bookings", BookingsAPIHandler),
    (r"/api/gpulab/courses/([^/]+)/bookings/([^/]+)", BookingAPIHandler),
]
