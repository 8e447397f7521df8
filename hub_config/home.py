"""The hub's home page: gpulab's front page in JupyterHub's own look.

JupyterHub renders ``home.html`` from gpulab's template folder (``c.JupyterHub.template_paths``),
which extends JupyterHub's ``page.html``; the page's script fills it from
``GET /hub/api/gpulab/users/NAME/home`` (:mod:`gpulab.hub_config.api.apps`) and launches apps
through the same API. What the page needs from billing comes through ``balance_hook``, so the
hub talks to billing over HTTP only.

The operator's page of the largest homes (:class:`StorageAdminPage`) lives here too: the home
page's storage card and it read the same storage API (:mod:`gpulab.hub_config.api.storage`).
"""

from __future__ import annotations

from pathlib import Path

from jupyterhub.handlers import BaseHandler
from jupyterhub.scopes import needs_scope
from tornado import web
from traitlets import Any as AnyTrait
from traitlets import Float, Unicode
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.scopes import READ_STORAGE_SCOPE

TEMPLATES = Path(__file__).with_name("templates")


class GpulabHome(SingletonConfigurable):
    """What the home page shows besides the hub's own state."""

    balance_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""An async callable(user_name) returning billing's balance record for that user
        (``balance``, ``currency``, ``burn_rate_per_hour``, ``time_left_seconds``, ``warnings``),
        or None to show no balance. gpulab's billing sets it.""",
    )

    statement_url = Unicode(
        "",
        config=True,
        help="""Where the user's statement page is (a path under the hub's base URL, e.g.
        /services/billing/). Empty: no statement link. gpulab's billing sets it.""",
    )

    reference_launch_seconds = Float(
        45.0,
        config=True,
        help="""The launch time the home page compares app launches with (seconds): the
        reference GPU cloud promises its Stable Diffusion WebUI within 45 s.""",
    )


class StorageAdminPage(BaseHandler):
    """``/hub/gpulab/storage``: the operator's view of the largest homes (user, used, quota, %,
    files, enforced, when measured). A thin page: its script reads ``GET /hub/api/storage``
    (:mod:`gpulab.hub_config.api.storage`), which measures in a thread and caches."""

    @web.authenticated
    @needs_scope(READ_STORAGE_SCOPE, "admin:users")
    async def get(self) -> None:
        html = await self.render_template("gpulab-storage-admin.html")
        self.finish(html)
