"""The billing service's real app and handlers served in-process on a fresh SQLite store, with
the hub's token check replaced by fixed token models, and a client for its API."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from harness import free_port
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer

from billing.courses import PRICES, TRIAL
from gpulab.billing_service.api import base
from gpulab.billing_service.app import BillingService
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.models import MICRO


def make_service(tmp_path, monkeypatch, tokens: dict[str, dict]) -> BillingService:
    """The billing app with its real handlers on a fresh SQLite store; ``Authorization: token
    NAME`` authenticates as ``tokens[NAME]`` (the hub's check replaced)."""

    def current_user(self):
        token = self.request.headers.get("Authorization", "").removeprefix("token ")
        return tokens.get(token)

    monkeypatch.setattr(base.BaseHandler, "get_current_user", current_user)
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
