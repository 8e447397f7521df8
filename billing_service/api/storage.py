"""Storage: ``GET users/NAME/storage?from=&to=`` (the user themself or an admin: the days charged,
each charged piece of time and the home's latest measurement) and ``POST storage/pull`` (admins:
read the hub's storage scan now, e.g. after a quota change, instead of at the next interval).

No endpoint takes storage figures: billing reads them from the hub alone (``storage``), so a
user's or a server's token has nothing to post them to."""

from __future__ import annotations

from tornado import web

from gpulab.billing_service import storage
from gpulab.billing_service.api.base import BaseHandler


class UserStorageHandler(BaseHandler):
    async def get(self, name: str) -> None:
        self.require_user(name)
        from_us, to_us = self.period()
        cat = self.billing.catalog

        def read(conn):
            out = storage.usage(conn, cat.storage, cat.currency, name, from_us, to_us)
            out["user"] = name
            out["pieces"] = storage.pieces(conn, name, from_us, to_us)
            return out

        self.write_json(await self.billing.read(read))


class PullHandler(BaseHandler):
    async def post(self) -> None:
        self.require_admin()
        # Whatever the body says is not read: the figures come from the hub's own scan.
        result = await self.billing.storage_metering.pull()
        if result is None:
            raise web.HTTPError(502, "the hub gave no storage scan (see billing's log)")
        self.write_json(
            {
                "homes": result.homes,
                "released": result.released,
                "failed": result.failed,
                "posted": storage.money_json(result.posted_micro),
            }
        )
