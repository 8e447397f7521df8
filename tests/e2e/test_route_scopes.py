"""Who may reach each of gpulab's hub routes, checked against a real hub: one user's token reaches
nothing of another user's (notices, home, launch, switch, spot status, queue and settings, a
reservation in their name); a plain user's token reaches no operator or course-staff route; a
signed-up user cannot approve, discard or reset anyone through NativeAuthenticator's pages.

Each refusal is also checked for what it would have changed: no server started, no setting
written, no course touched, no sign-up approved. docs/security.md names these tests.
"""

from __future__ import annotations

import uuid

import requests
from course_helpers import make_course, token_for
from harness import PASSWORD, Hub, WebSession, admin_web, approved_user

REFUSED = (403, 404)


def test_another_users_token_reaches_none_of_their_routes(hub: Hub) -> None:
    alice, bob = hub.create_user(), hub.create_user()
    alice_token, bob_token = token_for(hub, alice), token_for(hub, bob)
    evil = "https://attacker.example/hook"
    attempts = [
        ("GET", f"/gpulab/users/{alice}/notices", None),
        ("GET", f"/gpulab/users/{alice}/home", None),
        ("POST", f"/gpulab/users/{alice}/apps/jupyterlab/launch", {"gpu": "none"}),
        ("GET", f"/gpulab/users/{alice}/launch", None),
        ("POST", f"/gpulab/users/{alice}/switch", {"gpu": "none"}),
        ("GET", f"/gpulab/spot/status/{alice}", None),
        ("DELETE", f"/gpulab/spot/queue/{alice}", None),
        ("GET", f"/gpulab/spot/settings/{alice}", None),
        ("PUT", f"/gpulab/spot/settings/{alice}", {"webhook_url": evil}),
        ("POST", f"/users/{alice}/server", {"gpu": "none"}),
        ("POST", f"/users/{alice}/servers/side", {"gpu": "none"}),
    ]
    for method, path, body in attempts:
        r = hub.api(method, path, token=bob_token, json=body)
        assert r.status_code in REFUSED, (method, path, r.status_code, r.text[:300])
    # A reservation charged to alice's balance: refused, naming the field.
    r = hub.api(
        "POST",
        "/gpulab/reservations",
        token=bob_token,
        json={"account": f"user:{alice}", "gpu_type": "a100-80g", "cards": 1},
    )
    assert r.status_code == 403 and r.json()["field"] == "account", r.text
    # Nothing changed for alice: no server, her webhook is not the attacker's, no reservation.
    assert hub.server(alice) is None and not hub.user(alice)["servers"]
    settings = hub.api("GET", f"/gpulab/spot/settings/{alice}", token=alice_token)
    assert settings.status_code == 200 and evil not in settings.text
    listed = hub.api("GET", "/gpulab/reservations", token=alice_token).json()["reservations"]
    assert not [h for h in listed if h.get("account") == f"user:{alice}"]
    # Her own token reaches the same routes (the refusals above are about who asks).
    for path in (f"/gpulab/users/{alice}/home", f"/gpulab/users/{alice}/notices"):
        assert hub.api("GET", path, token=alice_token).status_code == 200, path
    assert hub.api("GET", f"/gpulab/spot/status/{alice}", token=alice_token).status_code == 200


def test_a_user_token_reaches_no_operator_or_course_staff_route(hub: Hub) -> None:
    tag = uuid.uuid4().hex[:6]
    teacher, outsider = approved_user(hub, "tch"), approved_user(hub, "out")
    web, staff = WebSession(hub), WebSession(hub)  # logging in makes them hub users
    assert web.login(outsider, PASSWORD) and staff.login(teacher, PASSWORD)
    course = f"sec{tag}"
    make_course(hub, course, [teacher])
    token = token_for(hub, outsider)
    attempts = [
        ("PUT", "/gpulab/spot/prices/rtx-4090", {"price": "0.01"}),
        ("POST", "/gpulab/courses", {"name": f"own{tag}", "teachers": [outsider]}),
        ("GET", f"/gpulab/courses/{course}", None),
        ("PATCH", f"/gpulab/courses/{course}", {"display_name": "pwned", "tas": [outsider]}),
        ("POST", f"/gpulab/courses/{course}/roster", None),
        ("DELETE", f"/gpulab/courses/{course}/members/{teacher}", None),
        ("POST", f"/gpulab/courses/{course}/join", None),
        ("GET", f"/gpulab/courses/{course}/bookings", None),
        ("POST", f"/gpulab/courses/{course}/bookings", {"gpu_type": "rtx-4090", "cards": 1}),
        ("DELETE", f"/gpulab/courses/{course}/bookings/1", None),
        ("POST", f"/gpulab/courses/{course}/assignments/a1/autograde", {}),
        ("GET", f"/gpulab/courses/{course}/assignments/a1/autograde", None),
        ("GET", f"/gpulab/courses/{course}/assignments/a1/autograde/job1", None),
    ]
    for method, path, body in attempts:
        r = hub.api(method, path, token=token, json=body)
        assert r.status_code in REFUSED, (method, path, r.status_code, r.text[:300])
    # The course dashboard page, logged in: refused to the outsider, served to the teacher.
    page = f"/hub/gpulab/courses/{course}"
    assert web.get(page, allow_redirects=False).status_code in REFUSED
    served = staff.get(page, allow_redirects=False)
    assert served.status_code == 200 and f"Course {course}" in served.text
    # Nothing changed: the price is the market's, the course is as the admin made it.
    after = hub.api("GET", "/gpulab/spot/prices", token=token).json()["gpu_types"]
    rtx = next(t for t in after if t["slug"] == "rtx-4090")
    assert not rtx["pinned"] and rtx["price"] != "0.01"
    info = hub.api("GET", f"/gpulab/courses/{course}").json()
    assert info["display_name"] != "pwned" and outsider not in str(info)
    assert teacher in str(info)
    assert hub.api("GET", f"/groups/own{tag}").status_code == 404


