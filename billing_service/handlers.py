"""Thin Tornado handlers: authenticate with the hub, authorize by name or scope, call the store.

Authorization: every hub user, server token and service is identified through JupyterHub
(OAuth cookie or ``Authorization: token …``); a caller sees and reports only its own user's data,
and a token holding ``admin:users`` (hub admins, the hub's own hooks) may act on every user.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from gpulab.billing_service import compensation, courses, ledger, reservations, statements
from gpulab.billing_service.chart import bar_chart
from gpulab.billing_service.hub_links import HubLinks
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import to_micro
from gpulab.billing_service.schemas import HUB_KINDS, BatchError, parse_batch

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


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    # Every identified hub user/service gets in; each handler checks whose data it may touch.
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

    def is_admin(self) -> bool:
        return ADMIN_SCOPE in set(self.current_user.get("scopes", []))

    def require_login(self) -> dict[str, Any]:
        if self.current_user is None:
            raise web.HTTPError(403, "authenticate with a JupyterHub token or log in")
        return self.current_user

    def require_user(self, name: str) -> None:
        model = self.require_login()
        if self.is_admin():
            return
        if model.get("kind", "user") != "user" or model["name"] != name:
            raise web.HTTPError(403, f"{model['name']} may not see or change {name}'s billing")

    def require_admin(self) -> None:
        model = self.require_login()
        if not self.is_admin():
            raise web.HTTPError(403, f"{model['name']} lacks the {ADMIN_SCOPE} scope")

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


class FieldError(web.HTTPError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(400, "%s", f"{field}: {message}")
        self.field = field


class EventsHandler(BaseHandler):
    """Usage events: reporters post their own server's, the hub (and admins) post anything.

    A reporter's token is the server's own (``JUPYTERHUB_API_TOKEN``), readable by any code in
    that server, so it is trusted with nothing but its server: it must hold
    ``custom:gpulab:report-usage!server=USER/NAME`` for the server each event names (JupyterHub
    gives it exactly that, see ``hub_config/scopes.py``), may not send hub kinds, and its events
    are checked against the session the hub reported (``bounds``). The scope's filter depends on
    the event, so it is checked here per event rather than through ``hub_scopes``.
    """

    async def post(self) -> None:
        model = self.require_login()
        try:
            events = parse_batch(self.json_body(), time.time())
        except BatchError as e:
            raise FieldError(e.field, str(e).split(": ", 1)[1]) from None
        admin = self.is_admin()
        if not admin:
            scopes = set(model.get("scopes", []))
            for i, ev in enumerate(events):
                if ev.kind in HUB_KINDS:
                    raise web.HTTPError(
                        403, f"events[{i}].kind: {ev.kind} events come from the hub only"
                    )
                if model.get("kind", "user") != "user" or ev.user != model["name"]:
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
        result = await self.billing.run_db(
            ingest,
            self.billing.engine,
            events,
            self.billing.prices,
            self.billing.trial_micro,
            now_us(),
            None if admin else self.billing.limits,
        )
        if result.rejected and not result.accepted and not result.duplicates:
            # Nothing of the batch was taken: answer like any other refused input.
            first = result.rejected[0]
            self.set_status(400)
            self.write_json(
                {
                    "status": 400,
                    "message": f"{first.field}: {first.message}",
                    "field": first.field,
                    **result.to_json(),
                },
                400,
            )
            return
        self.write_json(result.to_json())


class UsageHandler(BaseHandler):
    async def get(self, name: str) -> None:
        self.require_user(name)
        now = now_us()
        to_us = parse_time("to", self.get_argument("to", None), now)
        from_us = parse_time("from", self.get_argument("from", None), month_start(now))
        data = await self.billing.read(statements.usage, self.billing.prices, name, from_us, to_us)
        self.write_json(data)


class BalanceHandler(BaseHandler):
    """The balance; with ``?course=C`` also where the user stands in course C (``course``)."""

    async def get(self, name: str) -> None:
        self.require_user(name)
        course = self.get_argument("course", None)
        if course is not None:
            course = checked_course(course)
        self.write_json(await self.billing.balance(name, course))


def parse_credit(body: Any) -> tuple[str, int, str, str]:
    """A credit's (kind, amount in micro-units, idempotency key, note), or 400 naming a field."""
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object with amount, kind, idempotency_key")
    allowed = {"amount", "kind", "idempotency_key", "note"}
    extra = sorted(set(body) - allowed)
    if extra:
        raise FieldError(extra[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")
    kind = body.get("kind", "topup")
    if kind not in ledger.CREDIT_KINDS:
        raise FieldError("kind", f"{kind!r}; allowed: {', '.join(ledger.CREDIT_KINDS)}")
    raw = body.get("amount")
    try:
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise InvalidOperation
        amount = to_micro(Decimal(str(raw)))
    except (InvalidOperation, ValueError):
        raise FieldError(
            "amount", f'{raw!r} is not a decimal string with at most 6 decimals, e.g. "5.00"'
        ) from None
    if amount == 0 or (kind == "topup" and amount < 0):
        raise FieldError("amount", "a top-up is positive; an adjustment is non-zero")
    key = body.get("idempotency_key")
    if not isinstance(key, str) or not 1 <= len(key) <= 200:
        raise FieldError("idempotency_key", "a string of 1-200 characters is required")
    note = body.get("note", "")
    if not isinstance(note, str):
        raise FieldError("note", "must be a string")
    return kind, amount, key, note


class CreditsHandler(BaseHandler):
    """Admin top-ups and adjustments, each applied once per idempotency key."""

    async def post(self, name: str) -> None:
        self.require_admin()
        kind, amount, key, note = parse_credit(self.json_body())
        try:
            entry, created = await self.billing.run_db(
                self.billing.credit, ledger.user(name), kind, amount, key, note, self.model["name"]
            )
        except ledger.IdempotencyConflict as e:
            raise web.HTTPError(409, "%s", str(e)) from None
        out = entry.to_json()
        out["idempotency_key"] = key  # as the caller gave it (stored as credit:KEY)
        out["created"] = created
        out["balance"] = (await self.billing.balance(name))["balance"]
        self.write_json(out, 201 if created else 200)

    async def get(self, name: str) -> None:
        self.require_user(name)
        self.write_json({"entries": await self.billing.read(self.billing.entries, name)})


class CompensationsHandler(BaseHandler):
    """The hub credits a user for work a platform reclaim lost (see ``compensation``)."""

    async def post(self, name: str) -> None:
        self.require_admin()
        body = self.json_body()
        if not isinstance(body, dict):
            raise FieldError(
                "body", "must be a JSON object with reason, checkpoint, idempotency_key"
            )
        allowed = {"server", "at", "reason", "checkpoint", "idempotency_key", "note"}
        extra = sorted(set(body) - allowed)
        if extra:
            raise FieldError(extra[0], f"unknown field; allowed: {', '.join(sorted(allowed))}")
        server = body.get("server", "")
        if not isinstance(server, str) or len(server) > 255:
            raise FieldError("server", 'a server name ("" for the default server)')
        at = body.get("at")
        if at is not None and (isinstance(at, bool) or not isinstance(at, int | float) or at <= 0):
            raise FieldError("at", "the reclaim time in seconds since the Unix epoch")
        reason = body.get("reason")
        if reason not in compensation.REASONS:
            raise FieldError("reason", f"{reason!r}; allowed: {', '.join(compensation.REASONS)}")
        checkpoint = body.get("checkpoint")
        if checkpoint not in compensation.CHECKPOINT_OUTCOMES:
            raise FieldError(
                "checkpoint",
                f"{checkpoint!r}; allowed: {', '.join(compensation.CHECKPOINT_OUTCOMES)} "
                "(only a checkpoint the platform cut short or never ran is compensated; one that "
                "saved the work, failed or timed out on its own is not)",
            )
        key = body.get("idempotency_key")
        if not isinstance(key, str) or not 1 <= len(key) <= 200:
            raise FieldError("idempotency_key", "a string of 1-200 characters is required")
        note = body.get("note", "")
        if not isinstance(note, str) or len(note) > 1000:
            raise FieldError("note", "a string of at most 1000 characters")
        at_us = None if at is None else round(at * MICRO)
        try:
            out = await self.billing.run_db(
                self.billing.compensate,
                name,
                server,
                at_us,
                reason,
                checkpoint,
                key,
                note,
                self.model["name"],
            )
        except ledger.IdempotencyConflict as e:
            raise web.HTTPError(409, "%s", str(e)) from None
        if out is None:
            label = f"{name}/{server}"
            raise web.HTTPError(
                404, "%s", f"server {label} has no session{' started by then' if at else ''}"
            )
        out["balance"] = (await self.billing.balance(name))["balance"]
        self.write_json(out, 201 if out["created"] else 200)


def checked_course(course: str) -> str:
    try:
        return courses.check_name(course)
    except courses.SettingsError as e:
        raise FieldError(e.field, str(e).split(": ", 1)[1]) from None


class CourseHandler(BaseHandler):
    """``courses/C``: its settings, pool and students (GET: admins and the course's staff); set
    its cap and rules (PUT: admins and its teachers)."""

    def require_course_scope(self, course: str, *scopes: str) -> None:
        model = self.require_login()
        if self.is_admin():
            return
        held = set(model.get("scopes", []))
        if not any(f"{scope}!group={course}" in held for scope in scopes):
            raise web.HTTPError(
                403,
                "%s",
                f"{model['name']} may not {'see' if len(scopes) > 1 else 'change'} course "
                f"{course} (needs {scopes[-1]}!group={course} or {ADMIN_SCOPE})",
            )

    async def get(self, course: str) -> None:
        course = checked_course(course)
        # Teachers (course-manage) may read what they manage.
        self.require_course_scope(course, COURSE_MANAGE_SCOPE, COURSE_READ_SCOPE)
        self.write_json(await self.billing.read(self.billing.course_info, course))

    async def put(self, course: str) -> None:
        course = checked_course(course)
        self.require_course_scope(course, COURSE_MANAGE_SCOPE)
        body = self.json_body()
        try:
            await self.billing.run_db(self.billing.set_course, course, body, self.model["name"])
        except courses.SettingsError as e:
            raise FieldError(e.field, str(e).split(": ", 1)[1]) from None
        self.write_json(await self.billing.read(self.billing.course_info, course))


class CourseCreditsHandler(BaseHandler):
    """``courses/C/credits``: an admin tops up (or adjusts) a course's pool, once per key."""

    async def post(self, course: str) -> None:
        self.require_admin()
        course = checked_course(course)
        kind, amount, key, note = parse_credit(self.json_body())
        try:
            entry, created = await self.billing.run_db(
                self.billing.credit,
                ledger.pool(course),
                kind,
                amount,
                key,
                note,
                self.model["name"],
            )
        except ledger.IdempotencyConflict as e:
            raise web.HTTPError(409, "%s", str(e)) from None
        info = await self.billing.read(self.billing.course_info, course)
        self.write_json(
            {
                "id": entry.id,
                "course": course,
                "kind": entry.kind,
                "amount": statements.money(entry.amount_micro),
                "created_us": entry.created_us,
                "note": entry.note,
                "actor": entry.actor,
                "idempotency_key": key,
                "created": created,
                "pool_balance": info["pool_balance"],
            },
            201 if created else 200,
        )


class PaymentRequiredError(web.HTTPError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(402, "%s", message)
        self.field = field


class ReservationsHandler(BaseHandler):
    """``reservations``: the hub (and admins) reserve cards prepaid (POST, once per id); admins,
    a user (their own ``user:NAME``) and a course's staff (``course:C``) list them (GET)."""

    async def post(self) -> None:
        self.require_admin()
        try:
            req = reservations.parse(self.json_body(), self.billing.prices)
        except reservations.ReservationError as e:
            raise FieldError(e.field, str(e).split(": ", 1)[1]) from None
        try:
            out = await self.billing.run_db(self.billing.reserve, req, self.model["name"])
        except reservations.PaymentRequired as e:
            raise PaymentRequiredError(e.field, e.message) from None
        except reservations.Conflict as e:
            raise web.HTTPError(409, "%s", str(e)) from None
        self.write_json(out, 201 if out["created"] else 200)

    async def get(self) -> None:
        model = self.require_login()
        account = self.get_argument("account", None)
        if account is not None:
            try:
                kind, name = reservations.parse_account(account)
            except reservations.ReservationError as e:
                raise FieldError(e.field, str(e).split(": ", 1)[1]) from None
        if not self.is_admin():
            held = set(model.get("scopes", []))
            if account is None:
                raise FieldError("account", "required: 'user:NAME' or 'course:NAME'")
            if kind == "user":
                allowed = model.get("kind", "user") == "user" and model["name"] == name
            else:
                allowed = any(
                    f"{scope}!group={name}" in held
                    for scope in (COURSE_READ_SCOPE, COURSE_MANAGE_SCOPE)
                )
            if not allowed:
                raise web.HTTPError(
                    403,
                    "%s",
                    f"{model['name']} may not see the reservations of {account}"
                    + (f" (needs {COURSE_READ_SCOPE}!group={name})" if kind == "course" else ""),
                )
        items = await self.billing.read(self.billing.list_reservations, account)
        self.write_json(
            {"account": account, "currency": self.billing.catalog.currency, "reservations": items}
        )


class OverviewHandler(BaseHandler):
    async def get(self) -> None:
        self.require_admin()
        now = now_us()
        to_us = parse_time("to", self.get_argument("to", None), now)
        from_us = parse_time("from", self.get_argument("from", None), month_start(now))
        data = await self.billing.read(
            statements.admin_overview, self.billing.prices, from_us, to_us
        )
        data["pool"] = await self.billing.pool_snapshot()
        self.write_json(data)


class StatementPage(BaseHandler):
    """The statement page: one user's usage and balance; the admin also sees everyone.

    It is laid out as a page of the hub (its navigation bar, stylesheet and logo, see
    ``hub_links``), with the spend per day drawn from the usage API's own ``daily``."""

    @web.authenticated
    async def get(self) -> None:
        me = self.current_user["name"]
        name = self.get_argument("user", me)
        self.require_user(name)
        now = now_us()
        to_us = parse_time("to", self.get_argument("to", None), now)
        from_us = parse_time("from", self.get_argument("from", None), month_start(now))
        usage = await self.billing.read(statements.usage, self.billing.prices, name, from_us, to_us)
        balance = await self.billing.balance(name)
        overview = None
        if self.is_admin():
            overview = await self.billing.read(
                statements.admin_overview, self.billing.prices, from_us, to_us
            )
            overview["pool"] = await self.billing.pool_snapshot()
        entries = await self.billing.read(self.billing.entries, name)
        self.render(
            "statement.html",
            me=me,
            name=name,
            usage=usage,
            chart=bar_chart(usage["daily"], usage["currency"], usage["time_zone"]),
            balance=balance,
            overview=overview,
            entries=entries[-50:],
            prefix=self.billing.prefix,
            hub=HubLinks(self.hub_auth.hub_prefix),
            # As the hub's own navigation bar: its admin page for those who may open it.
            hub_admin="admin-ui" in set(self.current_user.get("scopes", [])),
            from_arg=self.get_argument("from", ""),
            to_arg=self.get_argument("to", ""),
            xsrf=self._xsrf_value() if overview is not None else "",
        )

    def _xsrf_value(self) -> str:
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else token
