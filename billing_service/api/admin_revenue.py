"""``GET api/admin/revenue?days=N`` (admins): the money of the hub's admin console: revenue per
UTC day by GPU type, per user and the top 10 spenders, and every credit, refund, compensation
and debit given by hand or rule, with who gave it and why (``revenue.report``: the same sums as
the statements and billing's metrics). ``days``: 1 to 366, default 30 (today included).

A browser without billing's OAuth cookie is sent through the hub's log-in and back (the console
fetches this with the admin's session: the fetch follows the redirects); a token that is not an
admin's gets 403."""

from __future__ import annotations

from gpulab.billing_service import revenue
from gpulab.billing_service.api.base import BaseHandler, FieldError, now_us

MAX_DAYS = 366
DEFAULT_DAYS = 30


def parse_days(raw: str | None) -> int:
    """``days`` as an int in 1..366 (``DEFAULT_DAYS`` when absent), or 400 naming it."""
    if raw is None:
        return DEFAULT_DAYS
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_DAYS:
        raise FieldError("days", f"{raw!r}; allowed: a whole number of days from 1 to {MAX_DAYS}")
    return int(text)


class RevenueHandler(BaseHandler):
    async def get(self) -> None:
        if self.current_user is None and not self.request.headers.get("Authorization"):
            # A browser without billing's cookie yet (the console's first fetch): through the
            # hub's OAuth (no confirmation for billing) and back here, as the statement page.
            self.redirect(self.get_login_url())
            return
        self.require_admin()
        days = parse_days(self.get_argument("days", None))
        currency = self.billing.catalog.currency
        figures = await self.billing.read(
            revenue.report, currency, now_us(), days, self.billing.revenue_days
        )
        self.write_json(figures)
