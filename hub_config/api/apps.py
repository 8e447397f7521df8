"""One-click apps and the home page's data.

- ``GET  /hub/api/gpulab/users/NAME/home``: what the home page shows: balance, the running
  server (mode, app, price, cost so far), the app tiles with what each would start, free cards.
- ``POST /hub/api/gpulab/users/NAME/apps/APP/launch``: start NAME's server for APP on the
  cheapest GPU type with a free card that fits it (:mod:`gpulab.hub_config.launch_plan`), body
  ``{"pricing": "spot", "max_price": "0.5"}`` (all optional, ``gpu`` to pick one yourself).
  202 with where the app will be; 202 with ``queued`` when the spot market queues it; 4xx naming
  what to pick instead, and nothing started.
- ``GET  /hub/api/gpulab/users/NAME/launch``: the launch's progress so far (the spawner's real
  steps), whether the server is ready and, once it is, whether the app answers (``app_probe``,
  asked by the hub: the app is on the user's own origin, see :mod:`gpulab.hub_config.app_probe`).
"""

from __future__ import annotations

import asyncio
import json
import time
from decimal import Decimal
from typing import Any

from jupyterhub.scopes import needs_scope
from jupyterhub.utils import url_path_join
from tornado import web

from gpulab.catalog import NO_GPU
from gpulab.catalog.pricing import quote
from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.app_probe import LaunchWatch, probe_app
from gpulab.hub_config.billing.hooks import hourly_price
from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.staff import check_staff_start
from gpulab.hub_config.home import GpulabHome
from gpulab.hub_config.launch_plan import LaunchRefused, plan_launch, plan_table
from gpulab.hub_config.overrides.errors import http_error, human_text
from gpulab.hub_config.overrides.queue import gate_start
from gpulab.spawners.courses import allowed_choices, student_courses
from gpulab.spawners.options import OptionsError, app_gpu_types, parse_options

# How long the launch request waits for a spawn to be refused outright (bad option, balance, no
# card) so that the refusal is its answer; a spawn still going after that is reported as started.
REFUSAL_WAIT = 0.5
# Apps whose absence the hub's log already explained.
_TOLD: set[str] = set()


class _UserHandler(GpulabAPIHandler):
    def user_or_404(self, user_name: str) -> Any:
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        return user

    @property
    def home(self) -> GpulabHome:
        return GpulabHome.instance(config=self.settings["config"])

    def spot_prices(self) -> dict[str, Decimal]:
        out = {}
        for slug in self.pool.catalog.gpu_types:
            try:
                out[slug] = self.market.current_price(slug)
            except KeyError:  # a type the market does not trade
                continue
        return out

    def tell_operators(self, app: Any, reason: str) -> None:
        """Log once per app why this hub does not offer it (users only see it is not)."""
        if app.slug not in _TOLD:
            _TOLD.add(app.slug)
            self.log.info("App %s is not offered on this hub: %s", app.slug, reason)

    @property
    def launch_watch(self) -> LaunchWatch:
        return LaunchWatch.instance(config=self.settings["config"])

    def app_urls(self, user: Any, app_slug: str) -> dict[str, str]:
        app = self.pool.catalog.apps[app_slug]
        server_url = user.url  # /user/NAME/ (with the hub's base URL)
        return {"url": app.url_path(server_url), "ready_url": app.ready_url_path(server_url)}


def server_view(user: Any, spawner: Any, catalog: Any) -> dict[str, Any] | None:
    """The running (or starting) default server as the home page shows it."""
    if spawner is None or not spawner.active:
        return None
    opts = getattr(spawner, "gpulab_options", None)
    out: dict[str, Any] = {
        "ready": bool(spawner.ready),
        "pending": spawner.pending,
        "url": user.url,
        "mode": getattr(spawner, "mode_label", "") or "",
    }
    if opts is not None:
        price, kind = hourly_price(opts, catalog)
        app = catalog.apps.get(opts.app)
        out.update(
            app=opts.app,
            app_name=app.display_name if app else opts.app,
            app_url=app.url_path(user.url) if app else user.url,
            gpu=opts.gpu,
            gpus=opts.gpus,
            pricing=opts.pricing,
            price_per_hour=str(price),
            price_kind=kind.strip(),
        )
        started = spawner.orm_spawner.started
        if started is not None:
            elapsed = max(0.0, time.time() - started.timestamp())
            out["started"] = started.isoformat() + "Z"
            out["cost_so_far"] = str((price * Decimal(elapsed) / 3600).quantize(Decimal("0.0001")))
    return out


