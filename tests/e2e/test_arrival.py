"""A newcomer's arrival (issue 22): log-in, sign-up, and the terminal of ``gpulab up``.

Each test names the points of issue 22 it covers; each failed on the code before the fix:

- landing: log-in and ``/hub/`` lead to the home page (balance, apps, free cards), not to the raw
  spawn form, and nothing starts on the way;
- sign-up: "Create account" answers with a page saying the account waits for approval (not the
  empty form), a refused sign-up names the field and keeps the name, the log-in page tells a
  waiting person so, and the admin sees "N sign-ups wait" on every hub page, linked to
  ``/hub/authorize``;
- the hub's log: a routine refusal (a full GPU type, 409) is one line at INFO, with no
  traceback and no ``[E]`` line;
- shutdown: Ctrl-C (SIGINT to ``gpulab up``'s process group) or SIGTERM stops each server while
  billing still runs, so billing records when each session ended;
- ``gpulab up --data-dir DIR`` makes the Stable Diffusion tile's demo model in DIR and prints
  how to log in last, after JupyterHub's start-up log.
"""

from __future__ import annotations

import html
import os
import re
import signal
import time
import uuid
from datetime import datetime

import pytest
from billing.client import Billing
from harness import PASSWORD, REPO, Hub, WebSession, admin_web, approve, approved_user, wait_for


@pytest.fixture(scope="module")
def ahub(module_hub_factory) -> Hub:
    """A hub with one RTX 4090, so that a second start on that type is refused."""
    return module_hub_factory("arrival", simulate="RTX-4090:1,A100-80G:1")


