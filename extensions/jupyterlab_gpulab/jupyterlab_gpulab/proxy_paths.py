"""Keep ``%2F`` inside a path segment when jupyter-server-proxy forwards a request to an app.

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

_MARK = "_gpulab_keeps_encoded_slashes"


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
