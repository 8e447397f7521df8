"""Where the hub's own pages and assets are, so that the statement page looks like one of its pages.

JupyterHub (6.x) serves its Bootstrap 5 stylesheet, favicon, scripts and logo under its prefix
``{JUPYTERHUB_BASE_URL}hub/`` (``static/css/style.min.css``, ``logo`` …), on the same origin as
this service behind the proxy. The page links them there instead of carrying a style of its own:
it gets the hub's look, its light/dark theme and the operator's logo, and fetches nothing from
anywhere else. The prefix is ``HubAuth.hub_prefix``: JupyterHub's own reading of the service's
environment (``JUPYTERHUB_BASE_URL``, default ``/``), so no host is written here.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyterhub.utils import url_path_join


@dataclass(frozen=True)
class HubLinks:
    prefix: str  # the hub's prefix, e.g. "/hub/" (or "/jupyter/hub/" under a base URL)

    def _join(self, path: str) -> str:
        return url_path_join(self.prefix, path)

    # The hub's pages, as linked from its own navigation bar (templates/page.html).
    @property
    def home(self) -> str:
        return self._join("home")

    @property
    def token(self) -> str:
        return self._join("token")

    @property
    def admin(self) -> str:
        return self._join("admin")

    @property
    def signups(self) -> str:
        # gpulab's own entry for admins (hub_config/templates/page.html): sign-ups to approve.
        return self._join("authorize")

    @property
    def storage(self) -> str:
        # gpulab's own entry for admins (hub_config/templates/page.html): the largest homes.
        return self._join("gpulab/storage")

    @property
    def console(self) -> str:
        # gpulab's own entry for admins (hub_config/templates/page.html): the operator's console.
        return self._join("gpulab/console")

    @property
    def logout(self) -> str:
        return self._join("logout")

    @property
    def logo(self) -> str:
        return self._join("logo")

    # Its static files.
    @property
    def stylesheet(self) -> str:
        return self._join("static/css/style.min.css")

    @property
    def favicon(self) -> str:
        return self._join("static/favicon.ico")

    @property
    def bootstrap_js(self) -> str:
        # Only for the navigation bar's collapse button on narrow screens.
        return self._join("static/components/bootstrap/dist/js/bootstrap.bundle.min.js")

    @property
    def darkmode_js(self) -> str:
        # The hub's theme switch: the page follows the theme the user chose on the hub.
        return self._join("static/js/darkmode.js")
