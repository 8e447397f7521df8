"""LTI 1.3 launches on a real hub, with this test as the LMS (the platform).

The platform is a local HTTP server: its JWKS (an RSA key made here) and its OIDC authorize
endpoint, which answers the hub's authentication request with the auto-post form of a signed
id_token, as Moodle and Canvas do. A browser (a requests session with its cookies) goes through
the whole flow: login initiation at the hub, the platform's authorize URL, the form post back to
the hub's launch URL.

What a teacher, a TA and a student notice: they land logged in on the hub; the course of the LMS
context exists with them in it, in their role; a student of two courses keeps both. A launch
with anything wrong (signature, deployment, issuer, client id, state, nonce, expiry) is refused
with a 4xx naming it, and creates nothing.
"""

from __future__ import annotations

import html
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa
from harness import Hub

CLAIM = "https://purl.imsglobal.org/spec/lti/claim/"
MEMBERSHIP = "http://purl.imsglobal.org/vocab/lis/v2/membership"
INSTRUCTOR = f"{MEMBERSHIP}#Instructor"
LEARNER = f"{MEMBERSHIP}#Learner"
TA = f"{MEMBERSHIP}/Instructor#TeachingAssistant"
CLIENT_ID = "gpulab-tool-1"
DEPLOYMENT = "deployment-1"


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Launch:
    """What the platform puts in the id_token for one login_hint (None in ``claims`` drops one)."""

    sub: str
    roles: list[str]
    context: dict | None
    person: dict = field(default_factory=dict)
    claims: dict = field(default_factory=dict)
    key: Any = None
    kid: str | None = None


class Platform:
    """The LMS: a JWKS and an OIDC authorize endpoint on 127.0.0.1, signing with its RSA key."""

    def __init__(self) -> None:
        self.key = new_key()
        self.kid = "platform-key-1"
        self.launches: dict[str, Launch] = {}
        self.requests: list[dict[str, str]] = []
        self.redirect_uri = ""
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/jwks":
                    self.answer(200, "application/json", json.dumps(platform.jwks()))
                elif url.path == "/authorize":
                    args = {k: v[0] for k, v in parse_qs(url.query).items()}
                    status, body = platform.authorize(args)
                    self.answer(status, "text/html", body)
                else:
                    self.answer(404, "text/plain", "not found")

            def answer(self, status: int, kind: str, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.issuer = self.url
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def jwks(self) -> dict:
        public = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**public, "kid": self.kid, "alg": "RS256", "use": "sig"}]}

    def hub_env(self) -> dict[str, str]:
        return {
            "GPULAB_LTI_ISSUER": self.issuer,
            "GPULAB_LTI_CLIENT_IDS": f"{CLIENT_ID},another-client",
            "GPULAB_LTI_AUTHORIZE_URL": f"{self.url}/authorize",
            "GPULAB_LTI_JWKS_URL": f"{self.url}/jwks",
            "GPULAB_LTI_DEPLOYMENT_IDS": DEPLOYMENT,
        }

    def authorize(self, args: dict[str, str]) -> tuple[int, str]:
        """The platform's side of the OIDC authentication request: check it, sign an id_token."""
        self.requests.append(args)
        expected = {
            "scope": "openid",
            "response_type": "id_token",
            "response_mode": "form_post",
            "prompt": "none",
            "client_id": CLIENT_ID,
            "redirect_uri": self.redirect_uri,
        }
        for name, value in expected.items():
            if args.get(name) != value:
                return 400, f"bad {name}: {args.get(name)!r}"
        launch = self.launches.get(args.get("login_hint", ""))
        if launch is None or not args.get("nonce") or not args.get("state"):
            return 400, "unknown login_hint or no nonce/state"
        if args.get("lti_message_hint") != "msg-" + args["login_hint"]:
            return 400, "lti_message_hint not passed back"
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "sub": launch.sub,
            "iat": now,
            "exp": now + 300,
            "nonce": args["nonce"],
            CLAIM + "version": "1.3.0",
            CLAIM + "message_type": "LtiResourceLinkRequest",
            CLAIM + "deployment_id": DEPLOYMENT,
            CLAIM + "target_link_uri": self.redirect_uri,
            CLAIM + "resource_link": {"id": "resource-1", "title": "GPU lab"},
            CLAIM + "roles": launch.roles,
            **launch.person,
        }
        if launch.context is not None:
            claims[CLAIM + "context"] = launch.context
        for name, value in launch.claims.items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        token = jwt.encode(
            claims,
            launch.key or self.key,
            algorithm="RS256",
            headers={"kid": launch.kid or self.kid},
        )
        return 200, (
            f'<html><body onload="document.forms[0].submit()">'
            f'<form method="post" action="{html.escape(args["redirect_uri"])}">'
            f'<input type="hidden" name="id_token" value="{token}">'
            f'<input type="hidden" name="state" value="{html.escape(args["state"])}">'
            "</form></body></html>"
        )


