"""``POST users/NAME/compensations``: the hub (and admins) credit a user for work a platform
reclaim lost (``compensation``)."""

from __future__ import annotations

from typing import Any

from tornado import web

from gpulab.billing_service import compensation, ledger
from gpulab.billing_service.api.base import BaseHandler, FieldError
from gpulab.billing_service.models import MICRO

FIELDS = {"server", "at", "reason", "checkpoint", "idempotency_key", "note"}


def parse_compensation(body: Any) -> tuple[str, int | None, str, str, str, str]:
    """(server, at in microseconds or None, reason, checkpoint, key, note), or 400 naming a
    field."""
    if not isinstance(body, dict):
        raise FieldError("body", "must be a JSON object with reason, checkpoint, idempotency_key")
    extra = sorted(set(body) - FIELDS)
    if extra:
        raise FieldError(extra[0], f"unknown field; allowed: {', '.join(sorted(FIELDS))}")
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
    return server, at_us, reason, checkpoint, key, note


class CompensationsHandler(BaseHandler):
    async def post(self, name: str) -> None:
        self.require_admin()
        server, at_us, reason, checkpoint, key, note = parse_compensation(self.json_body())
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
            when = " started by then" if at_us is not None else ""
            raise web.HTTPError(404, "%s", f"server {name}/{server} has no session{when}")
        out["balance"] = (await self.billing.balance(name))["balance"]
        self.write_json(out, 201 if out["created"] else 200)
