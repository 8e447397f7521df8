"""The pool, catalog and switch API.

- ``GET /hub/api/gpulab/pool``: per GPU type free/total and prices; each card with its state;
  ``held_now``: the cards kept off "free" right now by a lab session that has begun or is about
  to (or a monthly reservation), so that the home page can say why ("2 cards held for ML 101's
  lab 14:00-16:00"). A booking further ahead holds nothing yet and is not listed.
- ``GET /hub/api/gpulab/catalog``: GPU types, images, datasets, no-GPU mode, currency.
- ``POST /hub/api/gpulab/users/NAME/switch``: restart NAME's running server with changed options
  (the no-GPU toggle, mounting datasets). Needs the ``servers`` scope on that user; course staff
  move a student's server only within a course they staff and the student takes.

Both need the custom scope ``custom:gpulab:read-pool`` (every user has it); who holds which card
is shown only to holders of ``admin:servers``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.catalog import NO_GPU, card_type
from gpulab.catalog.pricing import price_list
from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.courses import groups
from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.staff import check_staff_start, mark_payer
from gpulab.hub_config.overrides.errors import http_error
from gpulab.hub_config.overrides.queue import STOP_DURING_SWITCH
from gpulab.hub_config.overrides.queue import SWITCHING as _SWITCHING
from gpulab.hub_config.scopes import READ_POOL_SCOPE
from gpulab.spawners.courses import student_courses
from gpulab.spawners.node.allocator import RESERVED, NoCapacity, owner_key
from gpulab.spawners.node.counters import count_refusal
from gpulab.spawners.request import SpawnRequest, hand_over


class PoolAPIHandler(GpulabAPIHandler):
    @needs_scope(READ_POOL_SCOPE)
    async def get(self) -> None:
        viewer = (
            self.current_user.name if getattr(self.current_user, "kind", "") == "user" else None
        )
        snap = await self.pool.snapshot(show_holders=self.has_scope("admin:servers"), viewer=viewer)
        snap["held_now"] = self.held_now(time.time(), viewer)
        snap["your_prices"] = your_prices(self)
        self.write(json.dumps(snap))

    def held_now(self, now: float, viewer: str | None) -> list[dict[str, Any]]:
        """The holds keeping cards off "free" now (the allocator's own test: from ``reclaim_from``
        to ``end``; ``cards`` all it holds, ``in_use`` those its own servers took), for people: a booking by its
        course's display name, a reservation by nobody's name but the viewer's own."""
        alloc = self.pool.allocator
        out = []
        for h in sorted(alloc.holds, key=lambda h: (h.start, h.hold_id)):
            # Every hold keeping cards now is listed, its cards in use by its own servers too
            # (an open lab whose students took every card still explains "0 free").
            in_use = alloc.hold_used(h.hold_id)
            if h.cards <= 0 or not (h.reclaim_from <= now < h.end):
                continue
            kind, _, name = h.account.partition(":")
            if h.kind == "booking" and kind == "course":
                found = groups.find(self.db, name)
                title = found[1].title if found is not None else name
                what = f"{title}'s lab"
            elif kind == "user" and name == viewer:
                what = "your monthly reservation"
            else:
                what = "a monthly reservation"
            out.append(
                {
                    "kind": h.kind,
                    "gpu_type": h.gpu_type,
                    "cards": h.cards,
                    "in_use": min(in_use, h.cards),
                    "for": what,
                    "start": h.start,
                    "end": h.end,
                    "begun": h.start <= now,
                }
            )
        return out


