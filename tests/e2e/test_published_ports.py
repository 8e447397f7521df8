"""Published ports (issue 25: "a user may publish a port of their server under their own origin,
with the login required or, if the user chooses, public with a link secret; listed and
revocable"), against a real root hub, real local servers and a real web app in a user's server.

Attacks encoded: publishing a port the hub or another user's server listens on (409); another
user, an admin or a server's own token publishing or revoking NAME's ports (403); a public port
without its secret (404); a revoked port still answering; the hub's cookies or token reaching the
user's app; a publication that reaches another program once the owner's app has gone (checked at
connect time); the hub's own origin serving a user's port."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import requests
import websocket
from harness import PASSWORD, Hub, WebSession, approved_user, free_port, wait_for, write_in_home

from gpulab.hub_config.origin import user_label

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="local servers as users need root")

# A demo web app: answers every GET with what it was sent (path, cookies, who the hub says the
# visitor is), so tests see exactly what reaches a user's app.
ECHO_APP = """
import http.server, json, sys

# Cookies a hostile app sets (cookie tossing): for the hub's domain and paths, named like the
# hub's and the port proxy's own, nameless, and one of its own that should arrive scoped to its
# port.
TOSSED = [
    "_xsrf=tossed; Domain=localhost; Path=/hub/",
    "jupyterhub-hub-login=tossed; Domain=localhost; Path=/hub/",
    "jupyterhub-session-id=tossed; Path=/",
    "=jupyterhub-session-id=tossed; Path=/",
    "__Host-jupyterhub-session=tossed; Path=/; Secure",
    "gpulab-port-{port}=tossed; Path=/ports/{port}/",
    "elsewhere=tossed; Path=/hub/",
    "theme=dark; Path=/; Domain=localhost; HttpOnly; SameSite=Lax",
]


