"""A user's page never runs on the hub's origin (hub_config/origin.py), in headless Chromium.

The attack (issue 20, attack 4): a student serves HTML from their own server; the teacher of
their course, who may open that server, follows the link; the page's script fetches
``/hub/home`` for the XSRF token, creates an API token in the teacher's name
(``POST /hub/api/users/TEACHER/tokens``) and reads ``/hub/api/user``. The student controls their
whole server, so the page comes from the server itself: a ``~/.jupyter`` config of theirs takes
the sandbox off Jupyter's ``/files/`` pages, and ``files/evil.html`` is the page.

On one origin (``GPULAB_SUBDOMAIN_HOST=none``, the old setup) the script gets the token; with
each user's server on NAME.localhost it gets nothing, and the admin API shows no token made;
cookies it sets for the parent domain (cookie tossing) never reach the hub.

Also: jupyter-server-proxy's generic ``/user/NAME/proxy/PORT/`` reaches no port, and the hub's
own pages (home, spawn form, course dashboard, admin, the statement link's target, JupyterLab)
load under the hub's Content-Security-Policy with no violation and no console error. The
screenshots go to $GPULAB_SCREENSHOTS (else the test's temp folder).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import requests
from course_helpers import make_course, roster, token_for
from harness import PASSWORD, SLOW, Hub, WebSession, approved_user, browser_log_in, wait_for

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")

# The student's server config: Jupyter serves /files/ pages in a CSP sandbox (an opaque origin);
# the student, who owns the server, takes that off.
UNSANDBOX = """\
from jupyter_server.base.handlers import AuthenticatedFileHandler
from jupyter_server.files.handlers import FilesHandler

for cls in (AuthenticatedFileHandler, FilesHandler):
    cls.content_security_policy = property(lambda self: "frame-ancestors 'self'")
"""

# What the student's page does in whoever's browser opens it. HUB: the hub's public URL.
EVIL = """\
<!doctype html><title>homework</title><p id="marker">My homework</p>
<script>
(async () => {
  const out = {ran: true, steps: {}};
  const teacher = TEACHER;
  for (const base of ["", HUB]) {
    const key = base ? "absolute" : "relative";
    const s = out.steps[key] = {};
    try {
      const home = await fetch(base + "/hub/home", {credentials: "include"});
      const text = await home.text();
      const m = text.match(/xsrf_token: "([^"]+)"/);
      s.home = home.status;
      s.xsrf = m ? m[1] : "";
    } catch (e) { s.home = "blocked: " + e; s.xsrf = ""; }
    try {
      const r = await fetch(base + "/hub/api/users/" + teacher + "/tokens", {
        method: "POST", credentials: "include",
        headers: {"Content-Type": "application/json", "X-XSRFToken": s.xsrf},
        body: JSON.stringify({note: "stolen", expires_in: 3600}),
      });
      s.token_status = r.status;
      s.token = r.ok ? (await r.json()).token || "" : "";
    } catch (e) { s.token_status = "blocked: " + e; s.token = ""; }
    try {
      const who = await fetch(base + "/hub/api/user", {credentials: "include"});
      s.user_status = who.status;
      s.user = who.ok ? (await who.json()).name || "" : "";
    } catch (e) { s.user_status = "blocked: " + e; s.user = ""; }
  }
  // Cookie tossing: cookies for the parent domain, to replace the hub's login and XSRF ones.
  for (const name of ["jupyterhub-hub-login", "_xsrf", "jupyterhub-session-id"]) {
    document.cookie = name + "=tossed; Domain=" + new URL(HUB).hostname + "; Path=/hub/";
  }
  window.__stolen = out;
})();
</script>
"""


def shot(page, name: str, tmp_path: Path) -> Path:
    folder = Path(SHOTS) if SHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"origin-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture(scope="module")
def ohub(module_hub_factory) -> Hub:
    return module_hub_factory("user-origin", simulate="RTX-4090:1")


def server_link(hub: Hub, name: str) -> str:
    """The server's URL as the hub hands it out (absolute on its own origin, or a path)."""
    return urljoin(hub.url + "/", hub.server(name)["url"])


def open_as(page, url: str) -> None:
    """Open ``url`` as a person would, approving the hub's OAuth prompt if it shows one."""
    page.goto(url, timeout=SLOW)
    if "/hub/api/oauth2/authorize" in page.url:
        page.locator("form input[type=submit], form button[type=submit]").first.click()
    page.wait_for_url(lambda u: "/oauth2/" not in u and "/hub/login" not in u, timeout=SLOW)


