"""A user sees their GPU working: ``GET /hub/api/gpulab/users/NAME/gpu[?server=SERVER]``.

The cards NAME's server (the default one unless ``server`` names another) holds, as the pool's
ledger says (never as the server says), each with the hub's own reading of it (the
:class:`~gpulab.hub_config.metrics.sampler.CardSampler`: NVML on real cards, with the processes
and their memory where NVML gives them; on simulated cards utilisation follows the server's
CPU use as the hub observes it, and there is no memory or process to show, ``simulated: true``),
how long they have been idle, and a ``nudge`` once they have been idle for
``GpuNudge.idle_minutes``: what the server costs now and what no-GPU mode would cost, from the
one price function (:func:`gpulab.catalog.pricing.quote`, as the form, the status bar and the
statement), so JupyterLab can offer the switch (the switch API, a POST with its own
confirmation). Nothing here changes anything or costs money.

Who may read it: NAME (browser session, NAME's tokens, and NAME's server's own token, which
JupyterLab's status bar uses) through ``custom:gpulab:read-gpu-usage!user``, and admins
(``admin:users``). Another user gets 403, and so does course staff: a teacher or TA holds
``servers!group=C`` and ``read:users!group=C``, neither of which is this scope (the course
dashboard is their view of a class); hub_config/courses/staff.py gives them no more here.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from jupyterhub.scopes import needs_scope
from tornado import web
from traitlets import Float, TraitError, validate
from traitlets.config import SingletonConfigurable

from gpulab.catalog import NO_GPU
from gpulab.catalog.pricing import quote
from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.billing.hooks import hourly_price
from gpulab.hub_config.billing.observer import ActivityObserver
from gpulab.hub_config.metrics.sampler import CardSampler
from gpulab.hub_config.overrides.errors import http_error
from gpulab.hub_config.scopes import READ_GPU_USAGE_SCOPE
from gpulab.spawners.node.allocator import owner_key

# JupyterHub's own limit on a server name's length (orm.Spawner.name is a 255-character column).
MAX_SERVER_NAME = 255


class GpuNudge(SingletonConfigurable):
    """When a user is told that their GPU sits idle (JupyterLab's status bar and GPU panel, the
    hub's home page)."""

    idle_minutes = Float(
        8.0,
        config=True,
        help="""Minutes a server's cards must have been idle (as the hub measures them: no
        utilisation on any of its cards) before the user is nudged to switch to no-GPU mode,
        with what they pay now and what no-GPU mode would cost. Fractions are allowed (tests use
        a few seconds). 0 turns the nudge off. Keep it below
        ``ActivityObserver.gpu_idle_timeout``, which moves an idle GPU server to no-GPU mode by
        itself, so the nudge comes first.""",
    )

    @validate("idle_minutes")
    def _check_idle_minutes(self, proposal: dict) -> float:
        value = proposal["value"]
        if not math.isfinite(value) or value < 0:
            raise TraitError(
                f"GpuNudge.idle_minutes: {value}; allowed: 0 (off) or a number of minutes above 0"
            )
        return value


def card_view(uuid: str, index: int, gpu_type: str | None, reading: Any) -> dict[str, Any]:
    """One held card as the API shows it: the sampler's ``reading`` (None before its first pass)."""
    if reading is None:
        return {
            "uuid": uuid,
            "index": index,
            "type": gpu_type,
            "util_pct": None,
            "mem_used_mib": None,
            "mem_total_mib": None,
            "power_w": None,
            "temp_c": None,
            "simulated": None,
            "processes": [],
        }
    return {
        "uuid": uuid,
        "index": reading.index,
        "type": gpu_type,
        "util_pct": None if reading.util_pct is None else round(float(reading.util_pct), 1),
        "mem_used_mib": reading.mem_used_mib,
        "mem_total_mib": reading.mem_total_mib,
        "power_w": reading.power_w,
        "temp_c": reading.temp_c,
        "simulated": bool(reading.simulated),
        "processes": [{"pid": int(pid), "used_mib": used} for pid, used in reading.processes],
    }


def idle_for(sampler: Any, uuids: list[str]) -> float | None:
    """How long ``uuids`` have all been idle: the least idle card's figure (a server with one
    busy card is not idle). None while any card has no figure yet."""
    figures = [sampler.idle_seconds(u) for u in uuids]
    if not figures or any(f is None for f in figures):
        return None
    return max(0.0, min(figures))


def nudge_text(idle_seconds: float, currency: str, now: Decimal, no_gpu: Decimal) -> str:
    """``GPU idle for 8 min: switch to no-GPU mode and pay CNY 0.09/h instead of 2.10``."""
    minutes = int(idle_seconds // 60)
    idle = f"{minutes} min" if minutes >= 1 else f"{int(idle_seconds)} s"
    return (
        f"GPU idle for {idle}: switch to no-GPU mode and pay {currency} {no_gpu:.2f}/h "
        f"instead of {now:.2f}"
    )


def nudge(
    idle_seconds: float | None, idle_minutes: float, opts: Any, catalog: Any, auto_after: float
) -> dict[str, Any] | None:
    """The nudge for a server idle ``idle_seconds`` (None: not measured yet), or None.

    ``opts`` are the running server's options (its price now: on-demand, spot in force, course
    education price); ``auto_after`` the observer's ``gpu_idle_timeout`` (0: off), said in
    the text when it is set: a server doing no work at all (CPU included) moves by itself then."""
    if idle_minutes <= 0 or idle_seconds is None or idle_seconds < idle_minutes * 60:
        return None
    if opts is None or opts.gpu == NO_GPU:
        return None
    now, _label = hourly_price(opts, catalog)
    no_gpu = quote(catalog, NO_GPU, education=opts.course is not None).per_hour
    text = nudge_text(idle_seconds, catalog.currency, now, no_gpu) + "."
    if auto_after > 0:
        text += (
            f" A server that does no work for {auto_after / 60:g} min moves to no-GPU mode by "
            "itself (same home)."
        )
    return {
        "idle_seconds": round(idle_seconds, 1),
        "text": text,
        "price_now": str(now),
        "price_no_gpu": str(no_gpu),
        "currency": catalog.currency,
    }


class GpuUsageHandler(GpulabAPIHandler):
    @property
    def sampler(self) -> CardSampler:
        return CardSampler.instance(config=self.settings["config"])

    def server_name(self) -> str:
        server = self.get_argument("server", "")
        if "/" in server or len(server) > MAX_SERVER_NAME:
            raise http_error(
                400,
                f"server: {server[:40]!r} is not a server name; allowed: '' (the default "
                f"server) or a server name without '/', at most {MAX_SERVER_NAME} characters",
                field="server",
            )
        return server

    @needs_scope(READ_GPU_USAGE_SCOPE, "admin:users")
    def get(self, user_name: str) -> None:
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        server = self.server_name()
        # The cards the pool's ledger gives this server: what the hub handed out, not what the
        # server says it has.
        alloc = self.pool.allocator.get(owner_key(user.name, server))
        uuids = list(alloc.uuids) if alloc is not None else []
        latest = self.sampler.latest()
        inventory = self.pool.inventory
        cards = []
        for i, card in enumerate(uuids):
            device = inventory.by_uuid(card)
            index = device.index if device is not None else i
            gpu_type = device.gpu_type if device is not None else alloc.gpu_type
            cards.append(card_view(card, index, gpu_type, latest.get(card)))
        idle = idle_for(self.sampler, uuids) if uuids else None
        spawner = user.spawners.get(server)
        opts = getattr(spawner, "gpulab_options", None) if spawner is not None else None
        settings = GpuNudge.instance(config=self.settings["config"])
        auto = ActivityObserver.instance().gpu_idle_timeout if ActivityObserver.initialized() else 0
        self.write(
            json.dumps(
                {
                    "user": user.name,
                    "server": server,
                    "cards": cards,
                    "idle_seconds": None if idle is None else round(idle, 1),
                    "idle_minutes": settings.idle_minutes,
                    "nudge": (
                        nudge(idle, settings.idle_minutes, opts, self.pool.catalog, auto)
                        if uuids
                        else None
                    ),
                }
            )
        )


ROUTES = [(r"/api/gpulab/users/([^/]+)/gpu", GpuUsageHandler)]