class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/set-cookies":
            self.send_response(204)
            for cookie in TOSSED:
                self.send_header("Set-Cookie", cookie.format(port=sys.argv[1]))
            self.send_header("Clear-Site-Data", '"cookies"')
            self.end_headers()
            return
        body = json.dumps({
            "app": sys.argv[2],
            "path": self.path,
            "cookie": self.headers.get("Cookie", ""),
            "authorization": self.headers.get("Authorization", ""),
            "user": self.headers.get("X-Gpulab-User", ""),
            "prefix": self.headers.get("X-Forwarded-Prefix", ""),
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""


def logged_in(hub: Hub, name: str) -> WebSession:
    web = WebSession(hub)
    assert web.login(name, PASSWORD)
    return web


def api(web: WebSession, method: str, path: str, **kw) -> requests.Response:
    """The hub's API with a browser session (cookie + XSRF header), as the home page calls it."""
    if not web.http.cookies.get("_xsrf"):
        web.get("/hub/home")
    headers = {"X-XSRFToken": web.http.cookies.get("_xsrf") or ""}
    return web.http.request(
        method, f"{web.hub.url}/hub/api/gpulab{path}", headers=headers, timeout=60, **kw
    )


def start_app(hub: Hub, name: str, port: int, tag: str) -> None:
    """Start the echo app in ``name``'s server (its account, its cgroup), listening on ``port``."""
    with hub.kernel(name) as k:
        home = k.execute("import os; print(os.getcwd())").strip()
        write_in_home(Path(home), "echo_app.py", ECHO_APP)
        k.execute(
            "import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, 'echo_app.py', '{port}', '{tag}'],"
            " start_new_session=True)"
        )
    wait_for(lambda: _answers(port), 30, what=f"{name}'s app on port {port}")


def _answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/", timeout=2).ok
    except requests.RequestException:
        return False


def port_url(hub: Hub, name: str, port: int) -> str:
    return f"http://{user_label(name)}.localhost:{hub.port}/ports/{port}/"


@pytest.fixture
def owner(hub: Hub):
    name = approved_user(hub, "pub")
    logged_in(hub, name)  # the hub knows a signed-up person once they have logged in
    hub.spawn_ready(name, {"gpu": "none"})
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


@pytest.fixture
def colleague(hub: Hub):
    name = approved_user(hub, "col")
    logged_in(hub, name)
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


def test_a_login_port_is_seen_by_any_logged_in_user_and_an_anonymous_visitor_logs_in_first(
    hub: Hub, owner: str, colleague: str
) -> None:
    """Issue 25, published ports with "the login required": the owner and another logged-in user
    see the app (which is told who they are, and is sent none of the hub's cookies); a visitor
    with no hub session is sent to the hub's login page; revoking ends it at once."""
    port = free_port()
    start_app(hub, owner, port, "demo")
    web = logged_in(hub, owner)
    r = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "login"})
    assert r.status_code == 201, r.text
    got = r.json()
    assert got["url"] == port_url(hub, owner, port) and got["access"] == "login"
    assert "secret" not in got
    listed = api(web, "GET", f"/users/{owner}/ports").json()["ports"]
    assert [(p["port"], p["access"]) for p in listed] == [(port, "login")]

    # Anonymous: sent to the hub, which asks them to log in; the app is never reached.
    anon = requests.get(got["url"], timeout=30)
    assert urlparse(anon.url).path == "/hub/login" and urlparse(anon.url).hostname == "localhost"
    assert "demo" not in anon.text

    # The owner and a colleague, each through the hub's login, see the app.
    for name in (owner, colleague):
        visitor = logged_in(hub, name)
        seen = visitor.http.get(got["url"] + "hello?x=1", timeout=30)
        assert seen.status_code == 200, (seen.status_code, seen.text[:300])
        echo = seen.json()
        assert echo["app"] == "demo" and echo["path"] == "/hello?x=1"
        assert echo["user"] == name and echo["prefix"] == f"/ports/{port}"
        # None of the hub's credentials reach the user's app (its session id is sent to every
        # NAME.localhost by the browser; the port's own cookie is the hub's, not the app's).
        assert "jupyterhub" not in echo["cookie"] and "gpulab-port" not in echo["cookie"]
        # The ticket and the hub's login cookie are not in the address the app saw.
        assert "_gpulab" not in echo["path"]

    # A visitor cannot pretend to be someone else to the app.
    spoof = visitor.http.get(got["url"], headers={"X-Gpulab-User": "admin"}, timeout=30)
    assert spoof.json()["user"] == colleague

    # Revoked: gone at once, for a visitor who holds a valid cookie too.
    assert api(web, "DELETE", f"/users/{owner}/ports/{port}").status_code == 204
    after = visitor.http.get(got["url"], timeout=30, allow_redirects=False)
    assert after.status_code == 404 and "demo" not in after.text
    assert api(web, "GET", f"/users/{owner}/ports").json()["ports"] == []