def test_a_students_page_cannot_act_as_their_teacher(ohub: Hub, browser, tmp_path) -> None:
    tag = uuid.uuid4().hex[:5]
    teacher = approved_user(ohub, "tch", PASSWORD)
    assert WebSession(ohub).login(teacher, PASSWORD)  # creates the hub user
    course, student = f"sec{tag}", f"stu{tag}"
    make_course(ohub, course, [teacher])
    r = roster(ohub, course, f"username,role\n{student},student\n", token_for(ohub, teacher))
    assert r.ok, r.text

    # The student sets their server up (as they may: it is theirs) and restarts it.
    ohub.spawn_ready(student, {"gpu": "none", "course": course})
    with ohub.kernel(student) as k:
        k.execute(
            "import os, pathlib\n"
            "home = pathlib.Path(os.environ['HOME'])\n"
            f"(home / '.jupyter').mkdir(exist_ok=True)\n"
            f"(home / '.jupyter' / 'jupyter_server_config.py').write_text({UNSANDBOX!r})\n"
            "page = " + repr(EVIL) + "\n"
            f"page = page.replace('HUB', {json.dumps(ohub.url)!r})"
            f".replace('TEACHER', {json.dumps(teacher)!r})\n"
            "(home / 'evil.html').write_text(page)\n"
        )
    ohub.stop_server(student)
    ohub.spawn_ready(student, {"gpu": "none", "course": course})
    evil_url = urljoin(server_link(ohub, student), "files/evil.html")

    context = browser.new_context()
    page = context.new_page()
    try:
        browser_log_in(page, ohub, teacher, PASSWORD, timeout=SLOW)
        open_as(page, evil_url)
        # The teacher sees the student's page, unsandboxed: its script ran and finished.
        assert page.locator("#marker").inner_text() == "My homework"
        assert page.evaluate("window.origin") == evil_url.split("/user/")[0]  # no sandbox
        stolen = wait_for(
            lambda: page.evaluate("window.__stolen || null"), 60, 0.2, "the page's script"
        )
        assert stolen["ran"]
        for how, s in stolen["steps"].items():
            assert not s["xsrf"], f"{how}: read the teacher's XSRF token from /hub/home: {s}"
            assert s["token_status"] != 201 and not s["token"], f"{how}: made a token: {s}"
            assert not s["user"], f"{how}: read the teacher's identity: {s}"
        # No cookie the page tossed reached the hub: the teacher is still logged in as themself.
        page.goto(f"{ohub.url}/hub/home", timeout=SLOW)
        assert page.url.startswith(f"{ohub.url}/hub/home"), page.url
        assert teacher in page.locator("body").inner_text()
    finally:
        context.close()
        ohub.stop_server(student)
    # No token was made in the teacher's name, whatever the page saw.
    tokens = ohub.api("GET", f"/users/{teacher}/tokens").json()["api_tokens"]
    assert not [t for t in tokens if t.get("note") == "stolen"], tokens


def test_the_generic_port_proxy_reaches_no_port(ohub: Hub, user_server_port) -> None:
    name, port = user_server_port
    headers = {"Authorization": f"token {ohub.token}"}
    base = server_link(ohub, name)
    # The server itself answers on that port (its own API), so the proxy would have reached it.
    assert requests.get(urljoin(base, "api/status"), headers=headers, timeout=30).ok
    # The single-user server itself, on its own port, through each of the generic routes.
    own = f"user/{name}/api/status"
    for path in (
        f"proxy/{port}/{own}",
        f"proxy/127.0.0.1:{port}/{own}",
        f"proxy/absolute/{port}/{own}",
    ):
        r = requests.get(urljoin(base, path), headers=headers, timeout=30)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])


@pytest.fixture
def user_server_port(ohub: Hub):
    """A running server and the local port its own single-user server listens on."""
    name = ohub.create_user(f"px{uuid.uuid4().hex[:6]}")
    ohub.spawn_ready(name, {"gpu": "none"})
    try:
        with ohub.kernel(name) as k:
            port = int(
                k.execute("import os; print(os.environ['JUPYTERHUB_SERVICE_URL'])")
                .strip()
                .rsplit(":", 1)[1]
                .split("/")[0]
            )
        yield name, port
    finally:
        ohub.stop_server(name)


