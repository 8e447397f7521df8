"""The hub calling its own API never waits behind its own calls to billing.

A booking starts a class's servers through the hub's REST API (the market's ``HubClient``); each
start's gate asks billing for the balance (``BillingHooks``). On tornado's one shared client (10
requests at a time) a class of 40 filled all ten slots with self-calls whose balance checks then
queued behind them: every start failed with "billing unreachable: Timeout in request queue".
Here a real HTTP "hub" on loopback answers each start only after asking a real HTTP "billing",
as the hub's gate does, and 30 starts are asked at once.
"""

from __future__ import annotations

import asyncio
import json

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpulab.hub_config.billing.hooks import BillingHooks
from gpulab.spawners.market.hub_client import HubClient

CLASS = 30


class Balance(web.RequestHandler):
    async def get(self) -> None:
        await asyncio.sleep(0.05)
        self.finish(json.dumps({"balance": "10.00"}))


class Start(web.RequestHandler):
    async def post(self, user: str) -> None:
        await self.settings["hooks"]._call("GET", "balance")
        self.set_status(202)
        self.finish("{}")


async def _class_starts() -> list[int]:
    billing_sock, billing_port = bind_unused_port()
    hub_sock, hub_port = bind_unused_port()
    hooks = BillingHooks(f"http://127.0.0.1:{billing_port}/", "t", timeout=3.0)
    billing = HTTPServer(web.Application([(r"/balance", Balance)]))
    hub = HTTPServer(web.Application([(r"/users/([^/]+)/server", Start)], hooks=hooks))
    billing.add_sockets([billing_sock])
    hub.add_sockets([hub_sock])
    try:
        client = HubClient(f"http://127.0.0.1:{hub_port}", "t")
        answers = await asyncio.gather(
            *(client.start_server(f"st{i:03d}/", {}) for i in range(CLASS))
        )
        return [code for code, _ in answers]
    finally:
        hub.stop()
        billing.stop()


def test_a_class_starting_at_once_is_not_starved_by_its_own_balance_checks():
    codes = asyncio.run(_class_starts())
    assert codes == [202] * CLASS, f"answers: {sorted(set(codes))}, {codes.count(202)} started"
