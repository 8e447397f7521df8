"""The spot market's JSON API on the hub.

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
- ``GET|PUT /hub/api/gpulab/spot/settings/USER``: the webhook URL, its HMAC secret and the
  checkpoint command (``custom:gpulab:spot-settings`` on that user: every user holds it for
  themself through their log-in session and the tokens they create, admins for everyone; a
  server's own token does not, so code in a notebook can neither read the secret that signs
  the webhooks nor redirect them).
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from urllib.parse import urlparse

from jupyterhub.scopes import needs_scope
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from tornado import web

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.scopes import READ_POOL_SCOPE, SET_PRICE_SCOPE, SETTINGS_SCOPE
from gpulab.spawners.market import views
from gpulab.spawners.node.allocator import owner_key


class PricesHandler(GpulabAPIHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        try:
            hours = float(self.get_argument("hours", "24"))
        except ValueError:
            hours = -1
        if not 0 < hours <= 24 * 31:
            raise web.HTTPError(400, "hours: must be a number of hours between 0 and 744")
        self.write(json.dumps(views.prices_json(self.market, hours)))


class PinPriceHandler(GpulabAPIHandler):
    @needs_scope(SET_PRICE_SCOPE)
    def put(self, slug: str) -> None:
        catalog = self.pool.catalog
        if slug not in catalog.gpu_types:
            raise web.HTTPError(
                404, f"unknown GPU type {slug!r}; allowed: {', '.join(catalog.gpu_types)}"
            )
        raw = self.json_object_body().get("price")
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


class QueueHandler(GpulabAPIHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        self.write(json.dumps({"queue": views.queue_json(self.market, self.viewer())}))


class QueueEntryHandler(GpulabAPIHandler):
    @needs_scope("servers")
    def delete(self, user_name: str) -> None:
        owner = owner_key(user_name, self.get_argument("server", ""))
        entry = self.market.cancel_queued(owner)
        if entry is None:
            raise web.HTTPError(404, f"{owner} has no queued request")
        self.write(json.dumps({"cancelled": entry["id"]}))


class StatusHandler(GpulabAPIHandler):
    @needs_scope("read:servers")
    def get(self, user_name: str) -> None:
        owner = owner_key(user_name, self.get_argument("server", ""))
        self.write(json.dumps(views.status_json(self.market, owner)))


class PreemptionsHandler(GpulabAPIHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        self.write(json.dumps({"preemptions": views.preemptions_json(self.market, self.viewer())}))


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


class SettingsHandler(GpulabAPIHandler):
    @needs_scope(SETTINGS_SCOPE)
    def get(self, user_name: str) -> None:
        self.write(json.dumps(self.market.settings.get(user_name)))

    @needs_scope(SETTINGS_SCOPE)
    def put(self, user_name: str) -> None:
        body = self.json_object_body()
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
        self.write(json.dumps(self.market.settings.update(user_name, changes)))


ROUTES = [
    (r"/api/gpulab/spot/prices", PricesHandler),
    (r"/api/gpulab/spot/prices/([^/]+)", PinPriceHandler),
    (r"/api/gpulab/spot/queue", QueueHandler),
    (r"/api/gpulab/spot/queue/([^/]+)", QueueEntryHandler),
    (r"/api/gpulab/spot/status/([^/]+)", StatusHandler),
    (r"/api/gpulab/spot/preemptions", PreemptionsHandler),
    (r"/api/gpulab/spot/settings/([^/]+)", SettingsHandler),
]
