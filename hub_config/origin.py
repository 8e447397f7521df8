"""User content never shares an origin with the hub.

A user controls everything their server serves (``/user/NAME/...``: files, apps, the server's
own pages). Served from the hub's origin, a page of theirs that a teacher or an admin opens runs
with the visitor's hub session: it reads the XSRF token from ``/hub/home`` and creates API
tokens in the visitor's name. So every user's server gets an origin of its own, JupyterHub's
``subdomain_host``: the hub at ``http://localhost:8000``, alice's server at
``http://alice.localhost:8000/user/alice/`` (Chromium and Firefox resolve ``*.localhost`` to
loopback; a production hub uses a wildcard DNS name and a wildcard TLS certificate, e.g.
``https://hub.example.org`` and ``https://alice.hub.example.org``). The hub's cookies are
host-only, so a user's origin never receives them, and the browser's same-origin policy keeps
that origin's scripts from reading the hub's pages.

Three more parts here:

- :func:`content_security_policy`: the hub's pages may run scripts from the hub alone, talk to
  the hub alone, be framed by nobody and submit forms only to the hub and users' servers
  (the log-in and OAuth forms redirect there).
- :class:`HostGuard`: the hub answers only under its own host name. A hub page reached under a
  user's host (``alice.localhost:8000/hub/login``: every host the proxy does not route goes to
  the hub) or under another name for the same address (``127.0.0.1:8000``) is redirected to the
  hub's own URL, so nobody logs in, and no hub cookie is set, on a user's origin.
- :func:`subdomain_hook`: services (billing) stay on the hub's host, where the hub's pages link
  to them and where servers and operators already reach them; only users get subdomains.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Any
from urllib.parse import urlparse

from jupyterhub.utils import subdomain_hook_idna
from tornado import web

# The paths under the hub's prefix that are not pages: API clients (tokens, never the hub's
# cookies), health checks and static files answer under any host name.
_NOT_PAGES = ("api", "health", "metrics", "static/", "security/csp-report")


def check_subdomain_host(value: str) -> str:
    """``http(s)://HOST[:PORT]`` with no path, or "" (off); anything else is an error."""
    value = value.strip().rstrip("/")
    if not value:
        return ""
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path:
        raise ValueError(
            f"GPULAB_SUBDOMAIN_HOST: {value!r}; expected http(s)://HOST[:PORT] with no path, "
            "whose subdomains (NAME.HOST) reach this hub's proxy, e.g. https://hub.example.org "
            "(wildcard DNS and certificate), http://localhost:8000, or 'none' for one origin"
        )
    if re.fullmatch(r"[0-9.]+|\[?[0-9a-fA-F:]+\]?", parsed.hostname):
        raise ValueError(
            f"GPULAB_SUBDOMAIN_HOST: {value!r}; an IP address has no subdomains: use a host "
            "name with wildcard DNS (e.g. https://hub.example.org) or http://localhost:PORT"
        )
    return value


def users_host(value: str, port: int) -> str:
    """The ``subdomain_host`` for a setting: "" (unset) is the embedded default, the hub at
    ``http://localhost:PORT`` and users at NAME.localhost; "none" turns it off ("")."""
    if value.strip().lower() == "none":
        return ""
    return check_subdomain_host(value) or f"http://localhost:{port}"


_PLAIN_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# Bits of SHA-256 in an escaped label: an origin is a security boundary, so two names must never
# share one. JupyterHub's 'idna' naming keeps 28 bits, which a laptop collides in seconds (a name
# with the victim's letters and the same 7 hex digits then gets the victim's origin).
_HASH_HEX = 32


def user_label(name: str) -> str:
    """The DNS label of ``name``'s origin, one per name.

    A name that is already a plain lowercase label without ``--`` is its own label; every other
    name (e-mail addresses, capitals, Unicode, ``--`` as in ``xn--``, too long) is escaped as
    ``u-LETTERS--HASH``, with 128 bits of SHA-256. Escaped labels always hold ``--`` and plain
    ones never do, so a name cannot be chosen to equal another's escaped label, and two escaped
    labels are equal only if SHA-256 collides in 128 bits."""
    if _PLAIN_LABEL.fullmatch(name) and "--" not in name:
        return name
    letters = re.sub(r"[^a-z0-9]", "", name.lower())[:20]
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    return f"u-{letters}--{digest}"


def subdomain_hook(name: str, domain: str, kind: str) -> str:
    """Users on ``LABEL.DOMAIN`` (:func:`user_label`); services on the hub's host."""
    if kind == "service":
        return domain
    if kind == "user":
        return f"{user_label(name)}.{domain}"
    return subdomain_hook_idna(name, domain, kind)


def content_security_policy(subdomain_host: str, base_url: str = "/") -> str:
    """The hub's Content-Security-Policy, for a hub whose users live on subdomains of its host.

    ``script-src`` keeps ``'unsafe-inline'``: JupyterHub's page template sets its page data in
    an inline script, different on every page. The origin split is what keeps users' scripts out.
    """
    parsed = urlparse(subdomain_host)
    port = f":{parsed.port}" if parsed.port else ""
    users = f"{parsed.scheme}://*.{parsed.hostname}{port}"
    report = base_url.rstrip("/") + "/hub/security/csp-report"
    return "; ".join(
        [
            "default-src 'self'",
            "script-src 'self' 'unsafe-inline'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "font-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'self'",
            "frame-ancestors 'self'",
            f"form-action 'self' {users}",
            f"report-uri {report}",
        ]
    )