def test_hub_pages_load_under_the_csp_without_errors(ohub: Hub, browser, tmp_path) -> None:
    tag = uuid.uuid4().hex[:5]
    teacher = approved_user(ohub, "csp", PASSWORD)
    assert WebSession(ohub).login(teacher, PASSWORD)
    course = f"csp{tag}"
    make_course(ohub, course, [teacher])
    problems: list[str] = []
    context = browser.new_context(viewport={"width": 1300, "height": 850})
    page = context.new_page()
    page.on(
        "console",
        lambda m: problems.append(f"{page.url}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"{page.url}: page error: {e}"))
    try:
        browser_log_in(page, ohub, teacher, PASSWORD, timeout=SLOW)
        page.goto(f"{ohub.url}/hub/home", timeout=SLOW)
        page.wait_for_selector("#gpulab-balance-amount", timeout=SLOW)
        shot(page, "home", tmp_path)
        # The statement link: billing's pages, on the hub's host, after its own OAuth.
        page.locator("#gpulab-statement-link").click()
        page.wait_for_url(f"{ohub.url}/services/billing/**", timeout=SLOW)
        page.wait_for_load_state("networkidle", timeout=SLOW)
        shot(page, "statement", tmp_path)
        assert teacher in page.content()
        page.goto(f"{ohub.url}/hub/spawn", timeout=SLOW)
        page.wait_for_selector("form", timeout=SLOW)
        shot(page, "spawn", tmp_path)
        page.goto(f"{ohub.url}/hub/gpulab/courses/{course}", timeout=SLOW)
        page.wait_for_load_state("networkidle", timeout=SLOW)
        shot(page, "course", tmp_path)
        # Starting from the form lands in JupyterLab, on the user's own origin.
        page.goto(f"{ohub.url}/hub/spawn", timeout=SLOW)
        page.locator("form [type=submit]").last.click()
        page.wait_for_url(f"http://{teacher}.localhost:{ohub.port}/user/{teacher}/**", timeout=SLOW)
        page.wait_for_selector(".jp-LabShell", timeout=SLOW)
        shot(page, "lab", tmp_path)
        admin = browser.new_context().new_page()
        admin.on(
            "console",
            lambda m: (
                problems.append(f"admin {admin.url}: {m.text}") if m.type == "error" else None
            ),
        )
        browser_log_in(admin, ohub, "admin", (ohub.data_dir / "admin-password").read_text().strip())
        admin.goto(f"{ohub.url}/hub/admin", timeout=SLOW)
        admin.wait_for_selector("text=" + teacher, timeout=SLOW)
        shot(admin, "admin", tmp_path)
        admin.context.close()
    finally:
        context.close()
        if ohub.server(teacher) is not None:
            ohub.stop_server(teacher)
    csp = [p for p in problems if "Content Security Policy" in p or "Refused to" in p]
    assert not csp, csp
    assert not problems, problems


def test_hub_pages_answer_only_under_the_hubs_own_host(ohub: Hub) -> None:
    """A hub page under a user's host (or the bare IP) is a redirect to the hub's own URL, a
    form posted there is refused: nobody logs in, and no hub cookie is set, on a user's origin.
    API clients (tokens) and health checks answer under any name."""
    for host in (f"victim.localhost:{ohub.port}", f"127.0.0.1:{ohub.port}"):
        r = requests.get(f"http://{host}/hub/login?next=x", allow_redirects=False, timeout=30)
        assert r.status_code == 302, (host, r.status_code)
        assert r.headers["Location"] == f"{ohub.url}/hub/login?next=x"
        assert "set-cookie" not in {k.lower() for k in r.headers}
        r = requests.post(
            f"http://{host}/hub/login",
            data={"username": "admin", "password": "x"},
            allow_redirects=False,
            timeout=30,
        )
        assert r.status_code == 403 and ohub.url in r.text, (host, r.status_code)
        r = requests.get(
            f"http://{host}/hub/api/user",
            headers={"Authorization": f"token {ohub.token}"},
            timeout=30,
        )
        assert r.status_code == 200, (host, r.status_code)
        assert requests.get(f"http://{host}/hub/health", timeout=30).status_code == 200
    # The hub's own pages carry its CSP.
    csp = requests.get(f"{ohub.url}/hub/login", timeout=30).headers["Content-Security-Policy"]
    assert "frame-ancestors 'self'" in csp and "connect-src 'self'" in csp
    assert "script-src 'self' 'unsafe-inline'" in csp and "default-src 'self'" in csp


def test_two_names_jupyterhub_would_put_on_one_origin_get_two(ohub: Hub) -> None:
    """A tester signed up as ``alice@uni.edu.@++!~++_``, a name whose JupyterHub label equals
    ``alice@uni.edu``'s (7 hex digits of SHA-256 collide in seconds), and served pages on the
    victim's origin. Each now has an origin of its own, and each reaches only their own server
    there."""
    suffix = uuid.uuid4().hex[:4]
    victim, attacker = f"alice{suffix}@uni.edu", f"alice{suffix}@uni.edu.@++!~++_"
    for name in (victim, attacker):
        ohub.create_user(name)
    try:
        for name in (victim, attacker):
            ohub.spawn_ready(name, {"gpu": "none"})
        links = {name: server_link(ohub, name) for name in (victim, attacker)}
        hosts = {name: urlparse(link).hostname for name, link in links.items()}
        assert hosts[victim] != hosts[attacker], hosts
        headers = {"Authorization": f"token {ohub.token}"}
        for name, link in links.items():
            r = requests.get(urljoin(link, "api/status"), headers=headers, timeout=30)
            assert r.ok, (name, r.status_code, r.text[:200])
        # The attacker's server is not reachable on the victim's origin (nor the reverse).
        wrong = f"http://{hosts[victim]}:{ohub.port}{urlparse(links[attacker]).path}api/status"
        r = requests.get(wrong, headers=headers, timeout=30, allow_redirects=False)
        assert r.status_code != 200, (r.status_code, r.text[:200])
    finally:
        for name in (victim, attacker):
            ohub.stop_server(name)