def test_a_public_port_needs_its_link_and_revoking_ends_it(hub: Hub, owner: str) -> None:
    """Issue 25, published ports "public with a link secret": anyone with the link sees the app
    (the secret becomes a cookie and leaves the address), without the secret nothing is there
    (404), and revoking ends it at once; publishing again makes a new link."""
    port = free_port()
    start_app(hub, owner, port, "public-demo")
    web = logged_in(hub, owner)
    got = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "public"}).json()
    secret = parse_qs(urlparse(got["url"]).query)["_gpulab_secret"][0]
    assert got["access"] == "public" and got["secret"] == secret and len(secret) >= 24

    bare = requests.get(port_url(hub, owner, port), timeout=30, allow_redirects=False)
    assert bare.status_code == 404 and "public-demo" not in bare.text
    # Another secret, one character off (a secret may itself start with "x": then "y").
    other = ("y" if secret[0] == "x" else "x") + secret[1:]
    wrong = requests.get(port_url(hub, owner, port) + "?_gpulab_secret=" + other, timeout=30)
    assert wrong.status_code == 404
    # a secret that is no ASCII is just as wrong (it made the comparison raise: a 500)
    odd = requests.get(port_url(hub, owner, port) + "?_gpulab_secret=%C3%A9", timeout=30)
    assert odd.status_code == 404, odd.status_code

    stranger = requests.Session()
    seen = stranger.get(got["url"], timeout=30)
    assert seen.status_code == 200 and seen.json()["app"] == "public-demo"
    assert seen.json()["path"] == "/" and seen.json()["user"] == ""
    # The cookie carries them on, with no secret in the address.
    again = stranger.get(port_url(hub, owner, port) + "page", timeout=30)
    assert again.status_code == 200 and again.json()["path"] == "/page"

    assert api(web, "DELETE", f"/users/{owner}/ports/{port}").status_code == 204
    assert stranger.get(port_url(hub, owner, port), timeout=30).status_code == 404
    assert requests.get(got["url"], timeout=30).status_code == 404

    # Published again: a new secret; the old link and cookie stay dead.
    new = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "public"})
    assert new.status_code == 201 and new.json()["secret"] != secret
    assert stranger.get(port_url(hub, owner, port), timeout=30).status_code == 404
    assert requests.get(got["url"], timeout=30).status_code == 404
    assert requests.get(new.json()["url"], timeout=30).json()["app"] == "public-demo"


def browser_path(path: str) -> str:
    """The path a browser asks for when sent to ``path`` (WHATWG URL: tabs and newlines dropped,
    backslashes are slashes, ``.``, ``..`` and their ``%2e`` spellings are resolved)."""
    path = re.sub(r"[\t\n\r]", "", path).replace("\\", "/")
    out: list[str] = []
    for segment in path.split("/")[1:]:
        dots = segment.lower().replace("%2e", ".")
        if dots == "..":
            if out:
                out.pop()
        elif dots != ".":
            out.append(segment)
    trailing = path.split("/")[-1].lower().replace("%2e", ".") in (".", "..")
    return "/" + "/".join(out) + ("/" if trailing and out else "")


