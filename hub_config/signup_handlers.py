"""NativeAuthenticator's sign-up approval pages, made safe against cross-site request forgery.

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
"""

from __future__ import annotations

from nativeauthenticator.handlers import (
    AuthorizationAreaHandler,
    DiscardHandler,
    EmailAuthorizationHandler,
    ToggleAuthorizationHandler,
    admin_users_scope,
)
from nativeauthenticator.orm import UserInfo
from tornado import web

ACTION_PAGE = "signup-action.html"


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
            users=self.db.query(UserInfo).order_by(UserInfo.username).all(),
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
    AuthorizationAreaHandler: AuthorizationArea,
    ToggleAuthorizationHandler: Authorize,
    DiscardHandler: Discard,
    EmailAuthorizationHandler: ConfirmByEmail,
}
