"""The operator's console page, ``/hub/gpulab/console``, in JupyterHub's own look.

An operator asks every morning which cards are busy and who holds them, which are held but idle,
what the platform earned and from whom, who waits in a queue and which starts were slow. The page
answers on one screen. It is thin: its script (``templates/gpulab-console.js``) reads the hub's
``GET /hub/api/gpulab/admin/console`` (:mod:`gpulab.hub_config.api.console`, built from the same
snapshot the Prometheus collector reads, so its numbers are the metrics' numbers) and billing's
``GET /services/billing/api/admin/revenue`` with the admin's own browser session (billing checks
the admin itself). A GET that changes nothing; admins only (``admin:users``, unfiltered: a course
teacher's group-filtered grants do not reach it).
"""

from __future__ import annotations

from jupyterhub.handlers import BaseHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.hub_config.home import GpulabHome

# The console's one scope: JupyterHub's admin role holds it unfiltered; course staff hold only
# group-filtered user scopes, which needs_scope without a resource never accepts.
CONSOLE_SCOPE = "admin:users"


class ConsolePage(BaseHandler):
    """``/hub/gpulab/console``: cards by node, utilisation over time, money, queues, spawns."""

    @web.authenticated
    @needs_scope(CONSOLE_SCOPE)
    async def get(self) -> None:
        home = GpulabHome.instance(config=self.settings["config"])
        html = await self.render_template(
            "gpulab-console.html",
            # Where billing answers (empty on a hub without billing: the money section says so).
            gpulab_billing_url=home.statement_url,
        )
        self.finish(html)