def test_a_signed_up_user_cannot_approve_discard_or_reset_anyone(hub: Hub) -> None:
    pending = f"pend{uuid.uuid4().hex[:6]}"
    assert WebSession(hub).signup(pending, PASSWORD).ok
    other = approved_user(hub, "other")
    me = approved_user(hub, "me")
    web = WebSession(hub)
    assert web.login(me, PASSWORD)
    assert web.get("/hub/authorize", allow_redirects=False).status_code in REFUSED
    assert web.get(f"/hub/authorize/{pending}", allow_redirects=False).status_code in REFUSED
    assert web.get(f"/hub/discard/{pending}", allow_redirects=False).status_code in REFUSED
    page = web.get(f"/hub/change-password/{other}", allow_redirects=False)
    assert page.status_code in REFUSED
    reset = web.post(
        f"/hub/change-password/{other}",
        {"new_password": "taken-over-now", "new_password_confirmation": "taken-over-now"},
        allow_redirects=False,
    )
    assert reset.status_code in REFUSED
    # A forged self-approval link approves nobody.
    web.get(f"/hub/confirm/{pending}", allow_redirects=False)
    # Changing one's own password needs the current one.
    web.post(
        "/hub/change-password",
        {
            "old_password": "not-my-password",
            "new_password": "changed-by-a-thief",
            "new_password_confirmation": "changed-by-a-thief",
        },
    )
    # Nothing changed: the sign-up still waits (and is still listed), the others' passwords hold.
    assert not WebSession(hub).login(pending, PASSWORD)
    assert pending in admin_web(hub).get("/hub/authorize").text
    assert WebSession(hub).login(other, PASSWORD)
    assert not WebSession(hub).login(other, "taken-over-now")
    assert WebSession(hub).login(me, PASSWORD)


def test_another_users_token_reaches_nothing_in_a_users_server(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    intruder = hub.create_user()
    token = token_for(hub, intruder)
    routes = [
        ("GET", r)
        for r in ("status", "balance", "catalog", "pool", "gpus", "spot", "notices", "jobs")
    ]
    routes += [("GET", "jobs/1"), ("GET", "jobs/1/log")]
    for method, route in [*routes, ("POST", "switch"), ("POST", "jobs"), ("DELETE", "jobs/1")]:
        r = requests.request(
            method,
            hub.user_url(user, f"gpulab/api/{route}"),
            headers={"Authorization": f"token {token}"},
            json={"gpu": "rtx-4090"} if method == "POST" else None,
            timeout=60,
            allow_redirects=False,
        )
        assert r.status_code == 403, (route, r.status_code, r.text[:300])
    assert hub.server(user)["state"]["options"]["gpu"] == "none"


def test_a_forged_billing_log_in_callback_logs_nobody_in(hub: Hub) -> None:
    web = WebSession(hub)
    r = web.get("/services/billing/oauth_callback?code=forged&state=forged", allow_redirects=False)
    assert r.status_code in (400, 403), (r.status_code, r.text[:300])
    page = web.get("/services/billing/", allow_redirects=False)
    assert page.status_code == 302 and "oauth2/authorize" in page.headers["Location"]


def test_billing_pages_are_framed_by_nobody_but_their_own_origin(hub: Hub) -> None:
    """On a real domain a user's origin (alice.hub.example.org) is the same site as the hub's, so
    a user's page could frame billing's pages, the admin's credit form among them."""
    web = WebSession(hub)
    for path in ("/services/billing/", "/services/billing/statement.csv"):
        r = web.get(path, allow_redirects=False)
        assert "frame-ancestors 'self'" in r.headers.get("Content-Security-Policy", ""), path
        assert r.headers.get("X-Frame-Options") == "SAMEORIGIN", path
