"""The operator's console as JSON: ``GET /hub/api/gpulab/admin/console`` (and the page's route).

One answer for the console page (:mod:`gpulab.hub_config.console`): every card by node with who
holds it, since when, on which pricing and at what price per hour, its utilisation and how long it
has been idle; mean utilisation per GPU type over the last 24 hours (the sampler's 1-minute
history); who waits in the spot queues and why; recent preemptions; the slowest recent spawns
with their steps. It is built from :func:`gpulab.hub_config.metrics.snapshot.snapshot`, the value
the Prometheus collector reads too, so a card the console shows as held by ``alice`` is the card
``gpulab_pool_cards``/``DCGM_FI_DEV_GPU_UTIL`` label with ``alice``, and the counts agree.

Admins only (``admin:users`` unfiltered: a course teacher's group-filtered grants are refused,
403); a GET that reads and changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from jupyterhub.scopes import needs_scope
from traitlets import Integer
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.console import CONSOLE_SCOPE, ConsolePage
from gpulab.hub_config.metrics.sampler import CardSampler
from gpulab.hub_config.metrics.snapshot import snapshot

DAY = 24 * 3600


class Console(SingletonConfigurable):
    """What the operator's console lists."""

    slowest_spawns = Integer(
        20,
        config=True,
        help="""How many of the recent spawns (the hub keeps the last 200) the console lists,
        slowest first.""",
    )

    preemptions = Integer(
        20,
        config=True,
        help="""How many of the most recent spot preemptions the console lists, newest first.""",
    )


class ConsoleAPIHandler(GpulabAPIHandler):
    @needs_scope(CONSOLE_SCOPE)
    def get(self) -> None:
        settings = Console.instance(config=self.settings["config"])
        snap = snapshot(self.settings["app"])
        sampler = CardSampler.instance()  # the one snapshot() reads
        self.write(json.dumps(console_json(snap, sampler, self.market, settings)))


def console_json(snap: Any, sampler: Any, market: Any, settings: Console) -> dict[str, Any]:
    """The console's answer from one snapshot (plus the sampler's history and the market's
    preemption records, which the snapshot does not carry)."""
    now = snap.time
    return {
        "time": now,
        "currency": snap.currency,
        "cards": [_card(c) for c in snap.cards],
        # Cards of cluster nodes that take no servers now (down, drained), counted per node.
        "offline": [
            {"node": o.node, "type": o.type, "cards": o.count, "simulated": o.simulated}
            for o in snap.offline
        ],
        "utilisation": {
            t: [[ts, round(pct, 1)] for ts, pct in sampler.history(t, now - DAY)]
            for t in snap.types
        },
        "queues": [_queued(q, now) for q in snap.queues],
        "preemptions": _preemptions(market, settings.preemptions),
        "spawns": _slowest(snap.spawns, settings.slowest_spawns),
    }


def _card(c: Any) -> dict[str, Any]:
    idle = c.idle_seconds
    return {
        "node": c.node,
        "type": c.type,
        "display_name": c.display_name,
        "model": c.model,
        "uuid": c.uuid,
        "index": c.index,
        "simulated": c.simulated,
        "state": c.state,
        "user": c.user or "",
        "server": c.server or "",
        "since": c.since,
        "pricing": c.pricing or "",
        "price_per_hour": None if c.price_per_hour is None else str(c.price_per_hour),
        "util_pct": c.util_pct,
        "idle_seconds": idle,
        # The sampler's own rule (CardSampler.busy_threshold): idle time is 0 while busy.
        "busy": c.state == "held" and idle == 0,
    }


def _queued(q: Any, now: float) -> dict[str, Any]:
    return {
        "user": q.user,
        "server": q.server,
        "gpu_type": q.gpu_type,
        "gpus": q.gpus,
        "pricing": q.pricing,
        "max_price": None if q.max_price is None else str(q.max_price),
        "current_price": None if q.current_price is None else str(q.current_price),
        "queued_at": q.queued_at,
        "waited_seconds": max(0.0, now - q.queued_at),
        "position": q.position,
        "why": q.why,
    }


def _preemptions(market: Any, n: int) -> list[dict[str, Any]]:
    records = market.preemptions.public()[-n:] if n > 0 else []
    keep = ("id", "user", "server", "gpu_type", "reason", "status", "price", "max_price")
    out = []
    for p in reversed(records):
        checkpoint = p.get("checkpoint") or {}
        out.append(
            {
                **{k: p.get(k) for k in keep},
                "warned_at": p.get("warned_at"),
                "stopped_at": p.get("stopped_at"),
                "checkpoint": checkpoint.get("state") if checkpoint else None,
            }
        )
    return out


def _slowest(spawns: Any, n: int) -> list[dict[str, Any]]:
    """The ``n`` slowest of the recent spawns (refusals and failures too), slowest first."""
    ranked = sorted(spawns, key=lambda r: r.duration_seconds, reverse=True)
    return [r.to_json() for r in ranked[:n]]


ROUTES = [
    (r"/api/gpulab/admin/console", ConsoleAPIHandler),
    (r"/gpulab/console/?", ConsolePage),
]
