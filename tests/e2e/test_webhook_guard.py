"""The spot preemption webhook cannot turn the hub into a probe of its own host: a user's webhook
aimed at the proxy's API (loopback) is never sent, and the user learns only "not delivered"."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from harness import wait_for


@pytest.fixture(scope="module")
def plain_hub(module_hub_factory):
    """A hub with the default webhook rules (no network allowed besides public ones)."""
    return module_hub_factory("webhook-hub", simulate="RTX-4090:1")


class Listener:
    """Something on the hub's host that must never hear from the webhook."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.hits.append(self.path)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_webhook_to_loopback_is_refused_and_the_user_sees_only_not_delivered(plain_hub) -> None:
    hub = plain_hub
    listener = Listener()
    try:
        for target in (
            f"http://127.0.0.1:{hub.proxy_api_port}/api/routes",
            f"http://localhost:{listener.port}/x",
        ):
            user = hub.create_user()
            r = hub.api("PUT", f"/gpulab/spot/settings/{user}", json={"webhook_url": target})
            assert r.status_code == 200, r.text
            assert hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.30"}).ok
            hub.spawn_ready(user, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.40"})
            assert hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.50"}).ok

            def warned(user: str = user):
                recs = [
                    p
                    for p in hub.api("GET", "/gpulab/spot/preemptions").json()["preemptions"]
                    if p["user"] == user and p.get("webhook")
                ]
                return recs[-1] if recs else None

            record = wait_for(warned, 60, 0.5, "the preemption warning's webhook")
            assert record["webhook"]["delivered"] is False
            assert record["webhook"]["error"] == "not delivered"
            assert "status" not in record["webhook"]
            assert hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": None}).ok
            hub.stop_server(user)
        time.sleep(0.2)
        assert listener.hits == []
    finally:
        listener.server.shutdown()
