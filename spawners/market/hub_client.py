"""The one REST client the market uses: starting and stopping servers through the hub's API.

The market never calls a spawner's start or stop itself: it asks the hub, as an admin would,
with the ``gpulab-market`` service token, so JupyterHub's own bookkeeping (and billing's hooks)
see every start and stop the market makes.
"""

from __future__ import annotations

import json
import weakref
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.ioloop import IOLoop

# Starting a server can take as long as an image pull; the hub answers 202 well before that.
REQUEST_TIMEOUT = 120.0
# The hub calling its own API must not queue behind its other outbound calls on tornado's shared
# client (10 at a time): each start it asks for makes the hub ask billing for the balance, so a
# class of 40 starting at once filled all ten with self-calls whose balance checks then waited
# behind them until "Timeout in request queue". Self-calls get a client of their own per loop.
MAX_SELF_CALLS = 64
_clients: weakref.WeakKeyDictionary[IOLoop, AsyncHTTPClient] = weakref.WeakKeyDictionary()


def _client() -> AsyncHTTPClient:
    loop = IOLoop.current()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = AsyncHTTPClient(force_instance=True, max_clients=MAX_SELF_CALLS)
    return client


def server_path(user: str, server: str) -> str:
    """The REST path of ``user``'s server named ``server`` ("" for the default server)."""
    if server:
        return f"/users/{quote(user)}/servers/{quote(server)}"
    return f"/users/{quote(user)}/server"


class HubClient:
    """Calls to the hub's REST API at ``api_url`` with ``token``; answers are (code, body)."""

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url
        self.token = token

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        """One request; an HTTP error comes back as its code and body, never raised."""
        try:
            resp = await _client().fetch(
                self.api_url.rstrip("/") + path,
                method=method,
                headers={"Authorization": f"token {self.token}"},
                body=None if body is None else json.dumps(body),
                allow_nonstandard_methods=True,
                request_timeout=REQUEST_TIMEOUT,
            )
            return resp.code, resp.body.decode(errors="replace")
        except HTTPClientError as e:
            text = e.response.body.decode(errors="replace") if e.response is not None else str(e)
            return e.code, text

    async def start_server(self, owner: str, options: dict[str, Any]) -> tuple[int, str]:
        """Start ``owner``'s ("user/server") server with spawn ``options``."""
        user, _, server = owner.partition("/")
        return await self.request("POST", server_path(user, server), options)

    async def stop_server(self, owner: str) -> tuple[int, str]:
        """Stop ``owner``'s ("user/server") server."""
        user, _, server = owner.partition("/")
        return await self.request("DELETE", server_path(user, server))
