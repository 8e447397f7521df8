"""The preemption webhook cannot be aimed at the platform's own host: loopback, private and
link-local addresses are refused (also behind a host name), redirects are not followed, and the
user learns only whether it was delivered."""

from __future__ import annotations

import http.server
import threading

import pytest

from gpulab.spawners.market.outbound import (
    RefusedURL,
    parse_networks,
    post_blocking,
    resolve_checked,
)

NONE: list = []


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8001/api/routes",
        "http://localhost:8081/hub/api/users",
        "http://[::1]:8001/",
        "http://[::ffff:127.0.0.1]:8001/",
        "http://10.1.2.3/",
        "http://172.17.0.1:10101/",
        "http://192.168.1.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://0.0.0.0:8001/",
        "ftp://example.com/",
        "http://user:pw@example.com/",
    ],
)
def test_internal_or_odd_urls_are_refused(url: str) -> None:
    with pytest.raises(RefusedURL):
        resolve_checked(url, NONE)
    assert post_blocking(url, b"{}", {}, allowed=NONE).public() == {
        "delivered": False,
        "error": "not delivered",
    }


class _Handler(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_POST(self) -> None:
        self.hits.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/redirect":
            self.send_response(307)
            self.send_header("Location", "/internal")
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"x" * 100_000)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    _Handler.hits = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_an_operator_allowed_network_is_reached_and_redirects_are_not_followed(server) -> None:
    allowed = parse_networks(["127.0.0.0/8"])
    ok = post_blocking(server + "/hook", b"{}", {}, allowed=allowed, max_bytes=10)
    assert ok.delivered and ok.public() == {"delivered": True}
    moved = post_blocking(server + "/redirect", b"{}", {}, allowed=allowed)
    assert not moved.delivered and "307" in moved.detail
    assert _Handler.hits == ["/hook", "/redirect"]


def test_without_the_operators_allowance_loopback_is_never_contacted(server) -> None:
    out = post_blocking(server + "/hook", b"{}", {}, allowed=NONE)
    assert not out.delivered and out.detail.startswith("refused")
    assert _Handler.hits == []


def test_bad_allowed_networks_are_named() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        parse_networks(["nope"])
