"""The one base of billing's API handlers: who the caller is, the authorization rules, errors.

Every handler of ``billing_service/api`` is thin (JupyterHub-handler style): it parses its
arguments, asks one of the rules here whether the caller may, and calls the store. Each rule
lives here once:

- ``require_login``: any identified hub user, server token or service (OAuth cookie or
  ``Authorization: token …``);
- ``require_admin``: a token holding ``admin:users`` (hub admins, the hub's own hooks);
- ``require_user(NAME)``: that user themself, or an admin;
- ``require_course(C, scopes…)``: an admin, or a holder of one of the course's staff scopes
  (``custom:gpulab:course-read!group=C``, ``…course-manage!group=C``);
- ``require_account(ACCOUNT)``: an admin; the user of ``user:NAME``; the staff of ``course:C``;
- ``require_report(EVENTS)``: an admin, or a server's own token for events of that server only.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from gpulab.billing_service import courses
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.schemas import HUB_KINDS

if TYPE_CHECKING:
    from gpulab.billing_service.app import BillingService

ADMIN_SCOPE = "admin:users"
# Defined by the hub (hub_config/scopes.py); billing imports nothing of the hub, so it is named here.
REPORT_SCOPE = "custom:gpulab:report-usage"
# Course staff (hub_config/scopes.py, filtered by the course's group): TAs and teachers read a
# course's money (``!group=COURSE``), teachers also set its cap and rules.
COURSE_READ_SCOPE = "custom:gpulab:course-read"
COURSE_MANAGE_SCOPE = "custom:gpulab:course-manage"


def now_us() -> int:
    return time.time_ns() // 1000


def parse_time(field: str, value: str | None, default: int) -> int:
    """``from``/``to``: a date (2026-11-01), an ISO datetime, or Unix seconds."""
    if value is None or value == "":
        return default
    try:
        return round(float(value) * MICRO)
    except ValueError:
        pass
    try:
        if len(value) == 10:
            d = date.fromisoformat(value)
            dt = datetime(d.year, d.month, d.day, tzinfo=UTC)
        else:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=UTC)
    except ValueError:
        raise web.HTTPError(
            400, f"{field}: {value!r} is not a date (YYYY-MM-DD), ISO datetime or Unix time"
        ) from None
    return int(dt.timestamp()) * MICRO + dt.microsecond


def month_start(t_us: int) -> int:
    d = datetime.fromtimestamp(t_us / MICRO, UTC)
    return int(datetime(d.year, d.month, 1, tzinfo=UTC).timestamp()) * MICRO


class FieldError(web.HTTPError):
    """400 naming the offending field (``field`` in the JSON error)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(400, "%s", f"{field}: {message}")
        self.field = field

    @classmethod
    def of(cls, e: Exception) -> FieldError:
        """From a store error that names its field (``str(e)`` is ``"FIELD: message"``)."""
        field = e.field  # type: ignore[attr-defined]
        return cls(field, str(e).split(": ", 1)[1])