def configure_origin(c: Any, subdomain_host: str) -> None:
    """Users' servers on subdomains of ``subdomain_host`` and the hub's CSP; "" leaves both off."""
    if not subdomain_host:
        return
    c.JupyterHub.subdomain_host = subdomain_host
    c.JupyterHub.subdomain_hook = subdomain_hook
    if urlparse(subdomain_host).scheme == "https":
        # Cookie tossing: a page on alice.hub.example.org may set cookies for the parent domain
        # hub.example.org, e.g. its owner's own login cookie, so that a visitor is logged in to
        # the hub as alice. A __Host- cookie cannot be set for another host. (Browsers keep a
        # cookie for Domain=localhost on localhost alone, so NAME.localhost cannot toss one;
        # __Host- needs https, which the embedded default has not.)
        c.JupyterHub.cookie_host_prefix_enabled = True
    base_url = c.JupyterHub.base_url if "base_url" in c.JupyterHub else "/"
    settings = dict(c.JupyterHub.tornado_settings) if "tornado_settings" in c.JupyterHub else {}
    headers = dict(settings.get("headers", {}))
    headers.setdefault("Content-Security-Policy", content_security_policy(subdomain_host, base_url))
    settings["headers"] = headers
    c.JupyterHub.tornado_settings = settings


def route_servers_to_services(c: Any) -> None:
    """Keep billing reachable where servers are told to find it through the proxy, and its
    OAuth redirect a path on the hub's host, as it was on one origin.

    With users on subdomains the proxy routes by host name, and billing's route is under the
    hub's host; a deployment whose servers reach billing through the proxy under another name
    (docker-compose: ``GPULAB_BILLING_SERVER_URL=http://proxy:8000/services/billing/``) gets a
    route for that name too (JupyterHub's ``Proxy.extra_routes``), to the same service.
    """
    if not ("subdomain_host" in c.JupyterHub and c.JupyterHub.subdomain_host):
        return
    env = dict(c.Spawner.environment) if "environment" in c.Spawner else {}
    services = [dict(s) for s in c.JupyterHub.services] if "services" in c.JupyterHub else []
    base_url = c.JupyterHub.base_url if "base_url" in c.JupyterHub else "/"
    for service in services:
        # An external service (billing's own container) on the hub's host keeps the OAuth
        # redirect it had on one origin, a path: it knows no public host to send another.
        # (The hub tells a service it starts its redirect, whole.)
        external = service.get("url") and not service.get("command")
        if external and "oauth_redirect_uri" not in service:
            name = service["name"]
            service["oauth_redirect_uri"] = f"{base_url.rstrip('/')}/services/{name}/oauth_callback"
    c.JupyterHub.services = services
    billing = next((s for s in services if s.get("name") == "billing" and s.get("url")), None)
    url = urlparse(env.get("GPULAB_BILLING_URL", ""))
    hub_host = urlparse(c.JupyterHub.subdomain_host).hostname
    if billing is None or not url.hostname or url.hostname == hub_host:
        return
    if url.netloc == urlparse(billing["url"]).netloc:
        return  # servers reach billing's own port, not the proxy
    routes = dict(c.Proxy.extra_routes) if "extra_routes" in c.Proxy else {}
    routes.setdefault(f"{url.hostname}{url.path.rstrip('/')}/", billing["url"])
    c.Proxy.extra_routes = routes


class HostGuard(web.RequestHandler):
    """A hub page asked for under another host name: go to the hub's own URL, or refuse."""

    def initialize(self, public_host: str) -> None:
        self.public_host = public_host

    def check_xsrf_cookie(self) -> None:
        """Nothing is accepted here: every write is refused, with the hub's URL (below)."""

    def get(self, *_: str) -> None:
        self.redirect(self.public_host + self.request.uri, permanent=False)

    head = get

    def post(self, *_: str) -> None:
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(
            f"Host: {self.request.host!r} is not this hub's; its pages are at {self.public_host}\n"
        )

    put = patch = delete = options = post


def host_guard_rules(app: Any) -> tuple[str, list[tuple[str, type, dict]]]:
    """The host pattern (any host name but the hub's) and the routes :class:`HostGuard` takes."""
    parsed = urlparse(app.subdomain_host)
    public_host = f"{parsed.scheme}://{parsed.netloc}"
    hub_prefix = re.escape(app.hub.base_url)  # e.g. /hub/
    not_pages = "|".join(re.escape(p) + r"(?:/|$)" for p in _NOT_PAGES)
    return (
        rf"^(?!{re.escape(parsed.hostname)}$).+$",
        [
            (rf"{hub_prefix}(?!{not_pages}).*", HostGuard, {"public_host": public_host}),
            # JupyterHub's own redirects from the root
            (re.escape(app.base_url), HostGuard, {"public_host": public_host}),
        ],
    )


def install_host_guard(app: Any) -> None:
    """Mount :class:`HostGuard` ahead of the hub's routes once the hub's Tornado app exists.

    JupyterHub asks for gpulab's routes (``attach``) just before it builds that app, in the same
    synchronous stretch of ``initialize``, and serves nothing before the next turn of the loop:
    the guard is in place before the first request.
    """
    if not app.subdomain_host:
        return

    def install() -> None:
        tornado_app = getattr(app, "tornado_application", None)
        if tornado_app is None:  # not built yet: try on the next turn
            asyncio.get_running_loop().call_soon(install)
            return
        pattern, rules = host_guard_rules(app)
        tornado_app.add_handlers(pattern, rules)

    asyncio.get_running_loop().call_soon(install)
