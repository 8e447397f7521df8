"""NativeAuthenticator's sign-up pages: approval safe against cross-site request forgery, and a
sign-up that tells a person where they stand.

NativeAuthenticator 1.3 approves (``/hub/authorize/NAME``), discards (``/hub/discard/NAME``) and
self-approves (``/hub/confirm/SLUG``) on a plain GET. JupyterHub checks its XSRF token only on
POSTs (and on cross-site fetches), so a link or redirect on an attacker's page, followed in a
logged-in admin's browser, approved the attacker's own pending sign-up. Nothing that changes
state happens on a GET here: these subclasses answer a GET with a page holding one POST button
(so old links still lead somewhere), and act only on a POST, which JupyterHub refuses without the
XSRF token of the admin's own session. ``GpulabAuthenticator.get_handlers`` swaps them in.

The admin's authorize page (``signup-authorize.html``) renders each action as a one-button form.
Approving names the state wanted (``authorized=1`` or ``0``) rather than toggling, so a double
submit or a stale tab never flips an approval back.

The sign-up page itself (``/hub/signup``, :class:`SignUp`) tells a person where they stand: a
refused sign-up keeps what they typed and names the field and what is allowed (400, or 409 for a
taken name); an accepted one is a page of its own saying that an administrator must approve it
before they can log in (or that they can log in now, under open sign-up), not the empty form
again. Admins see how many sign-ups wait on every hub page (:func:`signups_waiting`, the navbar
of ``templates/page.html``), and the hub's log says when one arrives.
"""

from __future__ import annotations

import asyncio
from typing import Any

import requests
from nativeauthenticator.handlers import (
    AuthorizationAreaHandler,
    DiscardHandler,
    EmailAuthorizationHandler,
    SignUpHandler,
    ToggleAuthorizationHandler,
    admin_users_scope,
)
from nativeauthenticator.orm import UserInfo
from tornado import web

from gpulab.hub_config.courses.roster import USERNAME_RE

ACTION_PAGE = "signup-action.html"
FORM_PAGE = "signup-form.html"
DONE_PAGE = "signup-done.html"
RECAPTCHA_VERIFY = "https://www.google.com/recaptcha/api/siteverify"


def signups_waiting(user: Any) -> int:
    """How many sign-ups wait for approval, for an admin (``/hub/authorize`` lists them); 0 for
    anyone else. A template variable of every hub page (``c.JupyterHub.template_vars``)."""
    if user is None or not getattr(user, "admin", False):
        return 0
    return user.db.query(UserInfo).filter(UserInfo.is_authorized.is_(False)).count()


class SignUp(SignUpHandler):
    """``/hub/signup``: the form, and after "Create account" a page that says what happens next.

    NativeAuthenticator answered every POST with the empty form and one line ("Your information
    has been sent to the admin"), and a refusal with a guess at what went wrong ("be sure your
    username does not contain ..."): here each refusal names its field and keeps the name typed.
    """

    async def get(self) -> None:
        if not self.authenticator.enable_signup:
            raise web.HTTPError(404)
        self.finish(await self._form())

    async def _form(self, error: str = "", field: str = "", **typed: str) -> str:
        auth = self.authenticator
        return await self.render_template(
            FORM_PAGE,
            error=error,
            field=field,
            username=typed.get("username", ""),
            email=typed.get("email", ""),
            ask_email=auth.ask_email_on_signup,
            two_factor_auth=auth.allow_2fa,
            recaptcha_key=auth.recaptcha_key,
            tos=auth.tos,
            minimum_password_length=auth.minimum_password_length,
            open_signup=auth.open_signup,
        )

    async def post(self) -> None:
        auth = self.authenticator
        if not auth.enable_signup:
            raise web.HTTPError(404)
        arg = self.get_body_argument
        username = arg("username", "", strip=False)
        password = arg("signup_password", "", strip=False)
        email = arg("email", "", strip=False)
        problem = await self._problem(username, password, email)
        info = None
        if problem is None:
            info = auth.create_user(
                username, password, email=email, has_2fa=bool(arg("2fa", "", strip=False))
            )
            if info is None:
                problem = (400, "", "The sign-up was refused; check the fields and try again.")
        if problem is not None:
            status, field, message = problem
            self.set_status(status)
            self.finish(await self._form(message, field, username=username, email=email))
            return
        if not info.is_authorized:
            self.log.info(
                "Sign-up %s waits for an admin's approval (%sauthorize)",
                info.username,
                self.hub.base_url,
            )
        html = await self.render_template(
            DONE_PAGE,
            signup_name=info.username,
            approved=bool(info.is_authorized),
            email_sent=bool(info.login_email_sent),
            two_factor_secret=info.otp_secret if info.has_2fa else "",
        )
        self.finish(html)

    async def _problem(self, username: str, password: str, email: str) -> tuple | None:
        """Why this sign-up is refused, as (status, field, message naming the field), or None."""
        auth = self.authenticator
        name = auth.normalize_username(username)
        if not name:
            return 400, "username", "Username: required."
        if not USERNAME_RE.match(name):
            # The roster's rule (names become Unix accounts and paths): plain ASCII only, so
            # nobody signs up as a look-alike of someone else (full-width letters, a zero-width space, a dotless i).
            return (
                400,
                "username",
                (
                    f"Username: {username!r} is not allowed (lower-case letters a-z, digits, '.', "
                    "'_' and '-', starting with a letter or digit, at most 63 characters)."
                ),
            )
        if not auth.validate_username(name):
            allowed = "no spaces, commas or slashes, and not only dots"
            if auth.username_pattern:
                allowed += f"; it must match {auth.username_pattern}"
            return 400, "username", f"Username: {username!r} is not allowed ({allowed})."
        if auth.user_exists(name):
            return 409, "username", f"Username: {name} is already in use; choose another."
        if auth.ask_email_on_signup and not email:
            return 400, "email", "Email: required."
        if not auth.is_password_strong(password):
            return (
                400,
                "password",
                f"Password: at least {auth.minimum_password_length} characters, and not too "
                "common (not one of the 10,000 most common passwords).",
            )
        if password != self.get_body_argument("signup_password_confirmation", "", strip=False):
            return 400, "confirmation", "Confirm password: does not match the password."
        if auth.recaptcha_key and not await self._human():
            return 400, "recaptcha", "reCAPTCHA: not passed; please try again."
        return None

    async def _human(self) -> bool:
        answer = self.get_body_argument("g-recaptcha-response", "", strip=True)
        if not answer:
            return False
        data = {"secret": self.authenticator.recaptcha_secret, "response": answer}

        def verify() -> bool:
            return bool(
                requests.post(RECAPTCHA_VERIFY, data=data, timeout=10).json().get("success")
            )

        try:
            return await asyncio.to_thread(verify)
        except (requests.RequestException, ValueError):
            return False