class PaymentRequiredError(web.HTTPError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(402, "%s", message)
        self.field = field


def checked_course(course: str) -> str:
    try:
        return courses.check_name(course)
    except courses.SettingsError as e:
        raise FieldError.of(e) from None


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    # Every identified hub user/service gets in; each handler asks a rule below whose data it may
    # touch.
    hub_scopes = None

    def set_default_headers(self) -> None:
        # Billing's pages (the admin's credit form among them) are framed by nobody but the hub's
        # own origin: a user's page on a sibling subdomain must not overlay them (clickjacking).
        self.set_header("Content-Security-Policy", "frame-ancestors 'self'")
        self.set_header("X-Frame-Options", "SAMEORIGIN")

    def check_xsrf_cookie(self) -> None:
        # Token-authenticated API calls cannot be forged by another site; only cookie (browser)
        # requests need the XSRF token.
        if self.request.headers.get("Authorization", "").lower().startswith(("token ", "bearer ")):
            return
        super().check_xsrf_cookie()

    @property
    def billing(self) -> BillingService:
        return self.settings["billing"]

    @property
    def model(self) -> dict[str, Any]:
        return self.current_user

    # ---- the rules ---------------------------------------------------------------------------

    def scopes(self) -> set[str]:
        return set(self.current_user.get("scopes", []))

    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes()

    def is_user(self, name: str) -> bool:
        """The caller is the hub user ``name`` (not a service of that name)."""
        model = self.current_user
        return model.get("kind", "user") == "user" and model["name"] == name

    def require_login(self) -> dict[str, Any]:
        if self.current_user is None:
            raise web.HTTPError(403, "authenticate with a JupyterHub token or log in")
        return self.current_user

    def require_admin(self) -> None:
        model = self.require_login()
        if not self.is_admin():
            raise web.HTTPError(403, f"{model['name']} lacks the {ADMIN_SCOPE} scope")

    def require_user(self, name: str) -> None:
        model = self.require_login()
        if not self.is_admin() and not self.is_user(name):
            raise web.HTTPError(403, f"{model['name']} may not see or change {name}'s billing")

    def is_course_staff(self, course: str, *scopes: str) -> bool:
        held = self.scopes()
        return any(f"{scope}!group={course}" in held for scope in scopes)

    def require_course(self, course: str, *scopes: str) -> None:
        """An admin, or a holder of one of ``scopes`` filtered to the course's group (the last
        one named in the refusal)."""
        model = self.require_login()
        if self.is_admin() or self.is_course_staff(course, *scopes):
            return
        raise web.HTTPError(
            403,
            "%s",
            f"{model['name']} may not {'see' if len(scopes) > 1 else 'change'} course "
            f"{course} (needs {scopes[-1]}!group={course} or {ADMIN_SCOPE})",
        )

    def require_account(self, account: str | None, kind: str, name: str) -> None:
        """Read access to an account's records: admins any (``None``: all); a user their own
        ``user:NAME``; a course's staff ``course:C``."""
        model = self.require_login()
        if self.is_admin():
            return
        if account is None:
            raise FieldError("account", "required: 'user:NAME' or 'course:NAME'")
        if kind == "user":
            allowed = self.is_user(name)
        else:
            allowed = self.is_course_staff(name, COURSE_READ_SCOPE, COURSE_MANAGE_SCOPE)
        if not allowed:
            raise web.HTTPError(
                403,
                "%s",
                f"{model['name']} may not see the reservations of {account}"
                + (f" (needs {COURSE_READ_SCOPE}!group={name})" if kind == "course" else ""),
            )

    def require_report(self, events: list) -> bool:
        """May the caller post these usage events? True for an admin (trusted, unbounded).

        A reporter's token is the server's own (``JUPYTERHUB_API_TOKEN``), readable by any code
        in that server, so it is trusted with nothing but its server: it must hold
        ``custom:gpulab:report-usage!server=USER/NAME`` for the server each event names
        (JupyterHub gives it exactly that, see ``hub_config/scopes.py``) and may not send hub
        kinds. The scope's filter depends on the event, so it is checked here per event rather
        than through ``hub_scopes``."""
        model = self.require_login()
        if self.is_admin():
            return True
        scopes = self.scopes()
        for i, ev in enumerate(events):
            if ev.kind in HUB_KINDS:
                raise web.HTTPError(
                    403, f"events[{i}].kind: {ev.kind} events come from the hub only"
                )
            if not self.is_user(ev.user):
                raise web.HTTPError(
                    403,
                    f"events[{i}].user: {model['name']} may not report usage of {ev.user!r}",
                )
            needed = f"{REPORT_SCOPE}!server={ev.user}/{ev.server}"
            if needed not in scopes:
                raise web.HTTPError(
                    403,
                    "%s",
                    f"events[{i}].server: this token may not report usage of server "
                    f"{ev.user}/{ev.server} (only that server's own token may: it holds "
                    f"{needed})",
                )
        return False

    # ---- input and output --------------------------------------------------------------------

    def period(self) -> tuple[int, int]:
        """``?from=&to=`` in microseconds (default: this month so far)."""
        now = now_us()
        to_us = parse_time("to", self.get_argument("to", None), now)
        from_us = parse_time("from", self.get_argument("from", None), month_start(now))
        return from_us, to_us

    def json_body(self) -> Any:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError as e:
            raise web.HTTPError(400, f"body: not valid JSON ({e})") from None

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        body: dict[str, Any] = {"status": status_code, "message": message}
        if getattr(exc, "field", None):
            body["field"] = exc.field
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))
