"""Log-in for gpulab: NativeAuthenticator (sign-up in the browser) plus a bootstrapped admin,
and LTI 1.3 launches from an LMS when ``GpulabLTI`` is configured (:mod:`gpulab.hub_config.courses.lti`).

On first start the hub writes a random admin password to the data dir; this authenticator creates
the admin account with it, so there is never a fixed default password. Its ``get_handlers`` is
where JupyterHub lets gpulab in: it hands over to :func:`gpulab.hub_config.plugin.attach`, and
quiets the hub's log of routine refusals (:mod:`gpulab.hub_config.hub_log`).

Someone whose sign-up still waits for approval, and who gives the right password, is told so on
the log-in page instead of "Invalid username or password" (nobody else learns whether a name has
signed up).
"""

from __future__ import annotations

from pathlib import Path

from jupyterhub import orm
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler
from tornado.escape import url_escape
from tornado.httputil import url_concat
from traitlets import Bool, Integer, Unicode

from gpulab.hub_config import plugin
from gpulab.hub_config.courses.lti import GpulabLTI, LTILaunchHandler
from gpulab.hub_config.hub_log import quiet_refusals
from gpulab.hub_config.signup_handlers import REPLACEMENTS as SIGNUP_REPLACEMENTS


class GpulabHubMixin:
    """Lets gpulab into the hub through its authenticator, the one part JupyterHub asks for
    routes (mounted ahead of its own) at start-up, handing it the app: see
    :mod:`gpulab.hub_config.plugin`. Starting there means NVML problems show at start and orphans
    of a crash are swept even before anyone spawns.

    Mix it into any authenticator class to use that authenticator with gpulab.
    """

    def get_handlers(self, app) -> list:
        quiet_refusals(app.log)
        return [*super().get_handlers(app), *plugin.attach(app)]


class _NoStats:
    """JupyterHub 6 dropped ``handler.statsd``; NativeAuthenticator 1.3 still times logins with it."""

    def timer(self, *args, **kwargs) -> _NoStats:
        return self

    def start(self) -> _NoStats:
        return self

    def stop(self, *args, **kwargs) -> None:
        return None


# What the log-in page says to someone whose sign-up waits (right password, not yet approved).
PENDING_MESSAGE = (
    "Your sign-up waits for an administrator's approval: you can log in once they approve it."
)


class LoginHandler(NativeLoginHandler):
    """NativeAuthenticator's log-in page, made to work on JupyterHub 6, and telling a person
    whose sign-up waits for approval that it does."""

    statsd = _NoStats()
    # Set by GpulabAuthenticator.authenticate for this request: the password was right, but the
    # sign-up is not approved yet.
    gpulab_pending = False

    def _render(self, login_error=None, username=None, sync=False, **kwargs):
        if login_error and self.gpulab_pending:
            login_error = PENDING_MESSAGE
        # JupyterHub 6 renders failed form posts through _render(sync=True, ...): accept that.
        return self.render_template(
            "native-login.html",
            sync=sync,
            next=url_escape(self.get_argument("next", default="")),
            username=username,
            login_error=login_error,
            custom_html=self.authenticator.custom_html,
            login_url=self.settings["login_url"],
            enable_signup=self.authenticator.enable_signup,
            two_factor_auth=self.authenticator.allow_2fa,
            authenticator_login_url=url_concat(
                self.authenticator.login_url(self.hub.base_url),
                {"next": self.get_argument("next", "")},
            ),
        )


