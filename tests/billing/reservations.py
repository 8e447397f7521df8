"""Helpers for the reservation tests: reserve through the service's own transaction, tagged
server starts, and the billing API served in-process with fixed token models."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from harness import free_port
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer

from billing.courses import PRICES, TRIAL
from billing.scenario import server_start
from gpulab.billing_service import handlers, reservations
from gpulab.billing_service.app import BillingService
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import PriceBook


def reserve(engine, body: dict, actor: str = "hub", prices: PriceBook = PRICES) -> dict:
    """POST reservations as the service runs it (parse, then ``BillingService.reserve``)."""
    app = SimpleNamespace(engine=engine, prices=prices, trial_micro=TRIAL, catalog=prices.catalog)
    return BillingService.reserve(app, reservations.parse(body, prices), actor)


def tagged_start(
    user: str,
    t: float,
    reservation: str | None,
    gpu: str = "a100-80g",
    gpus: int = 1,
    server: str = "",
    course: str | None = None,
) -> dict:
    """The hub's server_start of a server whose cards came from ``reservation``."""
    ev = server_start(user, t, gpu, gpus, server)
    options: dict[str, Any] = {**ev["options"], "reservation": reservation}
    if course is not None:
        options["course"] = course
    ev["options"] = options
    return ev


def make_service(tmp_path, monkeypatch, tokens: dict[str, dict]) -> BillingService:
    """The billing app with its real handlers on a fresh SQLite store; ``Authorization: token
    NAME`` authenticates as ``tokens[NAME]`` (the hub's check replaced)."""

    def current_user(self):
        token = self.request.headers.get("Authorization", "").removeprefix("token ")
        return tokens.get(token)

    monkeypatch.setattr(handlers.BaseHandler, "get_current_user", current_user)
    app = BillingService()
    app.catalog = PRICES.catalog
    app.prices = PRICES
    app.trial_micro = TRIAL
    app.warn_micro = [2 * MICRO]
    app.engine = make_engine(f"sqlite:///{tmp_path / 'billing.sqlite'}")
    upgrade(app.engine)
    app.executor = ThreadPoolExecutor(max_workers=1)
    app.prefix = "/services/billing/"
    return app


class Client:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/services/billing/api/v1/"

    async def call(self, method: str, path: str, token: str, body=None) -> tuple[int, Any]:
        req = HTTPRequest(
            self.base + path,
            method=method,
            headers={"Authorization": f"token {token}"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
        )
        resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        return resp.code, json.loads(resp.body or b"null")


def serve(service: BillingService, scenario) -> None:
    async def main():
        port = free_port()
        server = HTTPServer(service.make_app())
        server.listen(port, "127.0.0.1")
        try:
            await scenario(Client(port))
        finally:
            server.stop()

    asyncio.run(main())
