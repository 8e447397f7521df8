"""A local server's port taken by another process is never the user's server (CI, stop 31).

The local spawner picks a free port and the server binds it a moment later; meanwhile any other
process of the host may listen there (another hub's job runner did in CI: the user's kernel
request was answered 403 by it). The spawner used to check only that the port accepts
connections, so the hub called the server ready and routed the user to the other process. Now
it asks the kernel who listens: a chosen port is tried again elsewhere; an operator's fixed
port is a clear error and nothing is routed to the squatter.
"""

from __future__ import annotations

import http.server
import threading

import pytest
import requests
from harness import Hub, free_port, wait_for

pytestmark = pytest.mark.usefixtures("chp_installed")


class Squatter:
    """Another process's HTTP server on the port (in this test process: not the hub's server)."""

    def __init__(self, port: int) -> None:
        self.requests: list[str] = []
        squatter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                squatter.requests.append(f"GET {self.path}")
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"not your server")

            do_POST = do_GET

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_fixed_port_someone_else_listens_on_fails_the_start_and_routes_nothing(hub_factory):
    port = free_port()
    squatter = Squatter(port)
    try:
        hub: Hub = hub_factory(
            "porttaken", simulate="RTX-4090:1", extra_args=[f"--GpuLocalSpawner.port={port}"]
        )
        user = hub.create_user()
        r = hub.spawn(user, {"gpu": "rtx-4090"})
        wait_for(lambda: (s := hub.server(user)) is None or s["ready"], 60, 0.2, "the start to end")
        assert hub.server(user) is None, "the hub called the squatter the user's server"
        assert r.status_code >= 400 and f"port {port} is another process" in r.text, r.text
        assert hub.free("rtx-4090") == 1  # its card went back
        k = requests.post(
            hub.user_url(user, "api/kernels"),
            json={},
            headers={"Authorization": f"token {hub.token}"},
            timeout=30,
        )
        # The hub answers (its 403 for a POST to a server that is not running); the squatter
        # was never asked anything.
        assert k.status_code in (403, 424) and "not your server" not in k.text, k.text
        assert not squatter.requests, squatter.requests
    finally:
        squatter.close()