class CatalogAPIHandler(GpulabAPIHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        self.write(json.dumps({**self.pool.catalog.public(), "your_prices": your_prices(self)}))


def your_prices(handler: GpulabAPIHandler) -> dict[str, Any]:
    """The caller's own on-demand prices (one price function, billing's): a course's student
    (or their server's token) pays the education price, as their servers run under a course."""
    user = handler.current_user
    student = getattr(user, "kind", "") == "user" and bool(student_courses(user.orm_user))
    return price_list(handler.pool.catalog, education=student)


class SwitchAPIHandler(GpulabAPIHandler):
    """Move a running server to other options (e.g. GPU <-> no-GPU) without losing its home.

    Everything that can fail is checked before the old server stops: the options are validated
    (400) and the new GPUs are reserved (409, with what is free). Then the hub answers 202 and
    stops and restarts the server in the background; progress is the server's usual progress URL.
    """

    @needs_scope("servers")
    async def post(self, user_name: str) -> None:
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        spawner = user.spawners.get("")
        if spawner is None or not spawner.active or spawner.pending:
            state = spawner.pending if spawner is not None and spawner.pending else "not running"
            raise web.HTTPError(409, f"{user_name}'s server is {state}; start it instead")
        owner = owner_key(user.name, "")
        if owner in _SWITCHING:
            # One switch of a server at a time: two restarts of one spawner would both start a
            # process, and the one the spawner forgot would run on unbilled, holding its cards.
            raise web.HTTPError(409, f"{user_name}'s server is already being switched; wait for it")
        _SWITCHING.add(owner)  # no await since the check: the two are one step on the loop
        try:
            await self._switch(user, spawner, owner)
        except BaseException:
            _SWITCHING.discard(owner)
            raise

    async def _switch(self, user: Any, spawner: Any, owner: str) -> None:
        """Check, reserve and answer 202; the restart (which ends the switch) runs on its own."""
        body = self.get_json_body() or {}
        if not isinstance(body, dict):
            raise web.HTTPError(400, "body must be a JSON object of spawn options")
        current = spawner.user_options or {}
        merged = {**current, **body}
        if "gpus" not in body and merged.get("gpu") != current.get("gpu"):
            merged.pop("gpus", None)  # a new GPU type starts from the default card count
        if merged.get("gpu") == NO_GPU and "pricing" not in body:
            # Leaving a spot GPU for no-GPU mode (the JupyterLab toggle) leaves the spot market too.
            for key in ("pricing", "max_price", "confirm_max_price", "wait", "windows_only"):
                merged.pop(key, None)
        try:
            # The staff rule (courses/staff.py): someone else's server moves only within a course
            # they staff and its owner takes (the running server's course when the body names none).
            actor = check_staff_start(self, user, merged)
        except CourseError as e:
            raise web.HTTPError(e.status, str(e)) from None
        if merged.get("course") != current.get("course"):
            # A running server keeps the course it was started under, whoever asks: its own token
            # (which course staff reach inside a student's server) moving it into the student's
            # other course would make that course's pool pay for staff of another.
            now = current.get("course") or "no course"
            raise web.HTTPError(
                400,
                f"course: a running server keeps its course ({now}); stop it and start it "
                "under the other course",
            )
        mark_payer(spawner, actor)  # a staff switch is the pool's alone (courses/staff.py)
        # The switch's spawn request (400 naming the field; the course rules): made once, and
        # handed to the restarted server's start with the money already asked.
        request = spawner.spawn_request(merged)
        options = request.options
        if options.pricing == "spot":
            # The old server would be gone before the market could say no (price above the bid,
            # queueing): spot servers are started from the spawn page or the REST API instead.
            raise web.HTTPError(
                409,
                "A running server cannot be switched onto spot pricing; stop it and start a spot "
                "server (the market then answers with the current price or a queue place)",
            )
        # Money first: nothing is reserved or stopped for a mode the user cannot pay (402).
        try:
            request = await spawner.check_affordable(request)
        except web.HTTPError as e:
            count_refusal("balance" if e.status_code == 402 else "other")  # the hub's metrics
            raise
        try:
            self.pool.allocator.reserve(owner, card_type(options.gpu), options.gpus)
        except NoCapacity as e:
            count_refusal("pool_exhausted")
            raise http_error(409, str(e), e) from None
        self.log.info("Switching %s to %s", owner, options.label(self.pool.catalog))
        asyncio.get_running_loop().create_task(self._restart(user, request))
        self.set_status(202)
        self.write(
            json.dumps({"options": options.to_json(), "progress_url": user.progress_url("")})
        )

    async def _restart(self, user, request: SpawnRequest) -> None:
        owner = owner_key(user.name, "")
        try:
            await user.stop("")
            if owner in STOP_DURING_SWITCH:
                self.log.info(
                    "Switching %s: stopped on its owner's request, nothing started", owner
                )
                self.pool.allocator.release(owner + RESERVED)
                return
            hand_over(request)
            await self.spawn_single_user(user, "", options=request.raw)
        except Exception:
            self.log.exception("Switching %s's server failed", user.name)
            # Whatever failed, the cards held for the new server go back at once.
            self.pool.allocator.release(owner + RESERVED)
        finally:
            _SWITCHING.discard(owner)
            STOP_DURING_SWITCH.discard(owner)


ROUTES = [
    (r"/api/gpulab/pool", PoolAPIHandler),
    (r"/api/gpulab/catalog", CatalogAPIHandler),
    (r"/api/gpulab/users/([^/]+)/switch", SwitchAPIHandler),
]