def text_of(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def log_since(hub: Hub, mark: int) -> str:
    return hub.log_path.read_text(errors="replace")[mark:]


def test_log_in_and_the_hub_root_land_on_the_home_page(ahub: Hub) -> None:
    """Issue 22, landing: after log-in a person saw the raw "Server Options" form."""
    name = approved_user(ahub, "land")
    web = WebSession(ahub)
    r = web.post("/hub/login", {"username": name, "password": PASSWORD})
    assert r.ok and r.url == f"{ahub.url}/hub/home", (r.status_code, r.url)
    assert 'id="gpulab-balance"' in r.text and 'id="gpulab-pool"' in r.text
    assert web.get("/hub/").url == f"{ahub.url}/hub/home"
    # Landing starts nothing; the form is there when asked for.
    assert ahub.server(name) is None
    assert 'name="gpu"' in web.get("/hub/spawn").text
    # A link back to where the person was going still wins (a server's own log-in redirect).
    later = WebSession(ahub)
    r = later.post("/hub/login?next=%2Fhub%2Ftoken", {"username": name, "password": PASSWORD})
    assert r.url == f"{ahub.url}/hub/token", r.url
    # With a server running, log-in still lands on the home page (its Open button leads on).
    ahub.spawn_ready(name, {"gpu": "none"})
    try:
        r = WebSession(ahub).post("/hub/login", {"username": name, "password": PASSWORD})
        assert r.url == f"{ahub.url}/hub/home", r.url
    finally:
        ahub.stop_server(name)


def test_a_sign_up_says_it_waits_for_approval_and_the_admin_is_told(ahub: Hub) -> None:
    """Issue 22, sign-up: "Create User" returned the empty form, the admin was not told, and
    /hub/authorize was linked from nowhere."""
    name = f"new{uuid.uuid4().hex[:6]}"
    before = admin_web(ahub).get("/hub/home").text
    m = re.search(r'id="gpulab-signups-waiting"[^>]*>\s*(\d+) sign-up', before)
    waiting = int(m.group(1)) if m else 0

    # Refusals name the field, keep the name typed, change nothing.
    web = WebSession(ahub)
    r = web.signup(name, "password123")
    assert r.status_code == 400, r.status_code
    page = text_of(r.text)
    assert "Password: at least 8 characters, and not too common" in page, page[-1500:]
    assert f'value="{name}"' in r.text
    r = web.post(
        "/hub/signup",
        {
            "username": name,
            "signup_password": PASSWORD,
            "signup_password_confirmation": PASSWORD + "x",
        },
    )
    assert r.status_code == 400 and "Confirm password: does not match" in text_of(r.text)
    r = web.signup("admin", PASSWORD)
    assert r.status_code == 409 and "Username: admin is already in use" in text_of(r.text)
    r = web.signup("two words", PASSWORD)
    assert r.status_code == 400 and "Username: 'two words' is not allowed" in text_of(r.text)

    # Accepted: a page of its own saying what happens next, not the form.
    r = web.signup(name, PASSWORD)
    assert r.ok, (r.status_code, r.text[-1500:])
    page = text_of(r.text)
    assert "An administrator must approve it before you can log in" in page, page[-1500:]
    assert 'name="signup_password"' not in r.text
    # Trying to log in says it waits (with the right password only).
    r = WebSession(ahub).post("/hub/login", {"username": name, "password": PASSWORD})
    assert "waits for an administrator's approval" in text_of(r.text)
    r = WebSession(ahub).post("/hub/login", {"username": name, "password": "wrong-horse-battery"})
    assert "waits for" not in r.text and "Invalid username or password" in text_of(r.text)

    # The admin sees it on the home page and in every page's navbar, linked to /hub/authorize.
    admin = admin_web(ahub)
    home = admin.get("/hub/home").text
    assert f"{waiting + 1} sign-up" in text_of(home), text_of(home)[:1500]
    assert re.search(r'id="gpulab-nav-signups" href="/hub/authorize"', home), home[:4000]
    token_page = admin.get("/hub/token").text
    assert 'id="gpulab-nav-signups"' in token_page and "waiting</span>" in token_page
    listing = admin.get("/hub/authorize").text
    assert f'id="{name}"' in listing
    # A plain user sees neither.
    plain = WebSession(ahub)
    assert plain.login(approved_user(ahub, "plain"), PASSWORD)
    home = plain.get("/hub/home").text
    assert "gpulab-nav-signups" not in home and "gpulab-signups-waiting" not in home

    approve(ahub, name)
    assert WebSession(ahub).login(name, PASSWORD)


def test_a_full_gpu_type_is_one_line_in_the_hub_log_not_an_error(ahub: Hub) -> None:
    """Issue 22, the terminal: a routine refusal printed a traceback and
    ``[E] Error starting ...: HTTP 409``."""
    holder, refused = ahub.create_user(), approved_user(ahub, "full")
    ahub.spawn_ready(holder, {"gpu": "rtx-4090"})
    try:
        mark = len(ahub.log_path.read_text(errors="replace"))
        web = WebSession(ahub)
        assert web.login(refused, PASSWORD)
        # The REST API, the spawn form, and the home page's launch: each refused (409).
        assert ahub.spawn(refused, {"gpu": "rtx-4090"}).status_code == 409
        r = web.post(f"/hub/spawn/{refused}", {"gpu": "rtx-4090", "image": "base"})
        assert r.status_code == 409, r.status_code
        xsrf = web.http.cookies.get("_xsrf")
        r = web.http.post(
            f"{ahub.url}/hub/api/gpulab/users/{refused}/apps/jupyterlab/launch",
            json={"gpu": "rtx-4090"},
            headers={"X-XSRFToken": xsrf, "Referer": f"{ahub.url}/hub/home"},
            timeout=60,
        )
        assert r.status_code == 409, (r.status_code, r.text)
        # The REST API's and the form's refusals come from the spawn itself (JupyterHub's
        # User.spawn logged them as errors); the launch's plan refuses before any spawn.
        wait_for(
            lambda: log_since(ahub, mark).count(f"Not starting {refused}'s server (409)") >= 2,
            30,
            what="the refusals in the hub's log",
        )
        log = log_since(ahub, mark)
        assert "Traceback" not in log, log
        assert not re.search(r"^\[E ", log, re.M), log
        # Each refusal's reason on one line (besides the request's own access-log line), at INFO
        # or WARNING: not repeated by the form's handler nor by tornado.
        reasons = [ln for ln in log.splitlines() if "No rtx-4090 available" in ln]
        assert len(reasons) == 3, reasons
        assert all(ln.startswith(("[I ", "[W ")) for ln in reasons), reasons
        line = next(ln for ln in log.splitlines() if f"Not starting {refused}'s server" in ln)
        assert line.startswith("[I ") and "No rtx-4090 available" in line, line
    finally:
        ahub.stop_server(holder)


def iso_seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_ctrl_c_and_sigterm_stop_the_servers_while_billing_still_records_it(
    hub_factory,
) -> None:
    """Issue 22, the terminal: Ctrl-C stopped billing before the servers ("server_stop ... not
    delivered yet: billing unreachable"), so billing never learnt when their sessions ended."""
    hub = hub_factory("shutdown", simulate="RTX-4090:1")
    billing = Billing(hub)
    name = hub.create_user()
    ends = []
    # Ctrl-C in the terminal: SIGINT to the foreground process group (gpulab up and its
    # children that share it); then a service manager's SIGTERM to gpulab up alone.
    for how in ("ctrl-c", "sigterm"):
        hub.spawn_ready(name, {"gpu": "rtx-4090"})
        wait_for(billing.up, 60, 0.5, "billing")
        mark = len(hub.log_path.read_text(errors="replace"))
        t0 = time.time()
        if how == "ctrl-c":
            os.killpg(hub.proc.pid, signal.SIGINT)
        else:
            hub.proc.send_signal(signal.SIGTERM)
        assert hub.proc.wait(90) == 0
        t1 = time.time()
        hub.proc = None
        log = log_since(hub, mark)
        assert "not delivered yet" not in log, log[-3000:]
        ends.append((t0, t1))
        hub.start()
        wait_for(billing.up, 60, 0.5, "billing after the restart")
    sessions = sorted(
        (s for s in billing.usage(name)["servers"]), key=lambda s: iso_seconds(s["started"])
    )
    assert len(sessions) == 2, sessions
    for session, (t0, t1) in zip(sessions, ends, strict=True):
        assert session["stopped"], session
        # The stop reported when the server stopped, between the signal and the hub's exit
        # (billing keeps microseconds; a second of slack for the clocks' rounding).
        assert t0 - 1 <= iso_seconds(session["stopped"]) <= t1 + 1, (session, t0, t1)


def test_gpulab_up_makes_the_demo_model_in_its_data_dir_and_prints_how_to_log_in_last(
    hub_factory,
) -> None:
    """Issue 22: ``make run ARGS="--data-dir DIR"`` wrote the demo model into ./.gpulab, not
    DIR; the admin's log-in line was buried under JupyterHub's start-up log."""
    elsewhere = REPO / ".gpulab" / "models" / "tiny-sd"
    was_there = elsewhere.exists()
    hub = hub_factory("demo-model", simulate="RTX-4090:1", env={"GPULAB_DEMO_MODEL": "1"})
    assert (hub.data_dir / "models" / "tiny-sd" / "model_index.json").exists()
    assert elsewhere.exists() == was_there

    password = (hub.data_dir / "admin-password").read_text().strip()

    def banner() -> list[str] | None:
        lines = hub.log_path.read_text(errors="replace").splitlines()
        at = [i for i, ln in enumerate(lines) if f"with password {password}" in ln]
        return [*lines[: at[0] + 1]] if at else None

    lines = wait_for(banner, 60, what="the log-in line")
    starts = [i for i, ln in enumerate(lines) if "JupyterHub is now running" in ln]
    assert starts, "the log-in line came before JupyterHub's start-up log"
    running = starts[-1]
    # After JupyterHub's start-up log: gpulab's lines alone (a request's access-log line, e.g.
    # the harness asking whether the hub answers, may come at any time), the log-in line last.
    after = [
        ln
        for ln in lines[running + 1 :]
        if ln.strip() and not re.search(r"\] \d{3} (GET|POST|PUT|DELETE|PATCH) ", ln)
    ]
    assert after[0] == f"gpulab is running: open {hub.url}/", after
    assert after[-1].startswith(f"  log in as 'admin' with password {password}"), after
    assert len(after) <= 4, after
    # Before the start-up log: the demo model's line, and no log-in line.
    assert any("making the demo model" in ln for ln in lines[:running])
    assert not any("log in as" in ln for ln in lines[:running])
