"""Apps and models in a server: the jupyter-server-proxy entries and the read-only model store.

The hub, not the image, decides which apps a server offers: the catalog's apps that fit the
server's GPU and that this spawner can run there go to the server in its environment
(``GPULAB_APP_SERVERS``, JSON), which gpulab's launcher hands to jupyter-server-proxy
(:func:`gpulab.spawners.inside.launcher.configure_apps`). Each app is then served at ``/user/NAME/APP/``, behind the hub's login, and shows in JupyterLab's
launcher. Models of the catalog's store are mounted read-only at ``~/models/SLUG``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traitlets import HasTraits

from gpulab.catalog import App
from gpulab.spawners.inside.launcher import ENV_APP_SERVERS
from gpulab.spawners.options import app_gpu_types


def fill_placeholders(command: list[str], home: str, checkout: str | None = None) -> list[str]:
    """Fill gpulab's own placeholders; jupyter-server-proxy fills {port} and {base_url}."""
    models = f"{home.rstrip('/')}/models"
    out = [arg.replace("{home}", home.rstrip("/")).replace("{models}", models) for arg in command]
    return [arg.replace("{checkout}", checkout or "") for arg in out]


def checkout_problem(app: App) -> str:
    """Why a local command cannot run the operator's checkout of ``app`` ("" when it can, or
    when it runs none): the operator enables such an app by setting its ``local_checkout``."""
    if not app.uses_checkout:
        return ""
    if not app.local_checkout:
        return f"set local_checkout of [apps.{app.slug}] in the catalog to your checkout of it"
    if not Path(app.local_checkout).is_dir():
        return f"its local_checkout {app.local_checkout} is not a folder on this node"
    return ""


def server_proxy_entry(app: App, command: list[str], home: str) -> dict[str, Any]:
    """One ``c.ServerProxy.servers`` entry for ``app``."""
    entry: dict[str, Any] = {
        "command": fill_placeholders(command, home, app.local_checkout),
        "timeout": app.timeout,
        # The app gets the whole path (/user/NAME/APP/...), as its --subpath expects, unless it
        # links relatively and has no such option (code-server).
        "absolute_url": app.absolute_url,
        "launcher_entry": {"title": app.display_name, "enabled": True},
        "new_browser_tab": True,
    }
    if any("{unix_socket}" in arg for arg in command):
        # jupyter-server-proxy makes the socket's folder (mkdtemp: 0700, the server's user).
        entry["unix_socket"] = True
    return entry


class AppServersMixin(HasTraits):
    """Apps and models of a server; the concrete spawner says how it runs an app and where home
    is inside the server."""

    def app_command(self, app: App) -> list[str] | None:
        """The command that starts ``app`` in this spawner's servers, or None if it can't."""
        raise NotImplementedError

    def server_home(self) -> str:
        """The user's home as the server sees it."""
        raise NotImplementedError

    async def app_unavailable(self, app: App) -> str:
        """Why this spawner cannot run ``app`` on this node now ("" when it can)."""
        if app.is_server:
            return ""
        return "" if self.app_command(app) else "not installed for this spawner"

    def app_servers(self) -> dict[str, dict[str, Any]]:
        """The jupyter-server-proxy entries of the server being started."""
        opts = getattr(self, "gpulab_options", None)
        if opts is None:
            return {}
        catalog = self.pool.catalog  # type: ignore[attr-defined]
        out = {}
        for app in catalog.apps.values():
            # An app runs in its own image (the server's), on a GPU it fits.
            if app.is_server or app.image not in (None, opts.image):
                continue
            if opts.gpu not in app_gpu_types(app, catalog):
                continue
            command = self.app_command(app)
            if command:
                out[app.slug] = server_proxy_entry(app, command, self.server_home())
        return out

    def app_env(self) -> dict[str, str]:
        """The server's environment entry that lists its apps (none: no entry)."""
        servers = self.app_servers()
        return {ENV_APP_SERVERS: json.dumps(servers, separators=(",", ":"))} if servers else {}

    def model_sources(self) -> dict[str, Path]:
        """The catalog's models present on this node, by slug."""
        pool = self.pool  # type: ignore[attr-defined]
        out = {}
        for slug, model in pool.catalog.models.items():
            src = model.resolve_source(pool.data_dir)
            if src.is_dir():
                out[slug] = src
            else:
                self.log.debug("Model %s is not on this node (%s)", slug, src)  # type: ignore[attr-defined]
        return out
