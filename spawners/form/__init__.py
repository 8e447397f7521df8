"""The spawn form: GPU types with live free/total, price, spot price and VRAM; images; datasets;
pricing (spot: max price, queue when it can't start, low-price windows only); and, while this
server has a queued request, that request: its condition, place in the queue, the current spot
price (refreshed) and a Cancel button (``DELETE /hub/api/gpulab/spot/queue/USER``).

The form reads the same pool snapshot as ``GET /hub/api/gpulab/pool`` and refreshes the free
counts from it every few seconds, so what it shows is what the allocator will hand out.

A link may fill the form in (``/hub/spawn?opt-gpu=...``): the spawn page hands the link's options
over as ``spawner.handler.gpulab_prefill`` and the form shows them preselected, with a note that
nothing starts until the user presses Start (a GET never starts a server).

The HTML is ``templates/form.html`` (Jinja2, autoescaped: catalog texts come from an operator's
file and option values from users, so nothing reaches the page unescaped). Its CSS and JS are
``static/form.css`` and ``static/form.js``, inlined into the form: JupyterHub injects the options
form into its own spawn page, so the form needs no route of its own. This module only turns the
pool snapshot, the spot market and the server's options into the template's context.
"""

from __future__ import annotations

import asyncio
import time
from functools import cache
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from gpulab.catalog import NO_GPU, Catalog
from gpulab.catalog.pricing import EDUCATION, quote
from gpulab.spawners.courses import Course, allowed_choices, student_courses
from gpulab.spawners.images import ImageStatus
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.allocator import owner_key
from gpulab.spawners.options import DEFAULTS
from gpulab.spawners.storage.datasets import mount_name