def _known(handler, name: str) -> UserInfo:
    info = handler.authenticator.get_user(name)
    if info is None:
        raise web.HTTPError(404, f"No sign-up named {name!r}")
    return info


class AuthorizationArea(AuthorizationAreaHandler):
    """``/hub/authorize``: every sign-up, with POST forms (XSRF token included) for each action."""

    @admin_users_scope
    async def get(self) -> None:
        html = await self.render_template(
            "signup-authorize.html",
            ask_email=self.authenticator.ask_email_on_signup,
            # Those waiting for approval first: they are why the admin came.
            users=self.db.query(UserInfo).order_by(UserInfo.is_authorized, UserInfo.username).all(),
        )
        self.finish(html)


class Authorize(ToggleAuthorizationHandler):
    """``/hub/authorize/NAME``: GET shows a confirmation button; POST sets the approval."""

    @admin_users_scope
    async def get(self, name: str) -> None:
        info = _known(self, name)
        wanted = not info.is_authorized
        html = await self.render_template(
            ACTION_PAGE,
            title=f"{'Approve' if wanted else 'Withdraw approval of'} {name}?",
            action=f"{self.hub.base_url}authorize/{name}",
            fields={"authorized": "1" if wanted else "0"},
            button="Approve" if wanted else "Withdraw approval",
            danger=not wanted,
        )
        self.finish(html)

    @admin_users_scope
    async def post(self, name: str) -> None:
        wanted = self.get_body_argument("authorized", None)
        if wanted not in ("0", "1"):
            raise web.HTTPError(400, "authorized: must be 1 (approve) or 0 (withdraw approval)")
        info = _known(self, name)
        if info.is_authorized != (wanted == "1"):
            UserInfo.change_authorization(self.db, name)
            self.log.info(
                "%s %s the sign-up %s",
                self.current_user.name,
                "approved" if wanted == "1" else "withdrew approval of",
                name,
            )
        self.redirect(f"{self.hub.base_url}authorize#{name}")


class Discard(DiscardHandler):
    """``/hub/discard/NAME``: GET shows a confirmation button; POST deletes a pending sign-up."""

    @admin_users_scope
    async def get(self, name: str) -> None:
        info = _known(self, name)
        if info.is_authorized:
            raise web.HTTPError(409, f"{name} is approved; withdraw the approval before discarding")
        html = await self.render_template(
            ACTION_PAGE,
            title=f"Discard the sign-up {name}?",
            action=f"{self.hub.base_url}discard/{name}",
            fields={},
            button="Discard",
            danger=True,
        )
        self.finish(html)

    @admin_users_scope
    async def post(self, name: str) -> None:
        info = _known(self, name)
        if info.is_authorized:
            raise web.HTTPError(409, f"{name} is approved; withdraw the approval before discarding")
        # As NativeAuthenticator does it: its sign-up row, then the hub's user if there is one.
        self.authenticator.delete_user(type("User", (), {"name": info.username}))
        if self.users.get(info.username) is not None:
            self.users.delete(info.username)
        self.log.info("%s discarded the sign-up %s", self.current_user.name, name)
        self.redirect(f"{self.hub.base_url}authorize")


class ConfirmByEmail(EmailAuthorizationHandler):
    """``/hub/confirm/SLUG`` (self-approval by a signed e-mail link): GET shows a button, POST
    approves. Mail scanners and link previews fetch links with GET; they approve nothing."""

    async def get(self, slug: str) -> None:
        if not self.authenticator.allow_self_approval_for:
            raise web.HTTPError(404, "Self-approval by e-mail is not enabled on this hub")
        html = await self.render_template(
            ACTION_PAGE,
            title="Confirm your sign-up?",
            action=f"{self.hub.base_url}confirm/{slug}",
            fields={},
            button="Confirm",
            danger=False,
        )
        self.finish(html)

    async def post(self, slug: str) -> None:
        await EmailAuthorizationHandler.get(self, slug)


REPLACEMENTS = {
    SignUpHandler: SignUp,
    AuthorizationAreaHandler: AuthorizationArea,
    ToggleAuthorizationHandler: Authorize,
    DiscardHandler: Discard,
    EmailAuthorizationHandler: ConfirmByEmail,
}
