"""``reservations``: the hub (and admins) reserve cards prepaid (POST, once per id); admins, a
user (their own ``user:NAME``) and a course's staff (``course:C``) list them (GET)."""

from __future__ import annotations

from tornado import web

from gpulab.billing_service import reservations
from gpulab.billing_service.api.base import BaseHandler, FieldError, PaymentRequiredError


class ReservationsHandler(BaseHandler):
    async def post(self) -> None:
        self.require_admin()
        try:
            req = reservations.parse(self.json_body(), self.billing.prices)
        except reservations.ReservationError as e:
            raise FieldError.of(e) from None
        try:
            out = await self.billing.run_db(self.billing.reserve, req, self.model["name"])
        except reservations.PaymentRequired as e:
            raise PaymentRequiredError(e.field, e.message) from None
        except reservations.Conflict as e:
            raise web.HTTPError(409, "%s", str(e)) from None
        self.write_json(out, 201 if out["created"] else 200)

    async def get(self) -> None:
        self.require_login()
        account = self.get_argument("account", None)
        kind = name = ""
        if account is not None:
            try:
                kind, name = reservations.parse_account(account)
            except reservations.ReservationError as e:
                raise FieldError.of(e) from None
        self.require_account(account, kind, name)
        items = await self.billing.read(self.billing.list_reservations, account)
        self.write_json(
            {"account": account, "currency": self.billing.catalog.currency, "reservations": items}
        )
