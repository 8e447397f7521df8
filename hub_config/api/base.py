"""What every gpulab API handler shares: the hub's GPU pool and spot market, found by config, and
JSON errors with two texts (``message`` for API clients, ``human`` for pages; see
:mod:`gpulab.hub_config.overrides.errors`)."""

from __future__ import annotations

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from gpulab.hub_config.overrides.errors import PlainErrors
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.pool import GpuPool


class GpulabAPIHandler(PlainErrors, APIHandler):
    @property
    def pool(self) -> GpuPool:
        return GpuPool.instance(config=self.settings["config"])

    @property
    def market(self) -> SpotMarket:
        return SpotMarket.instance(config=self.settings["config"])

    def viewer(self) -> str | None:
        """None for those who see everyone's records (admin:servers), else the user's name."""
        if self.has_scope("admin:servers"):
            return None
        user = self.current_user
        return user.name if getattr(user, "kind", "") == "user" else ""

    def json_object_body(self) -> dict:
        body = self.get_json_body()
        if not isinstance(body, dict):
            raise web.HTTPError(400, "body must be a JSON object")
        return body