@pytest.fixture(scope="module")
def platform():
    p = Platform()
    yield p
    p.close()


@pytest.fixture(scope="module")
def lti_hub(module_hub_factory, platform) -> Hub:
    hub = module_hub_factory("lti", simulate="RTX-4090:1", env=platform.hub_env())
    platform.redirect_uri = f"{hub.url}/hub/lti13/launch"
    return hub


class Browser:
    """A person's browser, sent to the tool by the LMS."""

    def __init__(self, hub: Hub, platform: Platform) -> None:
        self.hub = hub
        self.platform = platform
        self.http = requests.Session()

    def initiate(self, hint: str, **overrides: str) -> requests.Response:
        """The LMS's login initiation (a form post to the hub), not followed."""
        args = {
            "iss": self.platform.issuer,
            "login_hint": hint,
            "target_link_uri": f"{self.hub.url}/hub/",
            "client_id": CLIENT_ID,
            "lti_deployment_id": DEPLOYMENT,
            "lti_message_hint": "msg-" + hint,
        }
        args.update(overrides)
        return self.http.post(
            f"{self.hub.url}/hub/lti13/login", data=args, allow_redirects=False, timeout=60
        )

    def to_platform(self, login_hint: str) -> tuple[str, dict[str, str]]:
        """Login initiation, then the platform's authorize page: its form's action and fields."""
        r = self.initiate(login_hint)
        assert r.status_code == 302, (r.status_code, r.text[-2000:])
        location = r.headers["Location"]
        assert location.startswith(f"{self.platform.url}/authorize?"), location
        page = self.http.get(location, timeout=30)
        assert page.status_code == 200, page.text
        action = html.unescape(re.search(r'action="([^"]+)"', page.text).group(1))
        fields = {
            name: html.unescape(value)
            for name, value in re.findall(r'name="([^"]+)" value="([^"]*)"', page.text)
        }
        return action, fields

    def post_launch(self, action: str, fields: dict[str, str]) -> requests.Response:
        return self.http.post(action, data=fields, allow_redirects=False, timeout=60)

    def launch(self, login_hint: str) -> requests.Response:
        return self.post_launch(*self.to_platform(login_hint))

    def me(self) -> requests.Response:
        xsrf = self.http.cookies.get("_xsrf", "")
        return self.http.get(
            f"{self.hub.url}/hub/api/user", headers={"X-XSRFToken": xsrf}, timeout=30
        )


def expect(platform: Platform, launch: Launch) -> str:
    hint = f"hint-{uuid.uuid4().hex[:10]}"
    platform.launches[hint] = launch
    return hint


def course(hub: Hub, name: str) -> dict | None:
    r = hub.api("GET", f"/groups/{name}")
    if r.status_code == 404:
        return None
    r.raise_for_status()
    group = r.json()
    props = group.get("properties", {}).get("gpulab_course", {})
    return {
        "students": sorted(group["users"]),
        "teachers": props.get("teachers", []),
        "tas": props.get("tas", []),
        "display_name": props.get("display_name"),
    }


def user_exists(hub: Hub, name: str) -> bool:
    return hub.api("GET", f"/users/{name}").status_code == 200


def assert_lands_logged_in(browser: Browser, r: requests.Response, name: str) -> None:
    assert r.status_code == 302, (r.status_code, r.text[-2000:])
    assert urlparse(r.headers["Location"]).path == "/hub/home"
    assert "jupyterhub-hub-login" in browser.http.cookies
    me = browser.me()
    assert me.status_code == 200, me.text
    assert me.json()["name"] == name
    home = browser.http.get(f"{browser.hub.url}/hub/home", timeout=60, allow_redirects=False)
    assert home.status_code == 200 and name in home.text


