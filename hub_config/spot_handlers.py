"""The spot market's JSON API on the hub (mounted by ``handlers.extra_handlers``).

- ``GET /hub/api/gpulab/spot/prices?hours=24``: current spot price per GPU type with its history
  (scope ``custom:gpulab:read-pool``).
- ``PUT /hub/api/gpulab/spot/prices/TYPE`` ``{"price": "1.20"}``: pin a type's spot price, or
  ``{"price": null}`` to return it to the market (scope ``custom:gpulab:set-spot-price``, given to
  admins). An operator feature (incident, promotion); the tests drive prices with it too.
- ``GET /hub/api/gpulab/spot/queue``: queued requests (your own; holders of ``admin:servers`` all).
- ``DELETE /hub/api/gpulab/spot/queue/USER[?server=NAME]``: cancel a queued request (``servers``).
- ``GET /hub/api/gpulab/spot/status/USER[?server=NAME]``: price, bid and the latest preemption with
  its deadline, for the JupyterLab extension (``read:servers``: the server's own token can read it).
- ``GET /hub/api/gpulab/spot/preemptions``: preemption records (own; ``admin:servers`` all).
- ``POST /hub/spawn[/USER[/SERVER]]`` (the spawn form) and ``POST /hub/api/users/USER/server[s/NAME]``:
  JupyterHub's own handlers, except that a request the market queues (a spot bid that waits,
  an on-demand request waiting for a reclaim) is queued *before* any spawn begins. A queued
  request is not a failed spawn: the form comes back showing it in the queue (with Cancel),
  the API answers 202 with the queue entry, and the hub log says "queued", not "error".
- ``GET|PUT /hub/api/gpulab/spot/settings/USER``: the webhook URL, its HMAC secret and the
  checkpoint command (``custom:gpulab:spot-settings`` on that user: every user holds it for
  themself through their log-in session and the tokens they create, admins for everyone; a
  server's own token does not, so code in a notebook can neither read the secret that signs
  the webhooks nor redirect them).
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlparse

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.scopes import define_custom_scopes, needs_scope
from jupyterhub.utils import maybe_future
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from tornado import web

from gpulab.hub_config.handlers import READ_POOL_SCOPE, _GpulabAPIHandler
from gpulab.hub_config.spawn_page import FastSpawnHandler
from gpulab.spawners.allocator import owner_key
from gpulab.spawners.market_hub import MarketAnswer, SpotMarket
from gpulab.spawners.options import OptionsError, parse_options

SET_PRICE_SCOPE = "custom:gpulab:set-spot-price"
SETTINGS_SCOPE = "custom:gpulab:spot-settings"
SPOT_SCOPES = {
    SET_PRICE_SCOPE: {"description": "Pin or unpin the spot price of a GPU type."},
    SETTINGS_SCOPE: {
        "description": "Read and change spot settings: the preemption webhook (with its HMAC "
        "secret) and the checkpoint command."
    },
}
define_custom_scopes(SPOT_SCOPES)


class _SpotHandler(_GpulabAPIHandler):
    @property
    def market(self) -> SpotMarket:
        return SpotMarket.instance(config=self.settings["config"])

    def viewer(self) -> str | None:
        """None for those who see everyone's records (admin:servers), else the user's name."""
        if self.has_scope("admin:servers"):
            return None
        user = self.current_user
        return user.name if getattr(user, "kind", "") == "user" else ""

    def _json_body(self) -> dict:
        body = self.get_json_body()
        if not isinstance(body, dict):
            raise web.HTTPError(400, "body must be a JSON object")
        return body


class PricesHandler(_SpotHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        try:
            hours = float(self.get_argument("hours", "24"))
        except ValueError:
            hours = -1
        if not 0 < hours <= 24 * 31:
            raise web.HTTPError(400, "hours: must be a number of hours between 0 and 744")
        self.write(json.dumps(self.market.prices_json(hours)))


class PinPriceHandler(_SpotHandler):
    @needs_scope(SET_PRICE_SCOPE)
    def put(self, slug: str) -> None:
        catalog = self.pool.catalog
        if slug not in catalog.gpu_types:
            raise web.HTTPError(
                404, f"unknown GPU type {slug!r}; allowed: {', '.join(catalog.gpu_types)}"
            )
        raw = self._json_body().get("price")
        gt = catalog.gpu_types[slug]
        price = None
        if raw is not None:
            try:
                price = Decimal(str(raw))
            except InvalidOperation:
                price = None
            if (
                price is None
                or not price.is_finite()
                or not (gt.spot_floor_price <= price <= gt.on_demand_price)
            ):
                raise web.HTTPError(
                    400,
                    f"price: must be a decimal between the spot floor {gt.spot_floor_price} and "
                    f"the on-demand price {gt.on_demand_price}, or null to unpin; not {raw!r}",
                )
        self.market.pin(slug, price)
        self.log.info(
            "Spot price of %s %s by %s", slug, price or "unpinned", self.current_user.name
        )
        self.write(
            json.dumps(
                {
                    "gpu_type": slug,
                    "pinned": price is not None,
                    "price": str(self.market.current_price(slug)),
                }
            )
        )


class QueueHandler(_SpotHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        self.write(json.dumps({"queue": self.market.queue_json(self.viewer())}))


class QueueEntryHandler(_SpotHandler):
    @needs_scope("servers")
    def delete(self, user_name: str) -> None:
        owner = owner_key(user_name, self.get_argument("server", ""))
        entry = self.market.cancel_queued(owner)
        if entry is None:
            raise web.HTTPError(404, f"{owner} has no queued request")
        self.write(json.dumps({"cancelled": entry["id"]}))


class StatusHandler(_SpotHandler):
    @needs_scope("read:servers")
    def get(self, user_name: str) -> None:
        owner = owner_key(user_name, self.get_argument("server", ""))
        self.write(json.dumps(self.market.status_json(owner)))


class PreemptionsHandler(_SpotHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        self.write(json.dumps({"preemptions": self.market.preemptions_json(self.viewer())}))


class SpotSettings(BaseModel):
    """What a user may set; unknown keys are refused with their name."""

    model_config = ConfigDict(extra="forbid")

    webhook_url: str | None = None
    checkpoint_command: str | None = None

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        u = urlparse(v)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"must be an http:// or https:// URL, not {v!r}")
        return v

    @field_validator("checkpoint_command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if len(v) > 4096 or "\0" in v:
            raise ValueError("must be a shell command of at most 4096 characters")
        return v


class SettingsHandler(_SpotHandler):
    @needs_scope(SETTINGS_SCOPE)
    def get(self, user_name: str) -> None:
        self.write(json.dumps(self.market.user_settings(user_name)))

    @needs_scope(SETTINGS_SCOPE)
    def put(self, user_name: str) -> None:
        body = self._json_body()
        try:
            settings = SpotSettings(**body)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(x) for x in err["loc"]) or "body"
            raise web.HTTPError(
                400,
                f"{field}: {err['msg']}; allowed fields: webhook_url, checkpoint_command",
            ) from None
        changes = {k: getattr(settings, k) for k in body}
        self.write(json.dumps(self.market.update_settings(user_name, changes)))


# ---- queued requests are not spawns ----------------------------------------------------------


def queue_instead_of_spawn(spawner: Any, raw_options: Any) -> dict[str, Any] | None:
    """Ask the market before a spawn begins. When it queues the request, return the queue entry
    (the caller answers "queued" and starts nothing); otherwise None: the spawn goes ahead, and
    the spawner asks the market again (a refusal, bad options and every start come from there).
    """
    pool = getattr(spawner, "pool", None)
    if pool is None or not hasattr(spawner, "owner"):
        return None  # not a gpulab spawner
    try:
        options = parse_options(raw_options or {}, pool.catalog)
    except OptionsError:
        return None
    market = SpotMarket.instance(config=spawner.config)
    try:
        market.admit(spawner, options)
    except MarketAnswer as e:
        if e.status != 202:
            return None
        entry = next(
            (q for q in market.queue_json() if f"{q['user']}/{q['server']}" == spawner.owner),
            None,
        )
        if entry is not None:
            entry["message"] = e.message
            market.log.info(
                "Queued %s for %s (no spawn started): %s", entry["id"], spawner.owner, e.message
            )
        return entry
    return None


def _idle_spawner(user: Any, server_name: str) -> Any:
    """The user's spawner for ``server_name`` when it exists and runs nothing, else None."""
    if user is None:
        return None
    spawner = user.spawners.get(server_name)
    if spawner is None and not server_name:
        spawner = user.spawner
    return spawner if spawner is not None and not spawner.active else None


