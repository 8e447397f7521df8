"""Requests the hub sends to addresses a user chose (the preemption webhook), made safe.

A user-chosen URL must not turn the hub into a probe of its own host and network: the proxy's
and the hub's APIs listen on loopback, PostgreSQL and billing on private addresses. So:

- the host is resolved once and *every* address must be public (not loopback, private,
  link-local, shared, multicast, reserved or unspecified), unless the operator allowed its
  network (``SpotMarket.webhook_allowed_networks``); the connection then goes to that very
  address (no second lookup for DNS rebinding to change);
- redirects are not followed, timeouts are short and at most ``max_bytes`` of the answer are
  read;
- the user learns only "delivered" or a generic failure, never a status code or error text that
  would describe what answers inside the host. The operator's log has the detail.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedURL(ValueError):
    """The URL may not be called; the message is safe to show the user."""


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    # For the operator's log only: status code or error, and the address that was called.
    detail: str

    def public(self) -> dict[str, Any]:
        """What the user may see."""
        return {
            "delivered": self.delivered,
            **({} if self.delivered else {"error": "not delivered"}),
        }


def parse_networks(values: Iterable[str]) -> list[Network]:
    """``["10.0.0.0/8", "127.0.0.1/32"]`` -> networks; raises ValueError naming a bad entry."""
    out = []
    for v in values:
        try:
            out.append(ipaddress.ip_network(v, strict=False))
        except ValueError:
            raise ValueError(f"{v!r} is not a network such as 10.0.0.0/8") from None
    return out


def is_public(addr: Address) -> bool:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_global and not addr.is_multicast


def resolve_checked(url: str, allowed: list[Network]) -> tuple[str, int, str, Address]:
    """(scheme, port, host, the address to connect to) of an allowed URL; blocking (DNS)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RefusedURL("the webhook URL must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise RefusedURL("the webhook URL must not carry credentials")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise RefusedURL(f"the webhook host {parts.hostname!r} does not resolve") from None
    addrs = [ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos]
    for addr in addrs:
        if not is_public(addr) and not any(addr in net for net in allowed):
            raise RefusedURL(
                "the webhook URL must point to a public address (it may not reach the "
                "platform's own host or private networks)"
            )
    return parts.scheme, port, parts.hostname, addrs[0]


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, addr: Address, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._addr = str(addr)

    def connect(self) -> None:
        self.sock = socket.create_connection((self._addr, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, addr: Address, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._addr = str(addr)

    def connect(self) -> None:
        raw = socket.create_connection((self._addr, self.port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)


def post_blocking(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    allowed: list[Network],
    timeout: float = 5.0,
    max_bytes: int = 4096,
) -> Outcome:
    """POST ``body`` to ``url`` under the rules above (blocking: run it in a thread)."""
    try:
        scheme, port, host, addr = resolve_checked(url, allowed)
    except RefusedURL as e:
        return Outcome(False, f"refused: {e}")
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    conn = cls(host, port, addr, timeout)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read(max_bytes)
        # A redirect is an answer, not a delivery: it is never followed.
        return Outcome(200 <= resp.status < 300, f"HTTP {resp.status} from {addr}")
    except (OSError, http.client.HTTPException, ssl.SSLError) as e:
        return Outcome(False, f"{type(e).__name__}: {e} ({addr})")
    finally:
        conn.close()


async def post(url: str, body: bytes, headers: dict[str, str], **kwargs: Any) -> Outcome:
    return await asyncio.to_thread(post_blocking, url, body, headers, **kwargs)
