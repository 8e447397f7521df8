"""The gate every start passes: staff rights first, then money and the market, before
JupyterHub's spawn.

Shared by every path that starts a server (the spawn form's POST, the REST API, app launch):
:func:`gate_start` checks the caller's right to start this server under the course its options
name (``courses/staff.py``, 403 naming the rule), then makes the spawn's
:class:`~gpulab.spawners.request.SpawnRequest` (options parsed and course rules applied, once),
asks the balance and then the market, once each, so queued requests are not spawns and a request
the caller may not make is neither spawned nor queued. The request, with those answers, is
handed over to the spawner (:func:`gpulab.spawners.request.hand_over`): the hub sets nothing on
the spawner object.
"""

from __future__ import annotations

from typing import Any

from tornado import web

from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.staff import check_staff_start, mark_payer
from gpulab.spawners.market.admission import Admission, MarketAnswer
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.counters import count_refusal
from gpulab.spawners.request import drop, hand_over

# Servers (owner keys) whose switch is under way (hub_config/api/pool.py): from its 202 until its
# restart ends, no other start of the same server may begin, or the spawner would run two
# processes and forget one (unbilled, holding cards).
SWITCHING: set[str] = set()
# Servers whose owner asked to stop them while their switch ran: the switch's restart stops the
# old server and starts nothing (a stop answered 202 must not be followed by a new server).
STOP_DURING_SWITCH: set[str] = set()


async def gate_start(
    handler: Any, user: Any, spawner: Any, raw_options: Any
) -> dict[str, Any] | None:
    """Refuse (403, the staff rule) a start ``handler``'s caller may not make on ``user``'s
    server; else ask the market (:func:`queue_instead_of_spawn`): the queue entry, or None when
    the spawn goes ahead."""
    if getattr(spawner, "owner", None) in SWITCHING:
        raise web.HTTPError(409, f"{user.name}'s server is being switched; wait for it")
    try:
        actor = check_staff_start(
            handler, user, raw_options if isinstance(raw_options, dict) else {}
        )
    except CourseError as e:
        count_refusal("staff")
        raise web.HTTPError(e.status, str(e)) from None
    # A server course staff start is paid by the course's pool only (courses/staff.py).
    mark_payer(spawner, actor)
    return await queue_instead_of_spawn(spawner, raw_options)


async def queue_instead_of_spawn(spawner: Any, raw_options: Any) -> dict[str, Any] | None:
    """Ask the money and the market before a spawn begins. When the market queues the request,
    return the queue entry (the caller answers "queued" and starts nothing); otherwise None: the
    spawn goes ahead, with its request handed over to the spawner.

    The balance is asked and the market's answer given once per spawn: the spawner's start uses
    the handed-over request's answers (admission changes the market's state). A refusal (money
    or market) travels in the request and is raised by the spawner, so the user reads it as a
    failed spawn."""
    if not hasattr(spawner, "spawn_request") or not hasattr(spawner, "owner"):
        return None  # not a gpulab spawner
    drop(spawner.owner)  # an earlier request that never began is not this one
    try:
        request = spawner.spawn_request(raw_options or {})
    except web.HTTPError:
        return None  # the spawn goes ahead and the spawner refuses it, naming the field
    try:
        # Money first: a request the user cannot pay must not queue, reserve or reclaim anything
        # (the spawn then goes ahead and is refused, 402, before it reaches the market).
        request = await spawner.check_affordable(request)
    except web.HTTPError as e:
        message = getattr(e, "jupyterhub_message", None) or e.log_message or str(e)
        hand_over(request.refuse(e.status_code, message))
        return None
    except Exception:
        return None  # the start asks again, and reports what went wrong
    market = SpotMarket.instance(config=spawner.config)
    try:
        market.admit(spawner, request.options)
    except MarketAnswer as e:
        if e.status != 202:
            hand_over(request.admitted(Admission(refusal=e)))
            return None
        entry = market.queued_entry(spawner.owner)
        if entry is not None:
            entry["message"] = e.message
            entry["human"] = e.human
            market.log.info(
                "Queued %s for %s (no spawn started): %s", entry["id"], spawner.owner, e.message
            )
        return entry
    hand_over(request.admitted(Admission()))
    return None


def count_rate_limited(error: Exception) -> None:
    """Count JupyterHub's own 429 (``concurrent_spawn_limit``, ``active_server_limit``: refused
    before any spawner runs) as a refusal, reason ``rate_limited``, for the hub's metrics."""
    if getattr(error, "status_code", None) == 429:
        count_refusal("rate_limited")


def idle_spawner(user: Any, server_name: str) -> Any:
    """The user's spawner for ``server_name`` when it exists and runs nothing, else None."""
    if user is None:
        return None
    spawner = user.spawners.get(server_name)
    if spawner is None and not server_name:
        spawner = user.spawner
    return spawner if spawner is not None and not spawner.active else None
