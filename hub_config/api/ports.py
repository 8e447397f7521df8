"""Published ports: a user shows a web app of their server to others, on their own origin.

A user's server may run a demo web app on a port of its own (``python -m http.server 8080``).
jupyter-server-proxy already serves it at ``/user/NAME/proxy/8080/``, to the owner alone.
Publishing shares it, at ``http://NAME.HOST/ports/8080/`` (the user's origin, never the hub's:
see hub_config/origin.py):

- ``login``: any person logged in to this hub (the demo-to-colleagues case). The hub's cookies
  never reach a user's origin, so a visitor without a port cookie is sent to the hub
  (``/hub/gpulab/ports/login``), which, once they are logged in there, sends them back with a
  one-time ticket; the port's cookie (signed by the hub, HttpOnly, for that port's path alone)
  names them, and the app is told who they are (``X-Gpulab-User``).
- ``public``: anyone holding the link, whose secret (``?_gpulab_secret=``) becomes the port's
  cookie and is taken out of the address; without it the port answers 404.

The hub serves these addresses itself (:class:`PortProxy`, mounted for users' host names only):
every request looks up the publication as it is now (revoked: 404 at once; published again:
old links and cookies die, each publication has its own id) and connects only when every socket
listening on that port belongs to the owner's running server (spawners/node/sockets.py: a local
server shares the node's network, where the hub, billing, PostgreSQL and other users listen
too). What the user's app is sent has none of the hub's credentials: JupyterHub's cookies, the
port cookies and token ``Authorization`` headers are removed.

The API (``/hub/api/gpulab/users/NAME/ports``) is NAME's alone (``custom:gpulab:publish-ports``
``!user``, never a server's own token: course staff who reach a student's server could read it).
Publications are kept in ``DATA_DIR/ports.json`` (root, 0600, fsynced) across hub restarts.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import threading
import time
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlparse

from jupyterhub.handlers import BaseHandler
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.ioloop import PeriodicCallback
from tornado.websocket import (
    WebSocketClientConnection,
    WebSocketClosedError,
    WebSocketHandler,
    websocket_connect,
)
from traitlets import Float, Int
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.origin import user_label
from gpulab.hub_config.scopes import PUBLISH_PORTS_SCOPE
from gpulab.spawners.node import sockets
from gpulab.spawners.node.pool import GpuPool

ACCESS = ("login", "public")
SECRET_PARAM = "_gpulab_secret"
TICKET_PARAM = "_gpulab_ticket"
COOKIE_PREFIX = "gpulab-port-"
LOWEST_PORT = 1024
# Request headers never passed to a user's app: hop-by-hop ones, and who the visitor is (set
# here, from the hub's own knowledge).
_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "x-gpulab-user",
    "x-forwarded-prefix",
}

# Response headers an app's answer never passes on: ``Clear-Site-Data`` clears cookies of the
# whole registrable domain (the hub's log-in included); ``Set-Cookie2`` is an obsolete way round
# :func:`app_set_cookie`.
_APP_NEVER_SENDS = {"server", "clear-site-data", "set-cookie2"}


class PublishedPorts(SingletonConfigurable):
    """Settings of published ports."""

    max_ports = Int(
        10,
        config=True,
        help="""How many ports one user may publish at once; publishing one more is refused
        (409, naming ``port``) until they revoke one.""",
    )
    cookie_days = Float(
        1.0,
        config=True,
        help="""How long (days) a visitor's cookie for a published port lasts before they pass
        through the hub's login (``login`` ports) or need the link again (``public``) ports.
        Revoking a port ends every cookie for it at once, whatever this says.""",
    )
    ticket_seconds = Float(
        60.0,
        config=True,
        help="""How long the one-time ticket the hub hands a logged-in visitor, on their way back
        to a user's origin, stays valid (seconds).""",
    )
    max_body_mb = Int(
        100,
        config=True,
        help="""The largest request or response body (MB) passed through a published port.""",
    )
    recheck_seconds = Float(
        3.0,
        config=True,
        help="""How often (seconds) each open WebSocket of a published port checks its
        publication again (still the same one, its owner's server running, a ``login``
        visitor's account still there) and is closed when not. Revoking or publishing the port
        again through the API closes them at once; this catches any other change.""",
    )