class HomeAPIHandler(_UserHandler):
    @needs_scope("read:servers")
    async def get(self, user_name: str) -> None:
        user = self.user_or_404(user_name)
        catalog = self.pool.catalog
        spawner = user.spawners.get("") or user.spawner
        counts = self.pool.allocator.counts()
        prices = self.spot_prices()
        balance, balance_error = None, ""
        if self.home.balance_hook is not None:
            try:
                balance = await self.home.balance_hook(user.name)
            except Exception as e:  # the page still works without billing
                balance_error = f"balance unavailable: {e}"
        # A student sees their courses' apps and GPU types only (the spawner refuses the rest).
        courses = student_courses(user.orm_user)
        allowed = allowed_choices(courses, catalog)
        # A student's server runs under a course: on demand it pays the education price.
        education = bool(courses)
        operator = bool(getattr(self.current_user, "admin", False))
        apps = []
        for app in catalog.apps.values():
            reason = await spawner.app_unavailable(app)
            if reason and not operator:
                # An app this hub cannot run is not offered: users do not see it (the reason is
                # the operator's business: their tiles and the hub's log say it).
                self.tell_operators(app, reason)
                continue
            if reason:
                reason = f"not offered on this hub: {reason}"
            if not reason and allowed is not None and app.slug not in allowed["apps"]:
                reason = f"not offered by your courses ({', '.join(c.name for c in courses)})"
            # Only types this pool has (those with no free card the tile shows disabled).
            choices = [
                g
                for g in app_gpu_types(app, catalog)
                if (g == NO_GPU or counts.get(g, {}).get("total", 0) > 0)
                and (allowed is None or g in allowed["gpu_types"])
            ]
            # What a click starts for each GPU choice and pricing ("" and "on-demand": the plan).
            plans = (
                {}
                if reason
                else plan_table(app, catalog, counts, prices, choices, education=education)
            )
            apps.append(
                {
                    **app.model_dump(
                        mode="json", exclude={"command", "local_command", "local_checkout"}
                    ),
                    "is_server": app.is_server,
                    "gpu_choices": choices,
                    "available": not reason,
                    "reason": reason,
                    "plan": plans[""]["on-demand"] if plans else None,
                    "plans": plans,
                    **self.app_urls(user, app.slug),
                }
            )
        pool = [
            {
                "slug": slug,
                "display_name": gt.display_name,
                "vram_gb": gt.vram_gb,
                "free": counts.get(slug, {}).get("free", 0),
                "total": counts.get(slug, {}).get("total", 0),
                "on_demand_price": str(gt.on_demand_price),
                # This user's on-demand price per card-hour (a student's: the education price).
                **_your_price(quote(catalog, slug, 1, education=education)),
                "spot_price": str(prices[slug]) if slug in prices else None,
                "simulated": any(
                    d.simulated for d in self.pool.inventory.rentable if d.gpu_type == slug
                ),
            }
            for slug, gt in catalog.gpu_types.items()
        ]
        statement = self.home.statement_url
        self.write(
            json.dumps(
                {
                    "user": user.name,
                    "currency": catalog.currency,
                    "no_gpu": {
                        "display_name": catalog.no_gpu.display_name,
                        **_your_price(quote(catalog, NO_GPU, education=education)),
                    },
                    "balance": balance,
                    "balance_error": balance_error,
                    "server": server_view(user, spawner, catalog),
                    "apps": apps,
                    "pool": pool,
                    "statement_url": url_path_join(self.base_url, statement) if statement else "",
                    "reference_launch_seconds": self.home.reference_launch_seconds,
                }
            )
        )