def test_instructor_launch_creates_the_teacher_and_the_course(lti_hub, platform) -> None:
    hub = lti_hub
    ada = Launch(
        sub="lms-user-1001",
        roles=[INSTRUCTOR, "http://purl.imsglobal.org/vocab/lis/v2/institution/person#Faculty"],
        context={"id": "ctx-ml-2026", "label": "ML 101", "title": "Machine Learning"},
        person={"preferred_username": "Ada.Lovelace", "email": "ada@uni.edu", "name": "Ada L"},
    )
    browser = Browser(hub, platform)
    r = browser.launch(expect(platform, ada))
    assert_lands_logged_in(browser, r, "ada.lovelace")
    req = platform.requests[-1]
    assert req["redirect_uri"] == f"{hub.url}/hub/lti13/launch" and req["client_id"] == CLIENT_ID
    assert course(hub, "ml-101") == {
        "students": [],
        "teachers": ["ada.lovelace"],
        "tas": [],
        "display_name": "Machine Learning",
    }
    roles = hub.user("ada.lovelace")["roles"]
    assert "gpulab-course-ml-101-teacher" in roles and "admin" not in roles
    # The teacher manages the course through the API, as after a roster import.
    token = hub.api(
        "POST", "/users/ada.lovelace/tokens", json={"expires_in": 600, "note": "lti"}
    ).json()["token"]
    r = hub.api("GET", "/gpulab/courses/ml-101", token=token)
    assert r.status_code == 200 and r.json()["teachers"] == ["ada.lovelace"]

    # The same person again (a new browser, another display name): the same user and course.
    again = Launch(**{**ada.__dict__, "person": {"preferred_username": "ada2"}})
    browser2 = Browser(hub, platform)
    assert_lands_logged_in(browser2, browser2.launch(expect(platform, again)), "ada.lovelace")
    assert course(hub, "ml-101")["teachers"] == ["ada.lovelace"]

    # Another LMS person whose preferred name clashes: a stable suffix, never Ada's account.
    other = Launch(
        sub="lms-user-2002",
        roles=[LEARNER],
        context=ada.context,
        person={"preferred_username": "ada.lovelace"},
    )
    b3 = Browser(hub, platform)
    r = b3.launch(expect(platform, other))
    assert r.status_code == 302
    name = b3.me().json()["name"]
    assert re.fullmatch(r"ada\.lovelace-[0-9a-f]{6}", name), name
    assert course(hub, "ml-101")["students"] == [name]
    b4 = Browser(hub, platform)
    b4.launch(expect(platform, other))
    assert b4.me().json()["name"] == name


def test_a_student_of_two_courses_keeps_both(lti_hub, platform) -> None:
    hub = lti_hub
    person = {"email": "Grace.Hopper@uni.edu", "name": "Grace Hopper"}
    a = Launch(
        "lms-user-3003", [LEARNER], {"id": "ctx-cv", "label": "CV 201", "title": "Vision"}, person
    )
    b = Launch(
        "lms-user-3003", [LEARNER], {"id": "ctx-nlp", "label": "NLP 301", "title": "NLP"}, person
    )
    first = Browser(hub, platform)
    assert_lands_logged_in(first, first.launch(expect(platform, a)), "grace.hopper")
    second = Browser(hub, platform)
    assert_lands_logged_in(second, second.launch(expect(platform, b)), "grace.hopper")
    assert course(hub, "cv-201")["students"] == ["grace.hopper"]
    assert course(hub, "nlp-301")["students"] == ["grace.hopper"]
    # No teacher until an Instructor launches.
    assert course(hub, "nlp-301")["teachers"] == []
    groups = sorted(hub.user("grace.hopper")["groups"])
    assert groups == ["cv-201", "nlp-301"]
    # Launching from course A again changes nothing in B.
    third = Browser(hub, platform)
    third.launch(expect(platform, a))
    assert sorted(hub.user("grace.hopper")["groups"]) == ["cv-201", "nlp-301"]


