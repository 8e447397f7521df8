"""Statements: ``GET users/NAME/usage?from=&to=`` (the user themself or an admin) and
``GET admin/overview?from=&to=`` (admins)."""

from __future__ import annotations

from gpulab.billing_service import statements
from gpulab.billing_service.api.base import BaseHandler


class UsageHandler(BaseHandler):
    async def get(self, name: str) -> None:
        self.require_user(name)
        from_us, to_us = self.period()
        data = await self.billing.read(statements.usage, self.billing.prices, name, from_us, to_us)
        self.write_json(data)


class OverviewHandler(BaseHandler):
    async def get(self) -> None:
        self.require_admin()
        from_us, to_us = self.period()
        data = await self.billing.read(
            statements.admin_overview, self.billing.prices, from_us, to_us
        )
        data["pool"] = await self.billing.pool_snapshot()
        self.write_json(data)