def test_the_login_ticket_is_sent_to_the_ports_own_address_only(
    hub: Hub, owner: str, colleague: str
) -> None:
    """Issue 25, published ports with "the login required" (attack wave, F4): the hub's hop hands
    the visitor a one-time ticket on the owner's origin; a ``next`` that climbs out of
    ``/ports/PORT/`` (``..``, ``%2e%2e``, backslashes, ``//``, a tab inside the dots) must not
    steer the ticket to another path of that origin (such as the owner's own Jupyter server,
    which could read it from its address and redeem it): the ticket goes to the port's address
    only, and the visitor lands in the app. An ordinary ``next`` inside the port is kept. Nor
    may the app itself be handed a ticket (a visitor who already holds the port's cookie going
    through the hop again) or a stale one in its address."""
    port = free_port()
    start_app(hub, owner, port, "demo")
    web = logged_in(hub, owner)
    r = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "login"})
    assert r.status_code == 201, r.text
    got_url = r.json()["url"]
    visitor = logged_in(hub, colleague)
    root = f"/ports/{port}/"
    hop = f"{hub.url}/hub/gpulab/ports/login"

    def location(next_path: str) -> tuple[str, str, dict]:
        params = {"owner": owner, "port": port, "next": next_path}
        r = visitor.http.get(hop, params=params, allow_redirects=False, timeout=30)
        assert r.status_code == 302, (next_path, r.status_code, r.text[:300])
        where = urlparse(r.headers["Location"])
        assert where.hostname == f"{user_label(owner)}.localhost", r.headers["Location"]
        return where.path, where.query, parse_qs(where.query)

    for evil in [
        f"{root}../../user/{owner}/api",
        f"{root}%2e%2e/%2E%2e/user/{owner}/api",
        f"{root}.%2e/..%2F..%2Fuser/{owner}/api",
        f"{root}..\\..\\user/{owner}/api",
        f"{root}%5c..%5c..%5cuser/{owner}/api",
        f"{root}.\t./.\n./user/{owner}/api",
        f"{root}./../../hub/api/user",
        f"/ports/{port}//evil.example/..",
        f"/ports/{port}/x#/../../../user/{owner}/api",
    ]:
        path, query, args = location(evil)
        assert "_gpulab_ticket" in args, (evil, path, query)
        assert browser_path(path).startswith(root), (evil, path)
        for bad in ("..", "%2e", "%2E", "\\", "%5c", "%5C", "//", "#"):
            assert bad not in path, (evil, path)

    # An ordinary address inside the port is kept, query and all.
    path, query, args = location(f"{root}page/deep?x=1")
    assert path == f"{root}page/deep" and args["x"] == ["1"] and "_gpulab_ticket" in args

    # Followed the way a client does, the climbing ``next`` ends in the app, not in Jupyter.
    params = {"owner": owner, "port": port, "next": f"{root}../../user/{owner}/api"}
    landed = visitor.http.get(hop, params=params, timeout=30)
    assert landed.status_code == 200, (landed.url, landed.text[:300])
    assert landed.json()["app"] == "demo" and landed.json()["user"] == colleague
    assert "_gpulab" not in landed.url

    # Through the hop again, already holding the port's cookie: the ticket is used up by the
    # hub and taken out of the address, never handed to the app (the owner's code) to redeem.
    params = {"owner": owner, "port": port, "next": f"{root}again?y=2"}
    again = visitor.http.get(hop, params=params, timeout=30)
    assert again.status_code == 200 and again.json()["user"] == colleague, again.text[:300]
    assert again.json()["path"] == "/again?y=2" and "_gpulab" not in again.url
    stale = visitor.http.get(f"{got_url}again?_gpulab_ticket=old&_gpulab_secret=x", timeout=30)
    assert stale.status_code == 200 and stale.json()["path"] == "/again", stale.text[:300]


def test_an_apps_cookies_stay_on_its_own_port(hub: Hub, owner: str, colleague: str) -> None:
    """Issue 25, published ports (attack wave, F4: cookie tossing): the owner's app answers a
    visitor with ``Set-Cookie`` for the hub's domain and paths, named like the hub's session,
    login and XSRF cookies or the port's own cookie, nameless, and ``Clear-Site-Data``. None of
    it may reach the hub in the visitor's browser: every cookie that arrives has no ``Domain``
    and a ``Path`` below ``/ports/PORT/``, none is named like the hub's or the proxy's own, and
    the visitor stays logged in to the hub and let in to the port. The app's own cookie still
    arrives (scoped to its port)."""
    port = free_port()
    start_app(hub, owner, port, "cookies")
    web = logged_in(hub, owner)
    r = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "login"})
    assert r.status_code == 201, r.text
    visitor = logged_in(hub, colleague)
    assert visitor.http.get(r.json()["url"], timeout=30).json()["user"] == colleague

    tossed = visitor.http.get(r.json()["url"] + "set-cookies", timeout=30)
    assert tossed.status_code == 204, tossed.text[:300]
    assert "Clear-Site-Data" not in tossed.headers
    got = tossed.raw.headers.getlist("Set-Cookie")
    names = []
    for header in got:
        first, *attrs = [part.strip() for part in header.split(";")]
        name = first.split("=", 1)[0].strip()
        names.append(name)
        keys = {a.split("=", 1)[0].strip().lower(): a.partition("=")[2] for a in attrs}
        assert "domain" not in keys, header
        assert keys.get("path", "").startswith(f"/ports/{port}/"), header
        assert name and not name.lower().startswith(
            ("jupyterhub", "_xsrf", "gpulab-port", "__host")
        ), header
    assert names.count("theme") == 1 and names.count("elsewhere") == 1, got

    # What the visitor's cookie jar (which keeps Domain=localhost cookies, as browsers do on a
    # real parent domain) holds: nothing tossed outside the port, and the hub still knows them.
    for c in visitor.http.cookies:
        if c.value == "tossed" or c.name == "theme":
            assert c.path.startswith(f"/ports/{port}/") and c.domain.lstrip(".") != "localhost", c
    xsrf = [c.value for c in visitor.http.cookies if c.name == "_xsrf"]
    assert xsrf and "tossed" not in xsrf, xsrf
    me = visitor.http.get(f"{hub.url}/hub/api/user", headers={"X-XSRFToken": xsrf[0]}, timeout=30)
    assert me.status_code == 200 and me.json()["name"] == colleague, me.text[:300]
    again = visitor.http.get(r.json()["url"] + "after", timeout=30, allow_redirects=False)
    assert again.status_code == 200 and again.json()["user"] == colleague, again.text[:300]
    assert again.json()["cookie"] == "theme=dark", again.json()


