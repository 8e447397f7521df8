"""Approving and discarding sign-ups, and guessing passwords, against a real hub.

A link or redirect on an attacker's page, followed by a logged-in admin's browser (a cross-site
top-level navigation: cookies sent, no XSRF token), approves and discards nobody; the admin's
Approve and Discard buttons on /hub/authorize (POSTs with the XSRF token of their session) do,
in one click; a POST without that token, or from a plain user, is refused. An account is locked
after 10 failed log-ins in a row, and sign-ups with a common password are refused. In headless
Chromium, a real attacker's page on another site (a redirect and an <img>) approves nobody, and
the admin still approves with one click. Set GPULAB_SCREENSHOTS=DIR to keep the pages as PNGs.
docs/security.md names these tests.
"""

from __future__ import annotations

import html
import http.server
import os
import re
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from harness import (
    PASSWORD,
    Hub,
    WebSession,
    admin_web,
    approve,
    approved_user,
    browser_log_in,
    free_port,
)

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")

# What a browser sends when a page on another site navigates it to the hub (a link, a form's
# GET, window.location, a redirect): cookies go along, the XSRF token does not.
CROSS_SITE_NAVIGATION = {
    "Sec-Fetch-Mode": "navigate",
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Dest": "document",
    "Referer": "https://attacker.example/free-gpus.html",
}


def pending_signup(hub: Hub, prefix: str = "pend") -> str:
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    assert WebSession(hub).signup(name, PASSWORD).ok
    assert not WebSession(hub).login(name, PASSWORD)
    return name


def listed(hub: Hub, name: str) -> bool:
    """Whether the admin's sign-up page has a row for ``name``."""
    return f'id="{name}"' in admin_web(hub).get("/hub/authorize").text


def form_for(page: str, action_tail: str) -> tuple[str, dict[str, str]]:
    """The action and hidden fields of the form on ``page`` whose action ends in ``action_tail``."""
    for m in re.finditer(r"<form\b([^>]*)>(.*?)</form>", page, re.S):
        action = re.search(r'action="([^"]*)"', m.group(1))
        if action and html.unescape(action.group(1)).endswith(action_tail):
            assert re.search(r'method="post"', m.group(1)), m.group(0)
            fields = {
                html.unescape(k): html.unescape(v)
                for k, v in re.findall(
                    r'<input type="hidden" name="([^"]*)" value="([^"]*)"', m.group(2)
                )
            }
            return html.unescape(action.group(1)), fields
    raise AssertionError(f"no form for {action_tail} in the page:\n{page[-3000:]}")


