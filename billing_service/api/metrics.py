"""``GET /metrics`` (at ``/services/billing/metrics`` through the proxy): billing's Prometheus
metrics (``metrics``), for a hub token holding ``read:metrics`` (the ``gpulab-prometheus``
service's, ``GPULAB_PROMETHEUS_TOKEN``) or an admin's, as JupyterHub guards its own
``/hub/metrics``. Everyone else, a user's or a server's token included, gets 403: the figures
name no one, but they are the operator's (revenue, how many accounts run dry)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from gpulab.billing_service.api.base import ADMIN_SCOPE, BaseHandler
from gpulab.billing_service.metrics import READ_SCOPE


class MetricsHandler(BaseHandler):
    async def get(self) -> None:
        model = self.require_login()
        if READ_SCOPE not in self.scopes() and not self.is_admin():
            raise web.HTTPError(
                403, "%s", f"{model['name']} lacks the {READ_SCOPE} (or {ADMIN_SCOPE}) scope"
            )
        metrics = self.billing.metrics
        await metrics.refresh()
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(metrics.registry))