def test_a_port_that_is_not_the_users_own_is_refused(hub: Hub, owner: str, colleague: str) -> None:
    """Issue 25 attacks: publishing the hub's port, or a port another user's server listens on,
    is refused (409 naming port), as are ports below 1024, the server's own port and bad input
    (400 naming the field); nothing is published by any of them."""
    web = logged_in(hub, owner)
    hub.spawn_ready(colleague, {"gpu": "none"})
    theirs = free_port()
    start_app(hub, colleague, theirs, "colleague-app")
    for port in (hub.hub_port, hub.port, hub.proxy_api_port, theirs):
        r = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "public"})
        assert r.status_code == 409, (port, r.status_code, r.text)
        assert r.json()["message"].startswith("port:"), r.text
    nothing = free_port()
    r = api(web, "POST", f"/users/{owner}/ports", json={"port": nothing, "access": "login"})
    assert r.status_code == 409 and "nothing listens" in r.json()["message"]

    own = server_port(hub, owner)
    for body, field in [
        ({"port": 22, "access": "login"}, "port"),
        ({"port": own, "access": "login"}, "port"),
        ({"port": "eighty", "access": "login"}, "port"),
        ({"port": 70000, "access": "login"}, "port"),
        ({"port": theirs, "access": "everyone"}, "access"),
    ]:
        r = api(web, "POST", f"/users/{owner}/ports", json=body)
        assert r.status_code == 400 and r.json()["message"].startswith(field + ":"), (body, r.text)
    assert api(web, "GET", f"/users/{owner}/ports").json()["ports"] == []
    # And nothing answers there for anyone.
    assert requests.get(port_url(hub, owner, theirs), timeout=30).status_code == 404


def server_port(hub: Hub, name: str) -> int:
    """The port ``name``'s single-user server itself listens on."""
    with hub.kernel(name) as k:
        code = "import os, urllib.parse as u; print(u.urlparse(os.environ['JUPYTERHUB_SERVICE_URL']).port)"
        return int(k.execute(code).strip())


def test_only_the_owner_publishes_or_revokes_their_ports(
    hub: Hub, owner: str, colleague: str
) -> None:
    """Issue 25 attack: another user, the hub's admin (token), and the owner's server's own token
    (which course staff reaching the server could read) cannot list, publish or revoke NAME's
    ports: 403, and nothing changes."""
    port = free_port()
    start_app(hub, owner, port, "mine")
    web = logged_in(hub, owner)
    assert api(web, "POST", f"/users/{owner}/ports", json={"port": port}).status_code == 201
    other = logged_in(hub, colleague)
    assert api(other, "GET", f"/users/{owner}/ports").status_code == 403
    assert api(other, "POST", f"/users/{owner}/ports", json={"port": port}).status_code == 403
    assert api(other, "DELETE", f"/users/{owner}/ports/{port}").status_code == 403
    admin = hub.api("DELETE", f"/gpulab/users/{owner}/ports/{port}")
    assert admin.status_code == 403
    with hub.kernel(owner) as k:
        token = k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
    server = hub.api("DELETE", f"/gpulab/users/{owner}/ports/{port}", token=token)
    assert server.status_code == 403
    published = hub.api("POST", f"/gpulab/users/{owner}/ports", token=token, json={"port": port})
    assert published.status_code == 403
    assert [p["port"] for p in api(web, "GET", f"/users/{owner}/ports").json()["ports"]] == [port]
    assert api(web, "DELETE", f"/users/{owner}/ports/{port}").status_code == 204


