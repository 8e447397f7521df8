"""What a browser opens: the statement page (``/services/billing/``) and its CSV
(``statement.csv?user=&from=&to=``): a user's own, or any user's for an admin."""

from __future__ import annotations

import os
import re

from tornado import web

from gpulab.billing_service import csv_export, statements, storage
from gpulab.billing_service.api.base import BaseHandler, now_us
from gpulab.billing_service.chart import bar_chart
from gpulab.billing_service.hub_links import HubLinks
from gpulab.billing_service.rating import format_money


class StatementPage(BaseHandler):
    """One user's usage and balance; the admin also sees everyone.

    It is laid out as a page of the hub (its navigation bar, stylesheet and logo, see
    ``hub_links``), with the spend per day drawn from the usage API's own ``daily``, and one
    row per session and per credit (``statements.page_rows``), not per ledger entry."""

    @web.authenticated
    async def get(self) -> None:
        me = self.current_user["name"]
        name = self.get_argument("user", me)
        self.require_user(name)
        from_us, to_us = self.period()
        usage = await self.billing.read(statements.usage, self.billing.prices, name, from_us, to_us)
        balance = await self.billing.balance(name)
        spend = storage.with_storage(usage["daily"], usage["storage"])
        overview = None
        if self.is_admin():
            overview = await self.billing.read(
                statements.admin_overview, self.billing.prices, from_us, to_us
            )
            overview["pool"] = await self.billing.pool_snapshot()
        entries = await self.billing.read(self.billing.entries, name)
        now = now_us()
        self.render(
            "statement.html",
            me=me,
            name=name,
            usage=usage,
            # Sessions and storage: the chart shows all that was spent each day.
            chart=bar_chart(spend, usage["currency"], usage["time_zone"]),
            spend_total=format_money(sum(d["micro"] for d in spend)),
            balance=balance,
            overview=overview,
            rows=statements.page_rows(
                usage, entries, now, open_end=not self.get_argument("to", "")
            ),
            period=statements.human_period(usage, now),
            prefix=self.billing.prefix,
            hub=HubLinks(self.hub_auth.hub_prefix),
            # As the hub's own navigation bar: its admin page for those who may open it (the
            # hub grants this service's tokens admin-ui where the user has it), and its
            # Services menu, where the hub lists this service by its name.
            hub_admin="admin-ui" in self.scopes(),
            service_name=os.environ.get("JUPYTERHUB_SERVICE_NAME") or "billing",
            from_arg=self.get_argument("from", ""),
            to_arg=self.get_argument("to", ""),
            xsrf=self._xsrf_value() if overview is not None else "",
        )

    def _xsrf_value(self) -> str:
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else token


class CsvHandler(BaseHandler):
    """The statement as CSV (``csv_export``)."""

    @web.authenticated
    async def get(self) -> None:
        name = self.get_argument("user", self.current_user["name"])
        self.require_user(name)
        from_us, to_us = self.period()
        usage = await self.billing.read(statements.usage, self.billing.prices, name, from_us, to_us)
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        # The file name carries the user name: keep it to characters a header cannot misread.
        safe_name = re.sub(r"[^A-Za-z0-9._-]", "_", name)
        self.set_header("Content-Disposition", f'attachment; filename="statement-{safe_name}.csv"')
        self.finish(csv_export.render(usage))