class PortStore:
    """The publications, by user and port, kept in ``DATA_DIR/ports.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._written = 0
        self._seq = 0
        try:
            self.data: dict[str, dict[str, dict[str, Any]]] = json.loads(path.read_text())
        except FileNotFoundError:
            self.data = {}

    def of(self, user: str, account: str | None = None) -> dict[str, dict[str, Any]]:
        """``user``'s publications; with ``account`` (:func:`account_key`), only those made by
        that very account (a name deleted and signed up again does not inherit the old
        account's publications)."""
        found = self.data.get(user, {})
        if account is None:
            return found
        return {p: e for p, e in found.items() if e.get("account") == account}

    def get(self, user: str, port: int, account: str | None = None) -> dict[str, Any] | None:
        return self.of(user, account).get(str(port))

    def owner_of_label(self, label: str) -> str | None:
        """The user whose origin label is ``label`` and who publishes something."""
        return next((u for u in self.data if self.data[u] and user_label(u) == label), None)

    def put(self, user: str, port: int, access: str, account: str) -> dict[str, Any]:
        entry = {
            "account": account,
            "access": access,
            "id": secrets.token_hex(8),
            "created": time.time(),
            "secret": secrets.token_urlsafe(24) if access == "public" else None,
        }
        self.data.setdefault(user, {})[str(port)] = entry
        return entry

    def remove(self, user: str, port: int) -> bool:
        found = self.data.get(user, {}).pop(str(port), None) is not None
        if user in self.data and not self.data[user]:
            del self.data[user]
        return found

    async def save(self) -> None:
        """Write the state as it is now (root 0600, fsynced); a later save never loses to an
        earlier one that finishes after it."""
        self._seq += 1
        seq, text = self._seq, json.dumps(self.data, indent=1, sort_keys=True)
        await asyncio.to_thread(self._write, seq, text)

    def _write(self, seq: int, text: str) -> None:
        with self._lock:
            if seq < self._written:
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self._written = seq


_STORES: dict[str, PortStore] = {}
# Open WebSocket relays, by (owner, port): each is closed when its publication ends.
_RELAYS: dict[tuple[str, int], set[PortProxy]] = {}
# One-time tickets: ticket -> (visitor, owner, port, publication id, expiry).
_TICKETS: dict[str, tuple[str, str, int, str, float]] = {}


def account_key(user: Any) -> str:
    """One account for good: its id and when it was created (SQLite hands a deleted user's id
    to the next one)."""
    created = getattr(user, "created", None)
    return f"{user.id}:{created.isoformat() if created else ''}"


def store_of(config: Any) -> PortStore:
    data_dir = Path(GpuPool.instance(config=config).data_dir)
    key = str(data_dir)
    if key not in _STORES:
        _STORES[key] = PortStore(data_dir / "ports.json")
    return _STORES[key]


def port_url(user: Any, base_url: str, port: int, entry: dict[str, Any]) -> str:
    url = f"{user.host}{base_url.rstrip('/')}/ports/{port}/"
    if entry.get("secret"):
        url += "?" + urlencode({SECRET_PARAM: entry["secret"]})
    return url


def port_next(uri: str, prefix: str) -> str:
    """``uri`` (a path and query) when a browser sent there stays below ``prefix`` (the port's
    ``/ports/PORT/``), else ``prefix``: the visitor's one-time ticket is appended to it, and must
    never reach another path of the owner's origin (their own Jupyter server could read it from
    its address and redeem it). Any dot segment, empty segment (``//``), backslash or control
    character, in any percent-encoded spelling, or a raw space, non-ASCII character or fragment,
    sends the visitor to the port's root instead (browsers resolve ``%2e%2e`` and ``\\`` as ``..`` and ``/``, and drop
    tabs and newlines)."""
    if any(c in "\\#" or ord(c) < 0x21 or ord(c) >= 0x7F for c in uri):
        return prefix
    path, sep, query = uri.partition("?")
    if not path.startswith(prefix):
        return prefix
    decoded = path
    for _ in range(4):
        once = unquote(decoded)
        if once == decoded:
            break
        decoded = once
    else:
        return prefix  # still percent-encoded after four rounds: nothing a real app sends
    if any(c == "\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in decoded):
        return prefix
    segments = decoded[len(prefix) :].split("/")
    if any(s in (".", "..") for s in segments) or "" in segments[:-1]:
        return prefix
    return path + sep + query


def app_set_cookie(header: str, prefix: str) -> str | None:
    """An app's ``Set-Cookie`` as the visitor's browser gets it, or None (dropped): the app is
    the user's code, and must not toss cookies at the hub (``Domain`` for the parent domain,
    ``Path=/hub/``) or at the ports' own. ``Domain`` is removed (host-only: the owner's origin
    alone); ``Path`` is kept when it is below ``prefix`` (``/ports/PORT``), else taken as the
    app's own root-relative path and moved below it; cookies named like the hub's
    (``jupyterhub*``, ``_xsrf``), the ports' (``gpulab-port-``), ``__Host-`` ones (which need
    ``Path=/``) and nameless ones (a browser sends ``=a=b`` as ``a=b``) are dropped."""
    first, *attrs = header.split(";")
    name, eq, _value = first.partition("=")
    name = name.strip()
    reserved = ("jupyterhub", "_xsrf", COOKIE_PREFIX, "__host-")
    if not eq or not name or name.lower().startswith(reserved):
        return None
    path = ""
    kept = []
    for attr in attrs:
        key, _, value = attr.partition("=")
        key = key.strip().lower()
        if key == "path":
            path = value.strip()
        elif key != "domain" and attr.strip():
            kept.append(attr.strip())
    root = prefix + "/"
    if not path.startswith("/") or (path != "/" and port_next(path, "/") == "/"):
        path = root  # none, relative, or with dot segments, ``//`` or odd characters
    elif not (path == prefix or path.startswith(root)):
        path = prefix + path
    return "; ".join([first.strip(), f"Path={path}", *kept])


def ownership_problem(spawner: Any, port: int) -> str:
    """Why ``port`` is not the running server's own ("" when it is). Blocking: reads /proc."""
    sandbox = getattr(spawner, "sandbox", None)
    if sandbox is None:
        return "published ports are served for servers of the local spawner only on this hub"
    pids = sandbox.pids(spawner.pid)
    if not sockets.listeners_on(port):
        return f"nothing listens on port {port}: start your app on it first"
    if not sockets.listener_owned_by(port, pids):
        return f"port {port} is not your server's (another program on this node listens on it)"
    return ""


def end_relays(owner: str, port: int, keep: str | None = None) -> int:
    """Close every open WebSocket through ``owner``'s ``port`` but those of publication ``keep``
    (revoked: none kept; published again: the new one's). How many were closed."""
    ended = [r for r in _RELAYS.get((owner, port), set()) if r.publication != keep]
    for relay in ended:
        relay.end("the port's publication ended")
    return len(ended)


def running_spawner(user: Any) -> Any:
    spawner = user.spawners.get("") if user is not None else None
    return spawner if spawner is not None and spawner.ready else None


# ---- the API ------------------------------------------------------------------------------------


def owner_or_403(handler: GpulabAPIHandler, user_name: str) -> Any:
    """NAME's user when NAME is the one asking (an admin's token or session is not NAME)."""
    user = handler.find_user(user_name)
    me = handler.current_user
    if (
        user is None
        or getattr(me, "name", None) != user_name
        or me.kind != "user"
        # a server's own token is NAME's too, but does not hold the scope
        or not handler.has_scope(f"{PUBLISH_PORTS_SCOPE}!user={user_name}")
    ):
        raise web.HTTPError(403, f"only {user_name} may manage their published ports")
    return user


class PortsHandler(GpulabAPIHandler):
    """List and publish NAME's ports."""

    def _entry(self, user: Any, port: int, entry: dict[str, Any]) -> dict[str, Any]:
        out = {
            "port": port,
            "access": entry["access"],
            "url": port_url(user, self.base_url, port, entry),
        }
        if entry.get("secret"):
            out["secret"] = entry["secret"]
        return out

    def get(self, user_name: str) -> None:
        user = owner_or_403(self, user_name)
        store = store_of(self.settings["config"])
        ports = sorted(store.of(user_name, account_key(user)).items(), key=lambda kv: int(kv[0]))
        self.finish(
            {
                "ports": [self._entry(user, int(p), e) for p, e in ports],
                "enabled": bool(self.settings.get("subdomain_host")),
                "max_ports": PublishedPorts.instance(config=self.settings["config"]).max_ports,
            }
        )

    async def post(self, user_name: str) -> None:
        user = owner_or_403(self, user_name)
        body = self.json_object_body()
        port, access = body.get("port"), body.get("access", "login")
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise web.HTTPError(400, f"port: a TCP port number {LOWEST_PORT}-65535, not {port!r}")
        if port < LOWEST_PORT:
            raise web.HTTPError(400, f"port: {port} is below {LOWEST_PORT} (the node's services)")
        if access not in ACCESS:
            raise web.HTTPError(400, f"access: one of {', '.join(ACCESS)}, not {access!r}")
        if not self.settings.get("subdomain_host"):
            raise web.HTTPError(
                409,
                "port: publishing needs users' servers on origins of their own "
                "(GPULAB_SUBDOMAIN_HOST); this hub serves them on its own origin",
            )
        spawner = running_spawner(user)
        if spawner is None:
            raise web.HTTPError(409, "port: your server is not running; start it first")
        if spawner.server is not None and port == spawner.server.port:
            raise web.HTTPError(400, f"port: {port} is your server's own (Jupyter) port")
        store = store_of(self.settings["config"])
        limit = PublishedPorts.instance(config=self.settings["config"]).max_ports
        mine = store.of(user_name, account_key(user))
        if str(port) not in mine and len(mine) >= limit:
            raise web.HTTPError(409, f"port: at most {limit} published ports; revoke one first")
        problem = await asyncio.to_thread(ownership_problem, spawner, port)
        if problem:
            raise web.HTTPError(409, f"port: {problem}")
        entry = store.put(user_name, port, access, account_key(user))
        end_relays(user_name, port, keep=entry["id"])  # the old publication's links are dead
        await store.save()
        self.log.info("%s published port %s (%s)", user_name, port, access)
        self.set_status(201)
        self.finish(self._entry(user, port, entry))


class PortHandler(GpulabAPIHandler):
    """Revoke one of NAME's published ports: from the next request on, it is gone."""

    async def delete(self, user_name: str, port: str) -> None:
        user = owner_or_403(self, user_name)
        store = store_of(self.settings["config"])
        if store.get(user_name, int(port), account_key(user)) is None:
            raise web.HTTPError(404, f"port: {port} is not published")
        if not store.remove(user_name, int(port)):
            raise web.HTTPError(404, f"port: {port} is not published")
        end_relays(user_name, int(port))  # open WebSockets end with it, at once
        await store.save()
        self.log.info("%s revoked port %s", user_name, port)
        self.set_status(204)
        self.finish()


class PortsLoginPage(BaseHandler):
    """On the hub's origin: a logged-in visitor of a ``login`` port is sent back to it with a
    one-time ticket (the hub's cookies never reach users' origins)."""

    @web.authenticated
    def get(self) -> None:
        owner = self.get_argument("owner", "")
        port = self.get_argument("port", "")
        path = self.get_argument("next", "")
        store = store_of(self.settings["config"])
        entry = store.get(owner, int(port)) if port.isdigit() else None
        user = self.find_user(owner) if entry else None
        if user is not None and entry.get("account") != account_key(user):
            user = None  # a name signed up again: the old account's publication is not its
        if entry is None or user is None or entry["access"] != "login":
            raise web.HTTPError(404, "that port is not published")
        # Back to that port's own address on the owner's origin, nowhere else.
        path = port_next(path, f"{self.base_url.rstrip('/')}/ports/{port}/")
        ticket = secrets.token_urlsafe(24)
        ttl = PublishedPorts.instance(config=self.settings["config"]).ticket_seconds
        _TICKETS[ticket] = (
            self.current_user.name,
            owner,
            int(port),
            entry["id"],
            time.time() + ttl,
        )
        for t in [t for t, v in _TICKETS.items() if v[4] < time.time()]:
            _TICKETS.pop(t, None)
        sep = "&" if "?" in path else "?"
        self.redirect(f"{user.host}{path}{sep}{urlencode({TICKET_PARAM: ticket})}")


# ---- serving a published port, on its owner's origin ---------------------------------------------


class PortProxy(WebSocketHandler):
    """``http://LABEL.HOST/ports/PORT/...``: the publication as it is now, then the owner's port
    (HTTP, and WebSockets from the user's own origin)."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    upstream: WebSocketClientConnection | None = None
    publication: str | None = None  # the id of the publication an open relay belongs to
    _key: tuple[str, int] | None = None
    _visitor_name: str | None = None
    _recheck: PeriodicCallback | None = None

    def check_xsrf_cookie(self) -> None:
        """The app's own business; the port cookies are SameSite=Lax."""

    def _plain(self, status: int, text: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(text + "\n")

    def _visitor(self, owner: str, port: int, entry: dict[str, Any]) -> str | None:
        """Who the port cookie names, if it is for this publication."""
        days = PublishedPorts.instance(config=self.settings["config"]).cookie_days
        raw = self.get_signed_cookie(COOKIE_PREFIX + str(port), max_age_days=days)
        if raw is None:
            return None
        try:
            got = json.loads(raw)
        except ValueError:
            return None
        if got.get("owner") != owner or got.get("id") != entry["id"]:
            return None
        return got.get("visitor")

    def _let_in(self, owner: str, port: int, entry: dict[str, Any], visitor: str) -> None:
        """Set the port's cookie and go to the same address without the secret or ticket."""
        days = PublishedPorts.instance(config=self.settings["config"]).cookie_days
        value = json.dumps({"owner": owner, "id": entry["id"], "visitor": visitor})
        self.set_signed_cookie(
            COOKIE_PREFIX + str(port),
            value,
            expires_days=days,
            path=f"{self.settings['base_url'].rstrip('/')}/ports/{port}/",
            httponly=True,
            samesite="Lax",
            secure=self.request.protocol == "https",
        )
        query = [(k, v) for k, v in parse_qsl(self.request.query, keep_blank_values=True)]
        query = [(k, v) for k, v in query if k not in (SECRET_PARAM, TICKET_PARAM)]
        self.redirect(self.request.path + ("?" + urlencode(query) if query else ""))

    async def _handle(self, port_text: str, _rest: str | None = None) -> None:
        self.set_header("Referrer-Policy", "no-referrer")
        host = (self.request.host or "").rsplit(":", 1)[0].lower()
        hub_host = (urlparse(self.settings.get("subdomain_host") or "").hostname or "").lower()
        label, _, domain = host.partition(".")
        store = store_of(self.settings["config"])
        owner = store.owner_of_label(label) if domain == hub_host and hub_host else None
        port = int(port_text)
        entry = store.get(owner, port) if owner else None
        if entry is None:
            return self._plain(404, "Nothing is published here.")
        visitor = self._visitor(owner, port, entry)
        # A good secret or ticket in the address is used here and taken out of it, whether or
        # not the visitor already holds the port's cookie: the app (the owner's code) never sees
        # one (:meth:`_app_uri` drops any other).
        if entry["access"] == "public":
            given = self.get_query_argument(SECRET_PARAM, "").encode()
            if given and secrets.compare_digest(given, entry["secret"].encode()):
                return self._let_in(owner, port, entry, "")
            if visitor is None:
                return self._plain(404, "Nothing is published here (a public port needs its link).")
        if entry["access"] == "login":
            ticket = self.get_query_argument(TICKET_PARAM, "")
            got = _TICKETS.pop(ticket, None) if ticket else None
            if got and got[1:4] == (owner, port, entry["id"]) and got[4] > time.time():
                return self._let_in(owner, port, entry, got[0])
        if entry["access"] == "login" and not visitor:
            if self.request.method not in ("GET", "HEAD"):
                return self._plain(403, "Log in to the hub first.")
            hub = self.settings["subdomain_host"].rstrip("/")
            hub_base = self.settings["hub"].base_url
            query = urlencode({"owner": owner, "port": port, "next": self.request.uri})
            return self.redirect(f"{hub}{hub_base}gpulab/ports/login?{query}")
        users = self.settings["users"]
        if entry["access"] == "login" and users.get(visitor) is None:
            return self._plain(403, "Your hub account is gone.")
        owner_user = users.get(owner)
        if owner_user is None or entry.get("account") != account_key(owner_user):
            return self._plain(404, "Nothing is published here.")
        spawner = running_spawner(owner_user)
        if spawner is None:
            return self._plain(502, f"{owner}'s server is not running.")
        problem = await asyncio.to_thread(ownership_problem, spawner, port)
        address = await asyncio.to_thread(sockets.loopback_address, port)
        if problem or address is None:
            return self._plain(502, f"Port {port} of {owner}'s server is not serving.")
        self._key, self.publication, self._visitor_name = (owner, port), entry["id"], visitor
        if self.request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(address, port, visitor or "", port_text, _rest)
        await self._forward(address, port, visitor or "")

    def _still_published(self) -> bool:
        """Whether the publication this request came through is still the port's, its owner's
        server still running and a ``login`` visitor's account still there."""
        if self._key is None:
            return False
        owner, port = self._key
        entry = store_of(self.settings["config"]).get(owner, port)
        users = self.settings["users"]
        owner_user = users.get(owner)
        return (
            entry is not None
            and entry["id"] == self.publication
            and owner_user is not None
            and entry.get("account") == account_key(owner_user)
            and running_spawner(owner_user) is not None
            and (entry["access"] != "login" or users.get(self._visitor_name) is not None)
        )

    def end(self, reason: str) -> None:
        """Close this relay both ways (its publication ended)."""
        self._forget()
        if self.ws_connection is not None:
            self.close(1008, reason)
        self.on_close()

    def _check_again(self) -> None:
        if not self._still_published():
            self.end("the port's publication ended")

    def _forget(self) -> None:
        if self._recheck is not None:
            self._recheck.stop()
            self._recheck = None
        relays = _RELAYS.get(self._key) if self._key else None
        if relays is not None:
            relays.discard(self)
            if not relays:
                _RELAYS.pop(self._key, None)

    def _app_headers(self, port: int, visitor: str) -> dict[str, str]:
        """The visitor's request headers as the app gets them: none of the hub's credentials."""
        headers: dict[str, str] = {}
        for name, value in self.request.headers.get_all():
            lower = name.lower()
            if lower in _HOP:
                continue
            if lower == "cookie":
                value = _app_cookies(value)
                if not value:
                    continue
            if lower == "authorization" and value.split(" ")[0].lower() in ("token", "bearer"):
                continue
            headers[name] = value if name not in headers else headers[name] + ", " + value
        if visitor:
            headers["X-Gpulab-User"] = visitor
        headers["X-Forwarded-Prefix"] = self._prefix(port)
        return headers

    def _prefix(self, port: int) -> str:
        return f"{self.settings['base_url'].rstrip('/')}/ports/{port}"

    def _app_uri(self, port: int) -> str:
        """The request's path and query below the port's prefix: the app is served at its own
        root (as `python -m http.server` expects) and told where it is mounted."""
        prefix = self._prefix(port)
        uri = self.request.uri[len(prefix) :] if self.request.uri.startswith(prefix) else "/"
        path, _, query = uri.partition("?")
        if SECRET_PARAM in query or TICKET_PARAM in query:  # a stale or wrong one: not the app's
            own = (SECRET_PARAM, TICKET_PARAM)
            kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in own]
            uri = path + ("?" + urlencode(kept) if kept else "")
        return uri if uri.startswith("/") else "/" + uri

    async def _forward(self, address: str, port: int, visitor: str) -> None:
        headers = self._app_headers(port, visitor)
        uri = self._app_uri(port)
        host = f"[{address}]" if ":" in address else address
        limit = PublishedPorts.instance(config=self.settings["config"]).max_body_mb * 1024 * 1024
        with_body = ("POST", "PUT", "PATCH", "DELETE")
        body = self.request.body if self.request.method in with_body else None
        request = HTTPRequest(
            f"http://{host}:{port}{uri}",
            method=self.request.method,
            headers=headers,
            body=body,
            follow_redirects=False,
            decompress_response=False,
            request_timeout=300,
            allow_nonstandard_methods=True,
        )
        client = AsyncHTTPClient(max_body_size=limit)
        try:
            response = await client.fetch(request, raise_error=False)
        except Exception as e:  # connection refused, reset, too large
            return self._plain(502, f"Port {port} did not answer: {e}")
        if response.code == 599:
            return self._plain(502, f"Port {port} did not answer: {response.error}")
        if not self._still_published():  # revoked or replaced while the app was answering
            return self._plain(404, "Nothing is published here.")
        self.set_status(response.code, response.reason)
        self.clear_header("Content-Type")
        for name, value in response.headers.get_all():
            if name.lower() in _HOP or name.lower() in _APP_NEVER_SENDS:
                continue
            if name.lower() == "set-cookie":
                cookie = app_set_cookie(value, self._prefix(port))
                if cookie is not None:
                    self.add_header(name, cookie)
            else:
                self.set_header(name, value)
        if response.body and self.request.method != "HEAD" and response.code not in (204, 304):
            self.write(response.body)
        self.finish()

    # ---- WebSockets: the handshake is checked like any request, then both ways are relayed ----

    def check_origin(self, origin: str) -> bool:
        """Only pages of the owner's own origin (another site's page would ride the visitor's
        port cookie; SameSite=Lax already keeps it from being sent cross-site)."""
        parsed = urlparse(origin)
        return (
            f"{parsed.scheme}://{parsed.netloc}" == f"{self.request.protocol}://{self.request.host}"
        )

    async def _websocket(
        self, address: str, port: int, visitor: str, port_text: str, rest: str | None
    ) -> None:
        origin = self.request.headers.get("Origin")
        if origin is not None and not self.check_origin(origin):
            return self._plain(403, "A WebSocket of this port opens from its own pages only.")
        headers = self._app_headers(port, visitor)
        for name in [h for h in headers if h.lower().startswith("sec-websocket-")]:
            del headers[name]
        protocols = self.request.headers.get("Sec-WebSocket-Protocol", "")
        host = f"[{address}]" if ":" in address else address
        try:
            self.upstream = await websocket_connect(
                HTTPRequest(f"ws://{host}:{port}{self._app_uri(port)}", headers=headers),
                on_message_callback=self._from_app,
                subprotocols=[p.strip() for p in protocols.split(",") if p.strip()] or None,
            )
        except Exception as e:
            return self._plain(502, f"Port {port} did not take the WebSocket: {e}")
        await WebSocketHandler.get(self, port_text, rest)

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        return self.upstream.selected_subprotocol if self.upstream is not None else None

    async def on_message(self, message: str | bytes) -> None:
        if self.upstream is not None:
            try:
                await self.upstream.write_message(message, binary=isinstance(message, bytes))
            except WebSocketClosedError:
                self.close()

    def _from_app(self, message: str | bytes | None) -> None:
        if self.ws_connection is None or not getattr(self, "_opened", False):
            # the app spoke before the visitor's handshake finished: kept for open()
            self.__dict__.setdefault("_early", []).append(message)
            return
        if message is None:
            self.close()
            return
        try:
            self.write_message(message, binary=isinstance(message, bytes))
        except WebSocketClosedError:
            self.on_close()

    def open(self, *args: str) -> None:
        self._opened = True
        if not self._still_published():  # revoked during the handshake
            return self.end("the port's publication ended")
        _RELAYS.setdefault(self._key, set()).add(self)
        every = PublishedPorts.instance(config=self.settings["config"]).recheck_seconds
        self._recheck = PeriodicCallback(self._check_again, every * 1000)
        self._recheck.start()
        for message in self.__dict__.pop("_early", []):
            self._from_app(message)

    def on_close(self) -> None:
        self._forget()
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    async def get(self, *args: str) -> None:
        await self._handle(*args)

    head = post = put = patch = delete = options = _handle  # type: ignore[assignment]


def _app_cookies(header: str) -> str:
    """The Cookie header without the hub's and the ports' own cookies (the app's alone)."""
    jar = SimpleCookie()
    try:
        jar.load(header)
    except Exception:
        return ""
    keep = [
        f"{k}={m.coded_value}"
        for k, m in jar.items()
        if not k.startswith(("jupyterhub-", COOKIE_PREFIX, "_xsrf", "__Host-jupyterhub"))
    ]
    return "; ".join(keep)


def install_proxy(app: Any) -> None:
    """Mount :class:`PortProxy` for users' host names (never the hub's own), once the hub's
    Tornado app exists (as hub_config/origin.py's host guard is mounted)."""
    if not app.subdomain_host:
        return
    hub_host = re.escape(urlparse(app.subdomain_host).hostname)
    pattern = rf"^[^.]+\.{hub_host}(:\d+)?$"
    rules = [(rf"{re.escape(app.base_url.rstrip('/'))}/ports/(\d+)(/.*)?", PortProxy)]

    def install() -> None:
        tornado_app = getattr(app, "tornado_application", None)
        if tornado_app is None:
            asyncio.get_running_loop().call_soon(install)
            return
        tornado_app.add_handlers(pattern, rules)

    asyncio.get_running_loop().call_soon(install)


ROUTES = [
    (r"/api/gpulab/users/([^/]+)/ports/?", PortsHandler),
    (r"/api/gpulab/users/([^/]+)/ports/(\d+)", PortHandler),
    (r"/gpulab/ports/login", PortsLoginPage),
]