def test_a_publication_never_reaches_another_program_on_its_port(
    hub: Hub, owner: str, colleague: str
) -> None:
    """Issue 25 attack, checked at connect time: the owner's app stops and another user's server
    takes the same port; the owner's publication must not show the colleague's app (nor must the
    hub's own origin ever serve a user's port)."""
    port = free_port()
    start_app(hub, owner, port, "owner-app")
    web = logged_in(hub, owner)
    got = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "public"}).json()
    visitor = requests.Session()
    assert visitor.get(got["url"], timeout=30).json()["app"] == "owner-app"
    # The hub's own origin does not serve it.
    on_hub = requests.get(f"{hub.url}/ports/{port}/", timeout=30, allow_redirects=False)
    assert "owner-app" not in on_hub.text

    with hub.kernel(owner) as k:
        k.execute(f"import subprocess; subprocess.run(['pkill', '-f', 'echo_app.py {port}'])")
    wait_for(lambda: not _answers(port), 30, what="the owner's app to stop")
    hub.spawn_ready(colleague, {"gpu": "none"})
    start_app(hub, colleague, port, "colleague-app")
    assert requests.get(f"http://127.0.0.1:{port}/", timeout=5).json()["app"] == "colleague-app"
    r = visitor.get(port_url(hub, owner, port), timeout=30)
    assert r.status_code == 502 and "colleague-app" not in r.text


