"""The gate every start passes: staff rights first, then the market, before JupyterHub's spawn.

Shared by every path that starts a server (the spawn form's POST, the REST API, app launch):
:func:`gate_start` checks the caller's right to start this server under the course its options
name (``courses/staff.py``, 403 naming the rule) and then asks the market, so queued requests
are not spawns and a request the caller may not make is neither spawned nor queued.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.staff import check_staff_start, mark_payer
from gpulab.spawners.courses import CourseRuleError, apply_course_rules, student_courses
from gpulab.spawners.market.admission import Admission, MarketAnswer
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.options import OptionsError, parse_options


async def gate_start(
    handler: Any, user: Any, spawner: Any, raw_options: Any
) -> dict[str, Any] | None:
    """Refuse (403, the staff rule) a start ``handler``'s caller may not make on ``user``'s
    server; else ask the market (:func:`queue_instead_of_spawn`): the queue entry, or None when
    the spawn goes ahead."""
    try:
        actor = check_staff_start(
            handler, user, raw_options if isinstance(raw_options, dict) else {}
        )
    except CourseError as e:
        raise web.HTTPError(e.status, str(e)) from None
    # A server course staff start is paid by the course's pool only (courses/staff.py).
    mark_payer(spawner, actor)
    return await queue_instead_of_spawn(spawner, raw_options)


async def queue_instead_of_spawn(spawner: Any, raw_options: Any) -> dict[str, Any] | None:
    """Ask the market before a spawn begins. When it queues the request, return the queue entry
    (the caller answers "queued" and starts nothing); otherwise None: the spawn goes ahead.

    The market's answer is handed to the spawner (:class:`Admission`), whose start then does
    not ask the market again: admission changes the market's state, so it runs once per spawn.
    A refusal is raised by the spawner from that answer, so the user reads it as a failed spawn.
    """
    pool = getattr(spawner, "pool", None)
    if pool is None or not hasattr(spawner, "owner"):
        return None  # not a gpulab spawner
    try:
        options = parse_options(raw_options or {}, pool.catalog)
        # The course a student's server runs under decides what they may pay with (below).
        options = apply_course_rules(options, student_courses(spawner.user), pool.catalog)
    except (OptionsError, CourseRuleError):
        return None  # the spawn goes ahead and the spawner refuses it, naming the field
    spawner.gpulab_admission = None
    try:
        # Money first: a request the user cannot pay must not queue, reserve or reclaim anything
        # (the spawn then goes ahead and is refused, 402, before it reaches the market).
        await spawner.check_affordable(options)
    except Exception:
        return None
    market = SpotMarket.instance(config=spawner.config)
    try:
        market.admit(spawner, options)
    except MarketAnswer as e:
        if e.status != 202:
            spawner.gpulab_admission = Admission(options.to_json(), refusal=e)
            return None
        entry = market.queued_entry(spawner.owner)
        if entry is not None:
            entry["message"] = e.message
            market.log.info(
                "Queued %s for %s (no spawn started): %s", entry["id"], spawner.owner, e.message
            )
        return entry
    spawner.gpulab_admission = Admission(options.to_json())
    return None


def idle_spawner(user: Any, server_name: str) -> Any:
    """The user's spawner for ``server_name`` when it exists and runs nothing, else None."""
    if user is None:
        return None
    spawner = user.spawners.get(server_name)
    if spawner is None and not server_name:
        spawner = user.spawner
    return spawner if spawner is not None and not spawner.active else None
