"""Credits of an account of the one ledger: ``users/NAME/credits`` (a user's balance: admins top
up or adjust, the user and admins list the entries) and ``courses/C/credits`` (a course's pool:
admins top up or adjust). Both apply a credit once per idempotency key (201 made, 200 replay,
409 the key used for something else) through ``ledger.credit``."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from tornado import web

from gpulab.billing_service import ledger, statements
from gpulab.billing_service.api.base import BaseHandler, FieldError, checked_course
from gpulab.billing_service.rating import to_micro


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


class CreditHandler(BaseHandler):
    """Applies a credit body to one account of the ledger (admins only)."""

    async def apply_credit(self, account: ledger.AccountId) -> tuple[ledger.Entry, bool, str]:
        self.require_admin()
        kind, amount, key, note = parse_credit(self.json_body())
        try:
            entry, created = await self.billing.run_db(
                self.billing.credit, account, kind, amount, key, note, self.model["name"]
            )
        except ledger.IdempotencyConflict as e:
            raise web.HTTPError(409, "%s", str(e)) from None
        return entry, created, key


class CreditsHandler(CreditHandler):
    """``users/NAME/credits``."""

    async def post(self, name: str) -> None:
        entry, created, key = await self.apply_credit(ledger.user(name))
        out = entry.to_json()
        out["idempotency_key"] = key  # as the caller gave it (stored as credit:KEY)
        out["created"] = created
        out["balance"] = (await self.billing.balance(name))["balance"]
        self.write_json(out, 201 if created else 200)

    async def get(self, name: str) -> None:
        self.require_user(name)
        self.write_json({"entries": await self.billing.read(self.billing.entries, name)})


class CourseCreditsHandler(CreditHandler):
    """``courses/C/credits``: answers the entry and the pool's balance after."""

    async def post(self, course: str) -> None:
        self.require_admin()
        course = checked_course(course)
        entry, created, key = await self.apply_credit(ledger.pool(course))
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