def test_a_cross_site_link_approves_and_discards_nobody(hub: Hub) -> None:
    to_approve, to_discard = pending_signup(hub), pending_signup(hub)
    admin = admin_web(hub)
    approve_page = admin.get(f"/hub/authorize/{to_approve}", headers=CROSS_SITE_NAVIGATION)
    discard_page = admin.get(f"/hub/discard/{to_discard}", headers=CROSS_SITE_NAVIGATION)
    # The same as an <img> on the attacker's page.
    admin.get(
        f"/hub/authorize/{to_approve}",
        headers={**CROSS_SITE_NAVIGATION, "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},
    )

    assert not WebSession(hub).login(to_approve, PASSWORD)
    assert listed(hub, to_approve) and listed(hub, to_discard)
    assert not WebSession(hub).login(to_discard, PASSWORD)
    # What the admin saw: a page asking to confirm, its one button a POST form.
    assert approve_page.status_code == 200, approve_page.status_code
    _, fields = form_for(approve_page.text, f"/authorize/{to_approve}")
    assert fields["authorized"] == "1" and fields["_xsrf"]
    assert discard_page.status_code == 200, discard_page.status_code
    assert form_for(discard_page.text, f"/discard/{to_discard}")[1]["_xsrf"]


def test_the_admins_buttons_approve_and_discard_in_one_click(hub: Hub) -> None:
    to_approve, to_discard = pending_signup(hub), pending_signup(hub)
    admin = admin_web(hub)
    page = admin.get("/hub/authorize").text

    # A POST without the session's XSRF token (a cross-site form) is refused and changes nothing.
    action, fields = form_for(page, f"/authorize/{to_approve}")
    forged = {k: v for k, v in fields.items() if k != "_xsrf"}
    r = admin.http.post(f"{hub.url}{action}", data=forged, headers=CROSS_SITE_NAVIGATION)
    assert r.status_code == 403, (r.status_code, r.text[-1000:])
    action_d, fields_d = form_for(page, f"/discard/{to_discard}")
    r = admin.http.post(f"{hub.url}{action_d}", data={}, headers=CROSS_SITE_NAVIGATION)
    assert r.status_code == 403, (r.status_code, r.text[-1000:])
    assert not WebSession(hub).login(to_approve, PASSWORD)
    assert listed(hub, to_discard)

    # The Approve button: one POST with what the page put in the form.
    r = admin.http.post(f"{hub.url}{action}", data=fields)
    assert r.ok and f'id="{to_approve}"' in r.text, (r.status_code, r.text[-1000:])
    assert WebSession(hub).login(to_approve, PASSWORD)
    # Submitting the same form again (a double click, a stale tab) keeps the approval.
    assert admin.http.post(f"{hub.url}{action}", data=fields).ok
    assert WebSession(hub).login(to_approve, PASSWORD)

    # The Discard button: the sign-up is gone, and the name can be signed up for afresh.
    r = admin.http.post(f"{hub.url}{action_d}", data=fields_d)
    assert r.ok, (r.status_code, r.text[-1000:])
    assert not listed(hub, to_discard)
    assert not WebSession(hub).login(to_discard, PASSWORD)
    assert "sent to the admin" in WebSession(hub).signup(to_discard, PASSWORD).text


def test_a_plain_user_cannot_approve_or_discard_with_their_own_token(hub: Hub) -> None:
    pending, other_pending = pending_signup(hub), pending_signup(hub)
    me = approved_user(hub, "me")
    web = WebSession(hub)
    assert web.login(me, PASSWORD)
    r = web.post(f"/hub/authorize/{pending}", {"authorized": "1"}, allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[-1000:])
    r = web.post(f"/hub/discard/{other_pending}", {}, allow_redirects=False)
    assert r.status_code == 403, (r.status_code, r.text[-1000:])
    assert not WebSession(hub).login(pending, PASSWORD)
    assert listed(hub, other_pending)


def test_an_admin_post_with_a_bad_field_says_which_and_changes_nothing(hub: Hub) -> None:
    pending = pending_signup(hub)
    r = admin_web(hub).post(f"/hub/authorize/{pending}", {"authorized": "yes"})
    assert r.status_code == 400 and "authorized" in r.text, (r.status_code, r.text[-1000:])
    assert not WebSession(hub).login(pending, PASSWORD)
    # Withdrawing an approval is a POST too.
    name = approved_user(hub, "withdrawn")
    assert admin_web(hub).post(f"/hub/authorize/{name}", {"authorized": "0"}).ok
    assert not WebSession(hub).login(name, PASSWORD)
    approve(hub, name)
    assert WebSession(hub).login(name, PASSWORD)


def test_ten_wrong_passwords_lock_the_account(hub: Hub) -> None:
    victim, bystander = approved_user(hub, "locked"), approved_user(hub, "bystander")
    thief = WebSession(hub)
    for i in range(10):
        assert not thief.login(victim, f"guess-number-{i}")
    # Locked: even the right password is refused for now (10 minutes by default) ...
    assert not WebSession(hub).login(victim, PASSWORD)
    # ... for that account only.
    assert WebSession(hub).login(bystander, PASSWORD)


def test_nine_wrong_passwords_then_the_right_one_logs_in(hub: Hub) -> None:
    name = approved_user(hub, "typo")
    for i in range(9):
        assert not WebSession(hub).login(name, f"typo-{i}")
    assert WebSession(hub).login(name, PASSWORD)


def test_a_sign_up_with_a_common_password_is_refused(hub: Hub) -> None:
    name = f"weak{uuid.uuid4().hex[:6]}"
    r = WebSession(hub).signup(name, "password123")
    assert "not too common" in r.text, r.text[-2000:]
    assert not listed(hub, name)


@pytest.mark.parametrize(
    "look_alike",
    ["\uff41dmin", "ad\u200bmin", "adm\u0131n", "\uff54\uff49\uff4e\uff41"],
    ids=["fullwidth-a", "zero-width-space", "dotless-i", "fullwidth-name"],
)
def test_a_look_alike_name_cannot_sign_up(hub: Hub, look_alike: str) -> None:
    """Attack (issue 22 wave, F4): sign-up took "admin" with a full-width a, with a zero-width
    space (shown exactly as "admin"), with a dotless i, and a teacher's name in full-width letters, each able to log in and to pass
    as someone else wherever names are shown. Sign-up now takes the roster's plain ASCII rule:
    a 400 naming the field and what is allowed, nobody listed, no log-in."""
    web = WebSession(hub)
    r = web.signup(look_alike, PASSWORD)
    assert r.status_code == 400, (r.status_code, r.text[-1500:])
    assert "Username:" in r.text and "lower-case letters a-z" in r.text
    assert not listed(hub, look_alike)
    assert not WebSession(hub).login(look_alike, PASSWORD)


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def attacker_site(body: str) -> http.server.ThreadingHTTPServer:
    """A page on another site (``localhost`` is not the hub's ``127.0.0.1``) serving ``body``."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_in_a_browser_an_attackers_page_approves_nobody_and_approve_is_one_click(
    hub: Hub, browser
) -> None:
    attacker, victim_of_discard = pending_signup(hub, "evil"), pending_signup(hub, "keep")
    admin_password = (hub.data_dir / "admin-password").read_text().strip()
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    site = attacker_site(
        f'<img src="{hub.url}/hub/discard/{victim_of_discard}">'
        f'<img src="{hub.url}/hub/authorize/{attacker}">'
        f'<a id="go" href="{hub.url}/hub/authorize/{attacker}">free GPUs</a>'
    )
    try:
        browser_log_in(page, hub, "admin", admin_password)
        # The admin visits the attacker's page (images load), then follows its link.
        page.goto(f"http://localhost:{site.server_address[1]}/free-gpus.html")
        page.wait_for_load_state("load")
        page.click("#go")
        page.wait_for_load_state("load")
        shot(page, "authorize-confirm")
        assert not WebSession(hub).login(attacker, PASSWORD)
        assert listed(hub, victim_of_discard)

        # The admin's own page: Approve is one click, and the row shows it.
        page.goto(f"{hub.url}/hub/authorize")
        row = page.locator(f'tr[id="{attacker}"]')
        shot(page, "authorize")
        row.get_by_role("button", name="Approve").click()
        page.wait_for_url(f"**/hub/authorize#{attacker}")
        assert row.locator("td").nth(2).inner_text() == "Yes"
        assert row.get_by_role("button", name="Withdraw approval").is_visible()
        assert WebSession(hub).login(attacker, PASSWORD)
    finally:
        context.close()
        site.shutdown()
        site.server_close()


def test_a_cross_site_form_cannot_reset_a_password_through_the_admin(hub: Hub) -> None:
    name = approved_user(hub, "reset")
    admin = admin_web(hub)
    # A GET on the admin's reset page only shows the form, whatever the query says.
    page = admin.get(
        f"/hub/change-password/{name}?new_password=taken-over-now"
        "&new_password_confirmation=taken-over-now",
        headers=CROSS_SITE_NAVIGATION,
    )
    assert page.status_code == 200
    assert form_for(page.text, "")[1]["_xsrf"]
    # An attacker's auto-submitting form: the admin's cookies, no XSRF token.
    r = admin.http.post(
        f"{hub.url}/hub/change-password/{name}",
        data={"new_password": "taken-over-now", "new_password_confirmation": "taken-over-now"},
        headers=CROSS_SITE_NAVIGATION,
    )
    assert r.status_code == 403, (r.status_code, r.text[-1000:])
    assert not WebSession(hub).login(name, "taken-over-now")
    assert WebSession(hub).login(name, PASSWORD)


def test_a_self_approval_link_approves_only_through_its_pages_button(hub_factory) -> None:
    from nativeauthenticator.crypto.signing import Signer

    secret = uuid.uuid4().hex
    selfhub = hub_factory(
        "self-approval",
        extra_args=[
            r"--NativeAuthenticator.allow_self_approval_for=@self\.example$",
            f"--NativeAuthenticator.secret_key={secret}",
        ],
    )

    def signup_elsewhere() -> str:
        # An address the pattern does not match, so that no mail is sent (none can be here).
        name = f"self{uuid.uuid4().hex[:6]}"
        fields = {"username": name, "email": f"{name}@elsewhere.example"}
        pw = {"signup_password": PASSWORD, "signup_password_confirmation": PASSWORD}
        assert WebSession(selfhub).post("/hub/signup", {**fields, **pw}).ok
        assert not WebSession(selfhub).login(name, PASSWORD)
        return name

    name = signup_elsewhere()
    expire = datetime.now(UTC) + timedelta(minutes=15)
    slug = Signer(secret).sign_object({"username": name, "expire": expire.isoformat()})
    # A mail scanner or link preview fetches the link: nothing is approved.
    WebSession(selfhub).get(f"/hub/confirm/{slug}")
    assert not WebSession(selfhub).login(name, PASSWORD)
    # The person opens it and presses the button.
    web = WebSession(selfhub)
    page = web.get(f"/hub/confirm/{slug}")
    action, fields = form_for(page.text, f"/confirm/{slug}")
    r = web.http.post(f"{selfhub.url}{action}", data=fields)
    assert r.ok and f"{name} has been authorized" in r.text, (r.status_code, r.text[-1000:])
    assert WebSession(selfhub).login(name, PASSWORD)
    # A forged slug approves nobody.
    other = signup_elsewhere()
    forged = Signer("not-the-secret").sign_object({"username": other, "expire": expire.isoformat()})
    WebSession(selfhub).post(f"/hub/confirm/{forged}", {})
    assert not WebSession(selfhub).login(other, PASSWORD)