class LaunchAPIHandler(_UserHandler):
    @needs_scope("servers")
    async def post(self, user_name: str, app_slug: str) -> None:
        user = self.user_or_404(user_name)
        catalog = self.pool.catalog
        app = catalog.apps.get(app_slug)
        if app is None:
            raise web.HTTPError(
                404, f"app: unknown app {app_slug!r}; allowed: {', '.join(catalog.apps)}"
            )
        body = self.get_json_body() or {}
        if not isinstance(body, dict):
            raise web.HTTPError(
                400, "body must be a JSON object: pricing, max_price, gpu, datasets"
            )
        spawner = user.get_spawner("", replace_failed=True)
        if spawner.active:
            opts = getattr(spawner, "gpulab_options", None)
            if opts is not None and opts.app == app.slug and not spawner.pending:
                # Already running this app: open it.
                self.write(
                    json.dumps(
                        {"status": "running", "app": app.slug, **self.app_urls(user, app.slug)}
                    )
                )
                return
            what = spawner.pending or "running"
            raise web.HTTPError(
                409,
                f"Your server is {what}"
                + (
                    f" ({catalog.apps[opts.app].display_name})"
                    if opts and opts.app in catalog.apps
                    else ""
                )
                + f"; stop it first to launch {app.display_name}",
            )
        try:
            # Staff rights before anything else is looked at (the gate below checks them again,
            # with the options the plan made).
            check_staff_start(self, user, body)
        except CourseError as e:
            raise web.HTTPError(e.status, str(e)) from None
        reason = await spawner.app_unavailable(app)
        if reason:
            self.tell_operators(app, reason)
            runnable = [
                a.display_name
                for a in catalog.apps.values()
                if not await spawner.app_unavailable(a)
            ]
            # Plain words for users; why it is not offered is the operator's (the hub's log).
            raise web.HTTPError(
                409,
                f"app: {app.display_name} is not offered on this hub; apps you can launch: "
                f"{', '.join(runnable)}",
            )
        try:
            options, choice = plan_launch(
                app,
                catalog,
                self.pool.allocator.counts(),
                self.spot_prices(),
                body,
                education=bool(student_courses(user.orm_user)),
            )
            parse_options(options, catalog)
        except LaunchRefused as e:
            raise http_error(e.status, str(e), e) from None
        except OptionsError as e:
            # ``message`` names the field for API clients; ``human`` is what the tile shows.
            raise http_error(400, f"Invalid launch option {e}", e) from None

        entry = await gate_start(self, user, spawner, options)
        if entry is not None:
            self.set_status(202)
            self.write(
                json.dumps(
                    {
                        "status": "queued",
                        "message": entry["message"],
                        "human": entry.get("human") or entry["message"],
                        "queued": entry,
                    }
                )
            )
            return
        spawn = asyncio.ensure_future(self.spawn_single_user(user, "", options=options))
        spawn.add_done_callback(_retrieve)
        # "Ready" means the app can do its job: the hub watches the launch itself and ends one
        # whose app cannot become ready (stopped, and its charge credited back).
        market = self.market
        self.launch_watch.start(
            user.name,
            spawner,
            app,
            spawn,
            stop=lambda name: market.hub_client.stop_server(f"{name}/"),
            compensate=market.compensation_hook,
        )
        await asyncio.wait([spawn], timeout=REFUSAL_WAIT)
        if spawn.done() and spawn.exception() is not None:
            error = spawn.exception()
            if isinstance(error, web.HTTPError):
                message = getattr(error, "jupyterhub_message", None) or error.log_message
                raise http_error(error.status_code, message or str(error), error) from None
            raise error
        self.set_status(202)
        self.write(
            json.dumps(
                {
                    "status": "starting",
                    "app": app.slug,
                    "options": options,
                    "gpu": choice.gpu,
                    "price_per_hour": str(choice.price),
                    "currency": catalog.currency,
                    **self.app_urls(user, app.slug),
                    "progress_url": url_path_join(
                        self.hub.base_url, f"api/gpulab/users/{user.name}/launch"
                    ),
                }
            )
        )


def _your_price(q: Any) -> dict[str, str]:
    """A quote of the one price function as the home page shows it."""
    return {"price_per_hour": str(q.per_hour), "price_kind": q.kind}


def _retrieve(fut: asyncio.Future) -> None:
    # JupyterHub reports a failed spawn itself (the server's progress and the home page); this
    # only keeps asyncio from warning that nobody looked at the exception.
    if not fut.cancelled():
        fut.exception()


class LaunchStatusAPIHandler(_UserHandler):
    @needs_scope("read:servers")
    async def get(self, user_name: str) -> None:
        user = self.user_or_404(user_name)
        spawner = user.spawners.get("") or user.spawner
        events = spawner.progress_events()
        failed = failed_human = ""
        future = spawner._spawn_future
        if future is not None and future.done() and future.exception() is not None:
            failed = str(getattr(future.exception(), "log_message", "") or future.exception())
            failed_human = human_text(future.exception())
        # An app that could not become ready: the hub ended the launch (app_probe.LaunchWatch).
        failed = failed or self.launch_watch.failure(user.name)
        opts = getattr(spawner, "gpulab_options", None)
        out: dict[str, Any] = {
            "ready": bool(spawner.ready),
            "pending": spawner.pending,
            "active": bool(spawner.active),
            "events": events,
            "failed": failed,
            "failed_human": failed_human or failed,
            "launch_timings": dict(getattr(spawner, "launch_timings", {}) or {}),
        }
        if opts is not None:
            out.update(app=opts.app, gpu=opts.gpu, **self.app_urls(user, opts.app))
            app = self.pool.catalog.apps.get(opts.app)
            if app is not None and spawner.ready:
                # The app's answer, asked by the hub: the page may not fetch another origin.
                out["app_probe"] = await probe_app(spawner, app)
        self.write(json.dumps(out))


ROUTES = [
    (r"/api/gpulab/users/([^/]+)/home", HomeAPIHandler),
    (r"/api/gpulab/users/([^/]+)/apps/([^/]+)/launch", LaunchAPIHandler),
    (r"/api/gpulab/users/([^/]+)/launch", LaunchStatusAPIHandler),
]