# A WebSocket app: says what cookies it was sent, then echoes.
WS_APP = """
import asyncio, sys
from tornado import web, websocket

class Echo(websocket.WebSocketHandler):
    def open(self):
        self.write_message("cookies:" + self.request.headers.get("Cookie", ""))

    def on_message(self, message):
        self.write_message("echo:" + message)

async def main():
    web.Application([(r"/ws", Echo)]).listen(int(sys.argv[1]), address="127.0.0.1")
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_websockets_pass_from_the_owners_origin_only(hub: Hub, owner: str) -> None:
    """Issue 25, published ports serving a live demo (WebSockets): a visitor with the link talks
    to the app both ways (and the app gets none of the hub's cookies); a WebSocket opened from
    another site's page, or without the link's cookie, is refused. Attack (fix wave, F5):
    "revocable" must hold for a WebSocket already open too: revoking a public or login port, or
    publishing it again (a new link), closes the open socket at once (it kept echoing)."""
    port = free_port()
    with hub.kernel(owner) as k:
        home = k.execute("import os; print(os.getcwd())").strip()
        write_in_home(Path(home), "ws_app.py", WS_APP)
        k.execute(
            "import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, 'ws_app.py', '{port}'], start_new_session=True)"
        )

    def listening() -> bool:
        try:
            websocket.create_connection(f"ws://127.0.0.1:{port}/ws", timeout=2).close()
            return True
        except (OSError, websocket.WebSocketException):
            return False

    wait_for(listening, 30, what="the WebSocket app")
    web = logged_in(hub, owner)
    got = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "public"}).json()
    visitor = requests.Session()
    assert visitor.get(got["url"], timeout=30).status_code == 404  # no page at /, but let in
    cookie = visitor.cookies.get(f"gpulab-port-{port}")
    assert cookie
    origin = f"http://{user_label(owner)}.localhost:{hub.port}"
    ws_url = origin.replace("http://", "ws://") + f"/ports/{port}/ws"
    ws = websocket.create_connection(
        ws_url, header=[f"Cookie: gpulab-port-{port}={cookie}"], origin=origin, timeout=30
    )
    try:
        first = ws.recv()
        assert first.startswith("cookies:") and "gpulab-port" not in first
        ws.send("ping")
        assert ws.recv() == "echo:ping"
    finally:
        ws.close()
    for header, origin_of in [
        ([f"Cookie: gpulab-port-{port}={cookie}"], f"http://evil.localhost:{hub.port}"),
        ([], origin),
    ]:
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(ws_url, header=header, origin=origin_of, timeout=30)
        assert refused.value.status_code in (403, 404)

    # Revoked or published again (a new publication id), public or login: a WebSocket already
    # open through the old publication is closed by the hub at once, not left talking to the app.
    for end in ("revoke", "republish", "login"):
        if end == "login":
            body = {"port": port, "access": "login"}
            assert api(web, "POST", f"/users/{owner}/ports", json=body).status_code == 201
            visitor = logged_in(hub, owner).http  # through the hub's hop, back with a ticket
            assert visitor.get(port_url(hub, owner, port), timeout=30).status_code == 404
        else:
            visitor = requests.Session()
            assert visitor.get(got["url"], timeout=30).status_code == 404  # let in, no page at /
        cookie = visitor.cookies.get(f"gpulab-port-{port}")
        header = [f"Cookie: gpulab-port-{port}={cookie}"]
        ws = websocket.create_connection(ws_url, header=header, origin=origin, timeout=30)
        try:
            assert ws.recv().startswith("cookies:")
            ws.send("before")
            assert ws.recv() == "echo:before"
            if end in ("revoke", "login"):
                assert api(web, "DELETE", f"/users/{owner}/ports/{port}").status_code == 204
            else:
                body = {"port": port, "access": "public"}
                got = api(web, "POST", f"/users/{owner}/ports", json=body).json()
            assert closed_by_the_hub(ws, within=10), f"{end}: the open WebSocket still echoes"
        finally:
            ws.close()
        if end == "revoke":
            body = {"port": port, "access": "public"}
            got = api(web, "POST", f"/users/{owner}/ports", json=body).json()


def closed_by_the_hub(ws: websocket.WebSocket, within: float) -> bool:
    """Whether the hub closes ``ws`` within ``within`` seconds (waits on the close frame, or
    the connection's end; a message the app still echoes means it is open)."""
    ws.settimeout(within)
    try:
        ws.send("after")
        return ws.recv() == ""  # websocket-client answers a close frame with ""
    except websocket.WebSocketTimeoutException:
        return False
    except (websocket.WebSocketConnectionClosedException, OSError):
        return True


def test_a_name_signed_up_again_does_not_inherit_the_old_accounts_publications(
    hub: Hub, owner: str
) -> None:
    """Issue 25 attack: a user publishes a port publicly, their account is deleted, and the name
    comes back as a new account whose app listens on the same port; the old link must not show
    the new person's app, and their list starts empty."""
    port = free_port()
    start_app(hub, owner, port, "old-account")
    web = logged_in(hub, owner)
    got = api(web, "POST", f"/users/{owner}/ports", json={"port": port, "access": "public"}).json()
    assert requests.get(got["url"], timeout=30).json()["app"] == "old-account"
    hub.stop_server(owner)
    assert hub.api("DELETE", f"/users/{owner}").status_code == 204
    hub.create_user(owner)
    hub.spawn_ready(owner, {"gpu": "none"})
    start_app(hub, owner, port, "new-account")
    r = requests.get(got["url"], timeout=30)
    assert r.status_code == 404 and "new-account" not in r.text
    token = hub.api("POST", f"/users/{owner}/tokens", json={"note": "t"}).json()["token"]
    listed = hub.api("GET", f"/gpulab/users/{owner}/ports", token=token)
    assert listed.status_code == 200 and listed.json()["ports"] == []
