"""What the SSH gateway asks of the hub: may this key or token log in as NAME, and where does
NAME's server run.

The gateway decides nothing about users itself: the hub keeps the keys (``hub_config/ssh_keys.py``),
knows the tokens and the servers, and rate-limits failures per user and source. The gateway
reaches it only over HTTP, with its own service token (scope ``custom:gpulab:ssh-gateway``).
Each new channel and a periodic re-check carry the connection's own log-in (its key's
fingerprint, or the token, kept in memory only), so that a removed key or a revoked token ends a
connection that is already open.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

log = logging.getLogger("gpulab.ssh")


class HubUnavailable(RuntimeError):
    """The hub did not answer, or answered something the gateway cannot use."""


class CredentialGone(RuntimeError):
    """The key or token a connection logged in with logs in no more (the key was removed, the
    token revoked or expired, the user blocked or removed): the hub's 403 for a new channel."""


class NoSuchServer(RuntimeError):
    """The hub knows no such server of the user (``ssh NAME/SERVER@hub``); its message says so."""


@dataclass(frozen=True)
class Session:
    """The hub's answer to ``POST /hub/api/gpulab/ssh/session``: where NAME's server runs."""

    user: str
    server: str = ""
    running: bool = False
    kind: str = "local"
    home: str = "/"
    host_home: str = ""
    uid: int | None = None
    gid: int | None = None
    account: str = ""
    pid: int | None = None
    cgroup: tuple[str, ...] = ()
    container: str = ""
    env: dict[str, str] = field(default_factory=dict)
    message: str = ""
    # No server: the scratch spec of the launcher's private_scratch (None: the host's), and the
    # most transfer sessions the user may hold at once (0: no limit).
    scratch: dict[str, Any] | None = None
    max_transfers: int = 0

    @property
    def files_home(self) -> str:
        """The home as a folder of this node where files move as the account with no server;
        "" for a container server: every container runs as the same uid on the node (1000), so
        a process of that uid on the node could reach every user's host folder. A container's
        files move only through the container itself (``docker exec``), while it runs."""
        if self.kind == "local":
            return self.host_home or self.home
        return ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Session:
        # Every cgroup.procs file (cgroup v1: one per controller), or the one (v2).
        cgroup = data.get("cgroups") or data.get("cgroup") or ()
        if isinstance(cgroup, str):
            cgroup = tuple(p for p in cgroup.split(":") if p)
        env = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
        return cls(
            user=str(data["user"]),
            server=str(data.get("server") or ""),
            running=bool(data.get("running")),
            kind=str(data.get("kind") or "local"),
            home=str(data.get("home") or "/"),
            host_home=str(data.get("host_home") or ""),
            uid=_int(data.get("uid")),
            gid=_int(data.get("gid")),
            account=str(data.get("account") or ""),
            pid=_int(data.get("pid")),
            cgroup=tuple(str(p) for p in cgroup),
            container=str(data.get("container") or ""),
            env=env,
            message=str(data.get("message") or ""),
            scratch=data.get("scratch") if isinstance(data.get("scratch"), dict) else None,
            max_transfers=_int(data.get("max_transfers")) or 0,
        )


def _int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


class HubClient:
    """The hub's REST API, as the ``gpulab-ssh`` service."""

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.http = AsyncHTTPClient()

    @property
    def hub_url(self) -> str:
        """The hub's own address (its API's origin), for messages."""
        parsed = urlparse(self.api_url)
        return f"{parsed.scheme}://{parsed.netloc}"

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        req = HTTPRequest(
            self.api_url + path,
            method="POST",
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=json.dumps(body),
            request_timeout=30,
        )
        try:
            resp = await self.http.fetch(req, raise_error=False)
        except (HTTPClientError, OSError) as e:
            raise HubUnavailable(f"the hub did not answer {path}: {e}") from None
        try:
            data = json.loads(resp.body or b"null")
        except ValueError:
            data = None
        return resp.code, data

    async def authorize(self, user: str, peer: str, **secret: str) -> dict[str, Any] | None:
        """The hub's answer when it lets ``secret`` (a ``fingerprint`` or a ``token``) log in as
        ``user`` (``{user, recheck_seconds}``); None on any refusal (403, 429, an error)."""
        try:
            code, data = await self.post(
                "/gpulab/ssh/authorize", {"user": user, "peer": peer, **secret}
            )
        except HubUnavailable as e:
            log.warning("%s", e)
            return None
        if code == 429:
            log.warning("The hub rate-limits %s from %s", user, peer)
        ok = code == 200 and isinstance(data, dict) and data.get("user") == user
        return data if ok else None

    async def recheck(self, user: str, peer: str, credential: dict[str, str]) -> bool | None:
        """Whether an open connection's log-in (``credential``: its ``fingerprint`` or ``token``)
        still logs in as ``user``: True, False (the hub's 403), or None (no usable answer: the
        hub is down or busy, and the connection is not ended for that)."""
        try:
            code, data = await self.post(
                "/gpulab/ssh/authorize",
                {"user": user, "peer": peer, "recheck": True, **credential},
            )
        except HubUnavailable as e:
            log.warning("%s", e)
            return None
        if code == 403:
            return False
        if code == 200 and isinstance(data, dict) and data.get("user") == user:
            return True
        return None

    async def session(
        self, user: str, server: str = "", credential: dict[str, str] | None = None
    ) -> Session:
        """Where ``user``'s server runs; ``credential`` (the connection's ``fingerprint`` or
        ``token``) is checked again by the hub: :class:`CredentialGone` once it is not."""
        code, data = await self.post(
            "/gpulab/ssh/session", {"user": user, "server": server, **(credential or {})}
        )
        if code == 403 and isinstance(data, dict) and data.get("field") == "credential":
            raise CredentialGone(str(data.get("message") or "your log-in no longer holds"))
        if (
            code in (400, 404)
            and server
            and isinstance(data, dict)
            and data.get("field") == "server"
        ):
            raise NoSuchServer(str(data.get("message") or f"no server named {server!r}"))
        if code != 200 or not isinstance(data, dict) or data.get("user") != user:
            raise HubUnavailable(f"the hub answered {code} for {user}'s session")
        return Session.from_json(data)