class GpulabAuthenticator(GpulabHubMixin, NativeAuthenticator):
    admin_password_file = Unicode(
        "",
        config=True,
        help="""File holding the initial admin password. On start, if the first admin user has
        no account yet, one is created with this password. Empty: no bootstrap.""",
    )
    # NativeAuthenticator's own settings, with gpulab's defaults (it ships with no lock-out and
    # no check against common passwords). c.NativeAuthenticator.* or c.GpulabAuthenticator.*
    # still override them.
    allowed_failed_logins = Integer(
        10,
        config=True,
        help="""Failed log-ins in a row after which an account is locked for
        seconds_before_next_try seconds (the right password is refused meanwhile). 0: never.""",
    )
    seconds_before_next_try = Integer(
        600,
        config=True,
        help="""How long (seconds, counted from the last failed try) an account stays locked
        after allowed_failed_logins failed log-ins.""",
    )
    check_common_password = Bool(
        True,
        config=True,
        help="""Refuse sign-ups (and password changes) whose password is among the 10,000 most
        common ones. The generated admin password is never checked.""",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # LTI 1.3 launches (off unless GpulabLTI.issuer is set); a half-done config stops here.
        self.lti = GpulabLTI(parent=self)
        self.lti.check()
        self._bootstrap_admin()

    async def authenticate(self, handler, data):
        # Only the LTI launch handler, after it checked the id_token, logs people in by LTI;
        # every other log-in (the form) is a password log-in.
        if isinstance(handler, LTILaunchHandler):
            return self.lti.authenticate(handler, data, taken=self.name_taken)
        name = await super().authenticate(handler, data)
        if name is None and isinstance(handler, LoginHandler):
            handler.gpulab_pending = self._waits_for_approval(data)
        return name

    def _waits_for_approval(self, data: dict) -> bool:
        """Whether these credentials are right but their sign-up is not approved yet."""
        info = self.get_user(data.get("username", ""))
        if info is None or info.is_authorized:
            return False
        if self.allowed_failed_logins and self.is_blocked(info.username):
            return False
        return info.is_valid_password(data.get("password", ""))

    def name_taken(self, name: str) -> bool:
        """Whether ``name`` is somebody's already (a hub user, a sign-up, an admin name), so
        that an LMS person never gets it."""
        return (
            name in self.admin_users
            or super().user_exists(name)
            or orm.User.find(self.db, name) is not None
        )

    def user_exists(self, username: str) -> bool:
        # A name an LMS person holds cannot be signed up for with a password.
        return super().user_exists(username) or self.lti.name_is_linked(
            self.db, self.normalize_username(username)
        )

    def create_user(self, username, password, **kwargs):
        """Sign-up. A name the hub already has a user for, with no password yet (a roster or
        an admin made it), is never approved by open sign-up: otherwise anyone could sign up
        as a rostered student and spend their course's credit. An admin approves it."""
        name = self.normalize_username(username)
        claimed = (
            name not in self.admin_users
            and orm.User.find(self.db, name) is not None
            and not super().user_exists(name)
        )
        if not claimed:
            return super().create_user(username, password, **kwargs)
        saved = self.open_signup
        self.open_signup = False
        try:
            info = super().create_user(username, password, **kwargs)
        finally:
            self.open_signup = saved
        if info is not None:
            self.log.warning("Sign-up for the existing user %s waits for an admin's approval", name)
        return info

    def _bootstrap_admin(self) -> None:
        if not self.admin_password_file or not self.admin_users:
            return
        admin = sorted(self.admin_users)[0]
        if self.user_exists(admin):
            return
        password = Path(self.admin_password_file).read_text().strip()
        # create_user refuses when sign-up is disabled or the password is "weak"; the generated
        # password is long and random, and bootstrap must work whatever sign-up policy is set.
        saved = self.enable_signup, self.check_common_password
        self.enable_signup, self.check_common_password = True, False
        try:
            if self.create_user(admin, password) is None:
                self.log.error("Could not create the admin account %r", admin)
            else:
                self.log.info("Created the admin account %r", admin)
        finally:
            self.enable_signup, self.check_common_password = saved

    def get_handlers(self, app) -> list:
        lti = self.lti.handlers(app.db) if self.lti.enabled else []
        # NativeAuthenticator's approve/discard/confirm act on a GET (cross-site request
        # forgery); gpulab's versions act only on a POST with the XSRF token.
        swaps = {NativeLoginHandler: LoginHandler, **SIGNUP_REPLACEMENTS}
        return [
            *lti,
            *((path, swaps.get(handler, handler)) for path, handler in super().get_handlers(app)),
        ]