def test_ta_launch_makes_a_ta_of_the_course(lti_hub, platform) -> None:
    hub = lti_hub
    # Canvas sends a TA the Instructor role and the TeachingAssistant sub-role.
    ta = Launch(
        "lms-user-4004",
        [INSTRUCTOR, TA],
        {"id": "ctx-rl", "label": "RL 400", "title": "Reinforcement Learning"},
        {"name": "Alan Turing"},
    )
    browser = Browser(hub, platform)
    action, fields = browser.to_platform(expect(platform, ta))
    assert_lands_logged_in(browser, browser.post_launch(action, fields), "alan-turing")
    # The same form posted again (a replay) is refused: its state and nonce were used.
    assert_refused(Browser(hub, platform).post_launch(action, fields), 400, "state: no login")
    assert_refused(browser.post_launch(action, fields), 400, "state: no login")
    assert course(hub, "rl-400") == {
        "students": [],
        "teachers": [],
        "tas": ["alan-turing"],
        "display_name": "Reinforcement Learning",
    }
    roles = hub.user("alan-turing")["roles"]
    assert "gpulab-course-rl-400-ta" in roles and "gpulab-course-rl-400-teacher" not in roles


BAD = "Mallory"


def bad_launch(sub: str, **claims: Any) -> Launch:
    return Launch(
        sub=sub,
        roles=[INSTRUCTOR],
        context={"id": f"ctx-{sub}", "label": f"Bad {sub}", "title": "Bad"},
        person={"preferred_username": f"{BAD}-{sub}"},
        claims=claims,
    )


def assert_nothing_made(hub: Hub, sub: str) -> None:
    assert not user_exists(hub, f"{BAD.lower()}-{sub}")
    assert course(hub, f"bad-{sub}") is None


def assert_refused(r: requests.Response, status: int, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[-3000:])
    text = html.unescape(r.text)
    for word in words:
        assert word in text, (word, text[-3000:])
    assert "jupyterhub-hub-login" not in r.cookies


@pytest.mark.parametrize(
    ("case", "status", "words"),
    [
        ("signature", 401, ["id_token: bad signature: not signed by the platform's key"]),
        ("unknown-key", 401, ["id_token: bad signature: signed with key id 'stolen-key'"]),
        ("deployment", 403, ["deployment_id: unknown deployment 'deployment-9'"]),
        ("issuer", 401, ["iss: unknown issuer 'https://evil.example'"]),
        ("client", 401, ["aud: unknown client id 'someone-else'"]),
        ("expired", 401, ["id_token: expired"]),
        ("nonce", 401, ["nonce: the id_token's nonce is not this login's"]),
        ("no-nonce-cookie", 400, ["nonce: no nonce cookie"]),
        ("no-state-cookie", 400, ["state: no login in progress"]),
        ("state-mismatch", 400, ["state: does not match"]),
    ],
)
def test_a_bad_launch_is_refused_and_changes_nothing(lti_hub, platform, case, status, words):
    hub = lti_hub
    sub = case
    now = int(time.time())
    claims: dict[str, Any] = {
        "signature": {},
        "deployment": {CLAIM + "deployment_id": "deployment-9"},
        "issuer": {"iss": "https://evil.example"},
        "client": {"aud": "someone-else"},
        "expired": {"iat": now - 4000, "exp": now - 3600},
        "nonce": {"nonce": "not-the-hubs-nonce"},
    }.get(case, {})
    launch = bad_launch(sub, **claims)
    if case == "signature":
        launch.key = new_key()  # same kid, another key
    elif case == "unknown-key":
        launch.key, launch.kid = new_key(), "stolen-key"
    browser = Browser(hub, platform)
    action, fields = browser.to_platform(expect(platform, launch))
    if case == "no-nonce-cookie":
        browser.http.cookies.set("lti13authenticator-nonce-state", None)
    elif case == "no-state-cookie":
        browser.http.cookies.clear()
    elif case == "state-mismatch":
        other = Browser(hub, platform)
        _, theirs = other.to_platform(expect(platform, bad_launch("other")))
        fields = {**fields, "state": theirs["state"]}
    r = browser.post_launch(action, fields)
    assert_refused(r, status, *words)
    assert_nothing_made(hub, sub)
    assert browser.me().status_code in (401, 403)