# StrictUndefined: a name missing from the context is a bug to see at once, not an empty string.
_ENV = Environment(
    loader=PackageLoader(__name__, "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


@cache
def _static(name: str) -> Markup:
    """A file of ``static/``, trusted as it is (it ships with gpulab, nobody else writes it)."""
    return Markup(resources.files(__name__).joinpath("static", name).read_text(encoding="utf-8"))


async def render_form(spawner: Any) -> str:
    """The spawner's ``options_form``: the form for this user's server, as HTML."""
    pool = spawner.pool
    market = SpotMarket.instance(config=spawner.config)
    # A spawner whose images may be missing on this node (Docker) says which are present; the
    # others (local processes) always run the hub's own environment.
    hook = getattr(spawner, "image_availability", None)
    # JupyterHub sets ``spawner.handler`` to the spawn page's handler before it asks for the form.
    handler = getattr(spawner, "handler", None)
    prefill = getattr(handler, "gpulab_prefill", None) or {}
    # A refused POST: the form again as the person filled it in (no "a link filled it" note).
    posted = getattr(handler, "gpulab_posted", None) or {}
    context = form_context(
        catalog=pool.catalog,
        snapshot=await pool.snapshot(),
        market=market,
        user=spawner.user.name,
        server=spawner.name,
        user_options=spawner.user_options or {},
        available=await hook() if hook is not None else {},
        courses=student_courses(spawner.user),
        prefill=prefill or posted,
        private_datasets=await asyncio.to_thread(readable_datasets, pool, spawner.user),
    )
    if posted and not prefill:
        context["prefilled"] = False
    # A refused POST whose value only needs confirming (a max price above ten times on-demand):
    # the form offers the field that confirms it (hub_config/overrides/spawn_page.py).
    context["confirm"] = getattr(handler, "gpulab_confirm", None) if posted else None
    return render(context)


def _size(n: int) -> str:
    """A size as the catalog's datasets say theirs: ``12 KB``, ``3.4 MB``, ``1.2 GB``."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{max(1, round(n / 2**10))} KB"


def readable_datasets(pool: Any, user: Any) -> list[Any]:
    """The users' datasets ``user`` may mount: their own, then those shared with them (blocks
    the first time the store reads its manifests)."""
    courses = [c.name for c in student_courses(user)]
    store = pool.datasets
    return [*store.owned_by(user.name), *store.shared_with(user.name, courses)]


def render(context: dict[str, Any]) -> str:
    """The form's HTML from a context built by :func:`form_context`."""
    return _ENV.get_template("form.html").render(
        css=_static("form.css"), js=_static("form.js"), **context
    )


def form_context(
    *,
    catalog: Catalog,
    snapshot: dict[str, Any],
    market: SpotMarket,
    user: str,
    server: str,
    user_options: dict[str, Any],
    available: dict[str, ImageStatus],
    courses: list[Course] | None = None,
    prefill: dict[str, Any] | None = None,
    private_datasets: list[Any] | None = None,
) -> dict[str, Any]:
    """What the template shows, as plain values (the template escapes them). A student sees only
    what their ``courses`` allow (the spawner refuses the rest anyway)."""
    allowed = allowed_choices(courses or [], catalog)

    def offered(section: str, slug: str) -> bool:
        return allowed is None or slug in allowed[section]

    # A student's server runs under a course: on demand it pays the education price. Every price
    # below is the one price function's (billing rates by the same).
    education = allowed is not None
    queued = market.queued_entry(owner_key(user, server))
    # A queued request never became a spawn, so user_options still hold the server before it:
    # the form shows the queued request's choices, else "Start" would quietly submit others.
    # A link's options (``prefill``) come last: they are what the user is asked to confirm.
    prefill = {k: v for k, v in (prefill or {}).items() if v is not None}
    last = {**DEFAULTS, **user_options, **((queued or {}).get("options") or {}), **prefill}
    cur = catalog.currency

    if not offered("gpu_types", last["gpu"]):
        # The last choice is not the course's: start from the first one it offers.
        firsts = [t["slug"] for t in snapshot["gpu_types"] if t["total"] > 0]
        firsts = [g for g in [*firsts, NO_GPU] if offered("gpu_types", g)]
        last["gpu"] = firsts[0] if firsts else NO_GPU
    gpu_types = [
        {
            "slug": t["slug"],
            "display_name": t["display_name"],
            "simulated": bool(t["simulated"]),
            "full": t["free"] == 0,
            "checked": last["gpu"] == t["slug"],
            "vram_gb": t["vram_gb"],
            "on_demand_price": t["on_demand_price"],
            "price": str(quote(catalog, t["slug"], 1, education=education).per_card),
            "spot_floor_price": t["spot_floor_price"],
            "free": t["free"],
            "total": t["total"],
            "spot_price": str(market.current_price(t["slug"])),
        }
        for t in snapshot["gpu_types"]
        if t["total"] > 0 and offered("gpu_types", t["slug"])
    ]
    no_gpu = catalog.no_gpu

    present = [
        s
        for s in catalog.images
        if (s not in available or available[s].present) and offered("images", s)
    ]
    selected = last["image"] if last["image"] in present else (present[0] if present else "")
    images = []
    for slug, image in catalog.images.items():
        if not offered("images", slug):
            continue
        status = available.get(slug)
        missing = status is not None and not status.present
        images.append(
            {
                "slug": slug,
                "display_name": image.display_name,
                "description": image.description,
                # The image's own labels say what it preloads; the catalog's list is the fallback.
                "preloads": ", ".join(
                    status.preloads if status and status.present else image.preloads
                ),
                "selected": selected == slug,
                "missing": missing,
                "reason": status.reason if missing and status else "",
            }
        )

    chosen = last.get("datasets") or []
    datasets = [
        {
            "slug": slug,
            "display_name": ds.display_name,
            "size": ds.size,
            "description": ds.description,
            "license": ds.license,
            "checked": slug in chosen,
        }
        for slug, ds in catalog.datasets.items()
        if offered("datasets", slug)
    ] + [
        # Users' own datasets this user may read (theirs, or shared with them or their class).
        {
            "slug": m.slug,
            "display_name": m.slug,
            "size": _size(m.size_bytes),
            "description": "yours" if m.owner == user else f"shared by {m.owner}",
            "license": f"read-only at ~/datasets/{mount_name(m.slug)}",
            "checked": m.slug in chosen,
        }
        for m in private_datasets or ()
    ]

    windows = ", ".join(market.low_price_windows) + (", weekends" if market.weekends_low else "")
    return {
        "currency": cur,
        # "education" for a course's student, whose on-demand prices are the education prices.
        "price_kind": EDUCATION if education else "on-demand",
        "queued": _queued_context(queued, catalog, cur, windows, user, server) if queued else None,
        "gpu_types": gpu_types,
        "no_gpu": {
            "value": NO_GPU,
            "display_name": no_gpu.display_name,
            "description": no_gpu.description,
            "price_per_hour": str(quote(catalog, NO_GPU, education=education).per_hour),
            "checked": last["gpu"] == NO_GPU,
            "offered": offered("gpu_types", NO_GPU),
        },
        "courses": [
            {"name": c.name, "title": c.title, "selected": last.get("course") == c.name}
            for c in courses or []
        ],
        "max_gpus": catalog.max_gpus_per_server,
        "gpus": str((last["gpus"] if last["gpu"] != NO_GPU else 1) or 1),
        "images": images,
        "datasets": datasets,
        "pricing": last["pricing"],
        "max_price": str(last.get("max_price") or ""),
        "wait": bool(last.get("wait")),
        "windows_only": bool(last.get("windows_only")),
        "low_price_windows": windows,
        "prefilled": bool(prefill),
        # Only a link names the app (the form has no app choice): kept in a hidden field.
        "app": _app_choice(prefill.get("app"), catalog, offered),
    }


def _app_choice(slug: Any, catalog: Catalog, offered: Any) -> dict[str, str] | None:
    app = catalog.apps.get(slug) if isinstance(slug, str) else None
    if app is None or not offered("apps", slug):
        return None
    return {"slug": slug, "display_name": app.display_name}


def _queued_context(
    q: dict[str, Any], catalog: Catalog, cur: str, windows: str, user: str, server: str
) -> dict[str, Any]:
    """This server's queued request: what it waits for, its place, the price now."""
    gpu = catalog.gpu_types.get(q["gpu_type"])
    name = gpu.display_name if gpu else q["gpu_type"]
    if q["pricing"] == "on-demand":
        what = f"{name} x{q['gpus']}, on demand"
        condition = "Starts by itself when a spot server of that type has been reclaimed for it."
    else:
        what = f"{name} x{q['gpus']}, spot, max price {cur} {q['max_price'] or '?'}/card-hour"
        condition = (
            "Starts by itself when a card is free and the spot price is at most your max price"
            + (f", inside a low-price window ({windows})." if q["windows_only"] else ".")
        )
    return {
        "id": q["id"],
        "user": user,
        "server": server,
        "queued_at": time.strftime("%H:%M:%S", time.localtime(q["queued_at"])),
        "what": what,
        "condition": condition,
        "position": q["position"],
        "queue_length": q["queue_length"],
        "gpu_name": name,
        "current_price": q["current_price"],
    }
