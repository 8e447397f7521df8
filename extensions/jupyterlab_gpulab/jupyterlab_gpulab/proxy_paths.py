"""jupyter-server-proxy as gpulab runs it: app routes only, with their paths kept intact.

**No arbitrary ports.** jupyter-server-proxy also forwards ``/user/NAME/proxy/PORT/...`` (and
``/proxy/HOST:PORT/``, ``/proxy/absolute/...``) to any port on the server's machine, with no
option to turn that off. gpulab's apps have routes of their own (``/user/NAME/APP/``), so
:func:`no_arbitrary_ports` answers every ``proxy/`` path with 404 ahead of jupyter-server-proxy:
nothing on another local port (another account's service included) is reachable through a
server, and nothing a user serves that way gets a URL. (The user still controls their own
server; that its pages never share the hub's origin is the hub's defence, hub_config/origin.py.)

**Encoded slashes.** Keep ``%2F`` inside a path segment when jupyter-server-proxy forwards a
request to an app.

Tornado hands jupyter-server-proxy the proxied path already percent-decoded, and the proxy then
quotes it again with ``/`` marked safe, so ``/userdata/workflows%2Fa.json`` reaches the app as
``/userdata/workflows/a.json``: another URL. ComfyUI saves workflows under URLs like that one,
and they 404. jupyter-server-proxy (4.x) has no option for it, so for requests whose path holds
an encoded slash the client URI is built from the raw request path, which the browser sent and
the hub's proxy passed on unchanged. Every other request goes through jupyter-server-proxy's own
code.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

_MARK = "_gpulab_keeps_encoded_slashes"


class ProxyOff(JupyterHandler):
    """Every ``proxy/...`` path: 404, naming what is served instead."""

    def prepare(self) -> None:
        raise web.HTTPError(
            404,
            "proxy/PORT: this server forwards no arbitrary port; apps are at their own paths, "
            "e.g. /user/NAME/sd-webui/",
        )


def no_arbitrary_ports(web_app: Any) -> None:
    """Mount :class:`ProxyOff` ahead of every other route (jupyter-server-proxy's included)."""
    pattern = url_path_join(web_app.settings["base_url"], r"/proxy/.*")
    web_app.add_handlers(".*$", [(pattern, ProxyOff)])
    rules = web_app.default_router.rules
    # add_handlers puts a host rule just before the catch-all; move ours to the very front.
    rules.insert(0, rules.pop(len(rules) - 2))


def keep_encoded_slashes() -> bool:
    """Patch jupyter-server-proxy's client URI (once). False when it is not installed."""
    try:
        from jupyter_server_proxy.handlers import ProxyHandler
    except ImportError:
        return False
    original = ProxyHandler.get_client_uri
    if getattr(original, _MARK, False):
        return True

    def get_client_uri(self: Any, protocol: str, host: str, port: Any, proxied_path: str) -> str:
        raw = self.request.path  # as sent: still percent-encoded
        if "%2f" not in raw.lower():
            return original(self, protocol, host, port, proxied_path)
        context = self._get_context_path(host, port).rstrip("/")
        if not raw.startswith(context + "/") and raw != context:
            return original(self, protocol, host, port, proxied_path)
        path = raw if self.absolute_url else raw[len(context) :] or "/"
        uri = f"{protocol}://{host}:{port}{path}"
        if self.request.query:
            uri += "?" + self.request.query
        return uri

    setattr(get_client_uri, _MARK, True)
    ProxyHandler.get_client_uri = get_client_uri
    return True