class QueueAwareServerAPIHandler(UserServerAPIHandler):
    """``POST /hub/api/users/USER/server``: a queued request answers 202 with its queue entry."""

    @needs_scope("start:servers")
    async def post(self, user_name: str, server_name: str = "") -> None:
        spawner = _idle_spawner(self.find_user(user_name), server_name)
        if spawner is not None:
            body = self.get_server_json_body() or {}
            entry = queue_instead_of_spawn(spawner, body.get("user_options"))
            if entry is not None:
                self.set_status(202)
                self.finish(
                    json.dumps({"status": 202, "message": entry["message"], "queued": entry})
                )
                return
        await super().post(user_name, server_name)


class QueueAwareSpawnHandler(FastSpawnHandler):
    """The spawn page (with its direct redirect to a ready server), whose form POST shows a
    queued request in the form again (position, price, Cancel) instead of a failed spawn."""

    @needs_scope("servers")
    async def _post(self, user_name: str, server_name: str, display_name: str) -> None:
        user = self.current_user
        if user_name != user.name:
            user = self.find_user(user_name)
        spawner = _idle_spawner(user, server_name)
        if spawner is not None:
            form_options = {
                key: [b.decode("utf8") for b in values]
                for key, values in self.request.body_arguments.items()
            }
            try:
                options = await maybe_future(spawner.run_options_from_form(form_options))
            except Exception:
                options = None  # JupyterHub's own handling reports it
            if options is not None and queue_instead_of_spawn(spawner, options) is not None:
                # 303 to the form (which shows the queued request): answering the POST with the
                # page itself made a reload post the form again and queue a second request.
                self.redirect(self.request.path, status=303)
                return
        await super()._post(user_name, server_name, display_name)


def spot_handlers() -> list[tuple[str, type]]:
    return [
        # Before JupyterHub's own handlers of these URLs (the authenticator's come first). The
        # spawn page's routes are spawn_page_handlers(QueueAwareSpawnHandler).
        (r"/api/users/([^/]+)/server", QueueAwareServerAPIHandler),
        (r"/api/users/([^/]+)/servers/([^/]*)", QueueAwareServerAPIHandler),
        (r"/api/gpulab/spot/prices", PricesHandler),
        (r"/api/gpulab/spot/prices/([^/]+)", PinPriceHandler),
        (r"/api/gpulab/spot/queue", QueueHandler),
        (r"/api/gpulab/spot/queue/([^/]+)", QueueEntryHandler),
        (r"/api/gpulab/spot/status/([^/]+)", StatusHandler),
        (r"/api/gpulab/spot/preemptions", PreemptionsHandler),
        (r"/api/gpulab/spot/settings/([^/]+)", SettingsHandler),
    ]
