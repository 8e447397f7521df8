"""What the billing service asks of the hub: stop a server, move it to no-GPU, read the pool,
and whether the hub runs a server (billing reaches the hub only through its REST API)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.catalog import NO_GPU

log = logging.getLogger("gpulab.billing")


class HubClient:
    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token

    @classmethod
    def from_env(cls) -> HubClient:
        return cls(
            os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
            os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        )

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        req = HTTPRequest(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}),
            request_timeout=30,
            allow_nonstandard_methods=True,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            if e.response is None:
                raise
            resp = e.response
        text = resp.body.decode() if resp.body else ""
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = text
        return resp.code, data

    @staticmethod
    def server_path(user: str, server: str) -> str:
        base = f"/users/{quote(user, safe='')}"
        return f"{base}/servers/{quote(server, safe='')}" if server else f"{base}/server"

    async def pool(self) -> dict[str, Any] | None:
        try:
            code, data = await self.request("GET", "/gpulab/pool")
        except OSError:
            return None
        return data if code == 200 else None

    async def server_model(self, user: str, server: str) -> dict[str, Any] | None:
        code, data = await self.request("GET", f"/users/{quote(user, safe='')}")
        if code != 200:
            return None
        return (data.get("servers") or {}).get(server)

    async def runs(self, user: str, server: str) -> bool:
        """Whether the hub runs (or is starting) this server now; raises when the hub cannot
        say (unreachable, or an answer other than the user's model or 404), so that a hub's
        hiccup never reads as "not running"."""
        code, data = await self.request("GET", f"/users/{quote(user, safe='')}")
        if code == 404:
            return False
        if code != 200 or not isinstance(data, dict):
            raise RuntimeError(f"the hub could not say whether {user}/{server} runs: {code}")
        return server in (data.get("servers") or {})

    async def stop_server(self, user: str, server: str) -> int:
        code, _ = await self.request("DELETE", self.server_path(user, server))
        return code

    async def move_to_no_gpu(self, user: str, server: str, options: dict[str, Any]) -> str:
        """Restart a GPU server in no-GPU mode with the same home, image and datasets.

        Uses the hub's switch endpoint where this gpulab has it; otherwise stops the server and
        starts it again with ``gpu: NO_GPU`` through the standard API. Returns what was done.
        """
        switch = f"/gpulab/users/{quote(user, safe='')}/switch"
        if not server:
            code, data = await self.request("POST", switch, {"gpu": NO_GPU})
            if code in (200, 202):
                return "switched"
            if code != 404:
                raise RuntimeError(f"switch of {user} to no-GPU refused: {code} {data}")
        new_options = {k: v for k, v in options.items() if k in ("image", "datasets")}
        new_options["gpu"] = NO_GPU
        code = await self.stop_server(user, server)
        if code not in (202, 204):
            raise RuntimeError(f"stopping {user}/{server} failed with {code}")
        for _ in range(600):
            if await self.server_model(user, server) is None:
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"{user}/{server} did not stop within 60s")
        code, data = await self.request("POST", self.server_path(user, server), new_options)
        if code not in (201, 202):
            raise RuntimeError(f"restarting {user}/{server} without GPU failed: {code} {data}")
        return "restarted"