def test_bad_login_initiations_are_refused(lti_hub, platform) -> None:
    hub = lti_hub
    browser = Browser(hub, platform)
    hint = expect(platform, bad_launch("init"))
    assert_refused(browser.initiate(hint, iss="https://evil.example"), 400, "iss: unknown issuer")
    assert_refused(
        browser.initiate(hint, client_id="nope"), 400, "client_id: unknown client id 'nope'"
    )
    assert_refused(
        browser.initiate(hint, lti_deployment_id="deployment-9"), 403, "lti_deployment_id"
    )
    assert_refused(browser.initiate(hint, login_hint=""), 400, "login_hint: missing")
    # A launch posted without a login initiation: no state cookie.
    r = requests.post(
        f"{hub.url}/hub/lti13/launch",
        data={"id_token": "x.y.z", "state": "abc"},
        allow_redirects=False,
        timeout=30,
    )
    assert_refused(r, 400, "state: no login in progress")
    assert_nothing_made(hub, "init")
    # GET on the launch URL is not a launch.
    assert requests.get(f"{hub.url}/hub/lti13/launch", timeout=30).status_code == 405


def test_password_login_and_signup_stay_and_lms_names_are_reserved(lti_hub, platform) -> None:
    from harness import WebSession, admin_web

    hub = lti_hub
    assert admin_web(hub).get("/hub/home").status_code == 200
    # Make sure an LMS person exists, then try to take their name with a password sign-up.
    p = Launch("lms-user-5005", [LEARNER], None, {"preferred_username": "Linus"})
    browser = Browser(hub, platform)
    assert_lands_logged_in(browser, browser.launch(expect(platform, p)), "linus")
    r = WebSession(hub).signup("linus", "correct-horse-battery-staple")
    assert "already in use" in r.text
    assert not WebSession(hub).login("linus", "correct-horse-battery-staple")


def test_no_lti_config_mounts_nothing(hub) -> None:
    for path in ("/hub/lti13/login", "/hub/lti13/launch"):
        assert requests.get(f"{hub.url}{path}?iss=x", timeout=30).status_code == 404


def test_a_captured_launch_is_accepted_once_even_across_a_restart(lti_hub, platform) -> None:
    """Issue 20, attack 8: whoever captured a launch (the form the LMS posts, and the browser's
    state and nonce cookies) could post it again within ``max_age`` and be logged in as that
    person. Each id_token's nonce is now accepted once, and the hub remembers it across a
    restart."""
    hub = lti_hub
    person = Launch(
        "lms-user-7007",
        [LEARNER],
        {"id": "ctx-replay", "label": "Replay 1", "title": "Replays"},
        {"preferred_username": "katherine.johnson"},
    )
    browser = Browser(hub, platform)
    action, fields = browser.to_platform(expect(platform, person))
    captured = dict(browser.http.cookies.items())
    assert_lands_logged_in(browser, browser.post_launch(action, fields), "katherine.johnson")

    def replay() -> requests.Response:
        thief = Browser(hub, platform)
        for name, value in captured.items():
            thief.http.cookies.set(name, value)
        r = thief.post_launch(action, fields)
        assert thief.me().status_code in (401, 403)
        return r

    assert_refused(replay(), 401, "nonce: this id_token was used already")
    hub.stop()
    hub.start()
    assert_refused(replay(), 401, "nonce: this id_token was used already")


def test_a_launch_with_no_course_role_makes_nothing(lti_hub, platform) -> None:
    """Issue 20, attack 8: a launch with no role gpulab knows (a Mentor, an LMS administrator)
    created the course's group all the same. Now it is refused naming the claim, and nothing is
    made: no user, no course."""
    hub = lti_hub
    launch = Launch(
        sub="norole",
        roles=[f"{MEMBERSHIP}#Mentor"],
        context={"id": "ctx-norole", "label": "Bad norole", "title": "Bad"},
        person={"preferred_username": f"{BAD}-norole"},
    )
    browser = Browser(hub, platform)
    r = browser.launch(expect(platform, launch))
    assert_refused(r, 403, "roles: no course role gpulab knows", "allowed: Learner")
    assert_nothing_made(hub, "norole")
    assert browser.me().status_code in (401, 403)
