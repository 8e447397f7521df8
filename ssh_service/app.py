"""The SSH gateway process: the JupyterHub managed service ``gpulab-ssh``.

Started by the hub as ``python -m gpulab.ssh_service`` with the service environment
(``JUPYTERHUB_API_URL``, ``JUPYTERHUB_API_TOKEN``) plus ``GPULAB_SSH_PORT`` and
``GPULAB_DATA_DIR``. One asyncssh server: the SSH user name is the hub user name; a login is a
public key or a hub API token given as the password, each checked by the hub
(:class:`~.hub.HubClient`), nothing else (no passwords, no keyboard-interactive); failures are
answered slowly (``failure_delay``) and rate-limited by the hub. Sessions (shell, command, SFTP)
are :mod:`.sessions`; ``ssh -L`` goes through :mod:`.forwarding`'s one rule; agent, X11, remote
and Unix-socket forwarding are refused. A connection remembers the key's fingerprint or the token
it logged in with (in memory only), passes it with every new channel's question to the hub, and
has the hub re-check it every ``recheck_seconds`` (the hub's :attr:`SshGateway.recheck_seconds`,
with jitter): once the key is removed or the token revoked the connection is closed, its running
channels with it. The host key lives in ``DATA_DIR/ssh/host_ed25519``
(root, 0600), made on first start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
from pathlib import Path

import asyncssh
from asyncssh.forward import SSHForwarder
from traitlets import Float, Int, Unicode, default
from traitlets.config import Application

from gpulab.catalog import settings as table
from gpulab.ssh_service.forwarding import connect, may_connect
from gpulab.ssh_service.hub import CredentialGone, HubClient, HubUnavailable, NoSuchServer
from gpulab.ssh_service.sessions import GatewaySession

log = logging.getLogger("gpulab.ssh")
MAX_NAME = 255
# Seconds between re-checks of an open connection's log-in when the hub names none.
DEFAULT_RECHECK = 30.0
# `ssh NAME/SERVER@hub` reaches NAME's named server SERVER (JupyterHub's own spelling, as in
# /user/NAME/SERVER/): JupyterHub refuses "/" in user names, and server names never hold one.
SERVER_SEPARATOR = "/"
# What the gateway offers, in SSH the client's order wins among what the server offers. asyncssh's
# chacha20-poly1305 (OpenSSH's first choice) costs about 4x AES-GCM per byte here and made SFTP
# over 2x OpenSSH's time; AES-GCM alone is offered so that a default OpenSSH client (whose list has
# AES-CTR before GCM) negotiates GCM. Every OpenSSH since 6.2, PuTTY since 0.76, and the SSH
# libraries VS Code and PyCharm use speak it. (asyncssh's channel window and packet size stay at
# their defaults, 2 MiB and 32 KiB: 8 MiB and 128 KiB measured slower for SFTP both ways.)
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
# Only used by ciphers without their own MAC: none offered, so ETM ones only, if that changes.
MACS = ("umac-64-etm@openssh.com", "hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com")


class SshService(Application):
    """The SSH endpoint into users' own servers."""

    name = "gpulab-ssh"

    port = Int(
        config=True,
        help="TCP port the gateway listens on (GPULAB_SSH_PORT; 8022 by default, 0: off).",
    )
    ip = Unicode(
        config=True,
        help="Address the gateway listens on (GPULAB_IP, where browsers reach the hub; "
        "0.0.0.0 or empty: every address).",
    )
    data_dir = Unicode(
        config=True,
        help="gpulab's data dir (GPULAB_DATA_DIR): the host key is kept in its ssh/ folder.",
    )
    host_key_path = Unicode(
        config=True,
        help="The gateway's ed25519 host key (made on first start, root 0600); default "
        "DATA_DIR/ssh/host_ed25519.",
    )
    hub_api_url = Unicode(
        config=True, help="The hub's REST API (JUPYTERHUB_API_URL, as the hub gives services)."
    )
    api_token = Unicode(
        config=True, help="The gateway's own hub token (JUPYTERHUB_API_TOKEN, the service's)."
    )
    failure_delay = Float(
        1.0,
        config=True,
        help="Seconds a refused key or token waits before it is answered (the hub rate-limits "
        "failures per user and source as well).",
    )
    login_timeout = Float(
        30.0,
        config=True,
        help="""Seconds a client has to log in before it is disconnected (a connection that
        never logs in holds a slot until then).""",
    )

    @default("port")
    def _default_port(self) -> int:
        return int(table.get("GPULAB_SSH_PORT") or 0)

    @default("ip")
    def _default_ip(self) -> str:
        return "" if not table.is_set("GPULAB_IP") else str(table.get("GPULAB_IP"))

    @default("data_dir")
    def _default_data_dir(self) -> str:
        return str(table.get("GPULAB_DATA_DIR")) if table.is_set("GPULAB_DATA_DIR") else ""

    @default("host_key_path")
    def _default_host_key_path(self) -> str:
        if not self.data_dir:
            raise ValueError("GPULAB_DATA_DIR: required (where the host key is kept)")
        return str(Path(self.data_dir) / "ssh" / "host_ed25519")

    @default("hub_api_url")
    def _default_hub_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _default_api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def start(self) -> None:
        logging.basicConfig(
            stream=sys.stdout,
            level=logging.INFO,
            format="[%(levelname).1s %(asctime)s gpulab-ssh] %(message)s",
        )
        logging.getLogger("asyncssh").setLevel(logging.WARNING)
        if not self.api_token:
            raise SystemExit("gpulab-ssh: JUPYTERHUB_API_TOKEN is required (the service's token)")
        if not self.port:
            raise SystemExit("gpulab-ssh: GPULAB_SSH_PORT is 0 (SSH is off)")
        asyncio.run(self.serve())

    async def serve(self) -> None:
        self.hub = HubClient(self.hub_api_url, self.api_token)
        key = await asyncio.to_thread(host_key, Path(self.host_key_path))
        server = await asyncssh.create_server(
            lambda: GatewayServer(self),
            None if self.ip in ("", "0.0.0.0", "::") else self.ip,
            self.port,
            server_host_keys=[key],
            encoding=None,
            agent_forwarding=False,
            x11_forwarding=False,
            allow_scp=False,
            login_timeout=self.login_timeout,
            keepalive_interval=30,
            encryption_algs=list(CIPHERS),
            mac_algs=list(MACS),
            compression_algs=["none"],
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("SSH gateway listening on %s:%d", self.ip or "*", self.port)
        watch = asyncio.ensure_future(watch_parent(stop))
        await stop.wait()
        watch.cancel()
        server.close()
        await server.wait_closed()


async def watch_parent(stop: asyncio.Event) -> None:
    """Stop when the hub that started this service is gone (SIGKILLed: JupyterHub could not stop
    its services): the restarted hub starts a fresh gateway on the same port. Only a gateway the
    hub started (``GPULAB_HUB_PID``) watches."""
    parent = table.get("GPULAB_HUB_PID")
    if not parent:
        return
    while os.getppid() == parent:  # noqa: ASYNC110 (no event tells us the parent died)
        await asyncio.sleep(1)
    log.warning("the hub (pid %i) is gone; stopping", parent)
    stop.set()


def host_key(path: Path) -> asyncssh.SSHKey:
    """The gateway's host key, made on first start (root's folder 0700, the key 0600, written to
    a new file and renamed into place); blocking."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.exists():
        return asyncssh.read_private_key(str(path))
    key = asyncssh.generate_private_key("ssh-ed25519")
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.export_private_key())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return key


class TargetForwarder(SSHForwarder):
    """The target socket's side of a forward. asyncssh's forwarder closes the pair only when the
    channel's end of file comes first: when the target closed first (an HTTP/1.0 server's reply)
    and the client's end of file came after, neither side ever closed, and `ssh -W` hung."""

    def write_eof(self) -> None:
        super().write_eof()
        if self.was_eof_received():  # both ways done: close the socket and the channel
            self.close()


def split_login(login: str) -> tuple[str, str]:
    """``NAME`` or ``NAME/SERVER`` (the SSH user name) as (hub user name, server name); a server
    name the hub would refuse is kept as it is, for the hub to refuse with its own message."""
    user, _, server = login.partition(SERVER_SEPARATOR)
    return user, server


class GatewayServer(asyncssh.SSHServer):
    """One client connection: who it is (the hub says), and what it may open."""

    def __init__(self, app: SshService) -> None:
        self.app = app
        self.hub: HubClient = app.hub
        self.username = ""
        self.server = ""
        self.peer = ""
        self.conn_info: dict[str, str] = {}
        self.accepted: dict[str, dict | None] = {}
        self.conn: asyncssh.SSHServerConnection | None = None
        # The log-in that succeeded ({"fingerprint": ...} or {"token": ...}; in memory only) and
        # the hub's re-check interval; the task re-checking it while the connection is open.
        self.credential: dict[str, str] = {}
        self.recheck_seconds = DEFAULT_RECHECK
        self.watch: asyncio.Task | None = None
        self.ended = False

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("", 0)
        sock = conn.get_extra_info("sockname") or ("", 0)
        self.peer = str(peer[0])
        self.conn_info = {
            "SSH_CONNECTION": f"{peer[0]} {peer[1]} {sock[0]} {sock[1]}",
            "SSH_CLIENT": f"{peer[0]} {peer[1]} {sock[1]}",
        }

    def begin_auth(self, username: str) -> bool:
        self.username, self.server = split_login(username)
        return True

    def password_auth_supported(self) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        # asyncssh asks twice per key (the offer, then the signed request): the hub once.
        fingerprint = key.get_fingerprint("sha256")
        if fingerprint not in self.accepted:
            self.accepted[fingerprint] = await self._authorize(
                self.username, fingerprint=fingerprint
            )
        return self._accept(self.accepted[fingerprint], fingerprint=fingerprint)

    async def validate_password(self, username: str, password: str) -> bool:
        answer = await self._authorize(self.username, token=password)
        return self._accept(answer, token=password)

    def _accept(self, answer: dict | None, **secret: str) -> bool:
        """Remember the log-in the hub accepted (the last one asked: the one that logs in)."""
        if answer is None:
            return False
        self.credential = dict(secret)
        try:
            self.recheck_seconds = max(float(answer.get("recheck_seconds")), 0.5)
        except (TypeError, ValueError):
            self.recheck_seconds = DEFAULT_RECHECK
        return True

    async def _authorize(self, username: str, **secret: str) -> dict | None:
        answer = (
            await self.hub.authorize(username, self.peer, **secret)
            if 0 < len(username) <= MAX_NAME
            else None
        )
        if answer is not None:
            log.info("%s logged in from %s (%s)", username, self.peer, next(iter(secret)))
        else:
            log.info("Refused %s from %s (%s)", username, self.peer, next(iter(secret)))
            await asyncio.sleep(self.app.failure_delay)
        return answer

    def auth_completed(self) -> None:
        self.watch = asyncio.ensure_future(self._recheck())

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        if self.watch is not None:
            self.watch.cancel()
        self.credential = {}

    async def _recheck(self) -> None:
        """Every ``recheck_seconds`` (+-20%), ask the hub whether this connection's log-in still
        holds; close the connection once it does not (a hub that does not answer ends nothing)."""
        while not self.ended:
            await asyncio.sleep(self.recheck_seconds * random.uniform(0.8, 1.2))
            if await self.hub.recheck(self.username, self.peer, self.credential) is False:
                self.credential_gone("its log-in no longer holds (re-check)")
                return

    def credential_gone(self, why: str) -> None:
        """Close the connection: its log-in no longer holds (its channels end with it)."""
        if self.ended or self.conn is None:
            return
        self.ended = True
        log.info("Closing %s's connection from %s: %s", self.username, self.peer, why)
        self.conn.disconnect(
            asyncssh.DISC_BY_APPLICATION,
            f"gpulab: the key or token this connection logged in with no longer logs in as "
            f"{self.username} (removed or revoked)",
        )

    def session_requested(self) -> GatewaySession:
        return GatewaySession(
            self.hub,
            self.username,
            self.conn_info,
            self.server,
            credential=self.credential,
            gone=self.credential_gone,
        )

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int):
        return self._forward(dest_host, dest_port)

    async def _forward(self, host: str, port: int) -> SSHForwarder:
        try:
            session = await self.hub.session(self.username, self.server, self.credential)
        except CredentialGone as e:
            self.credential_gone(str(e))
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, f"{e} (removed or revoked)"
            ) from None
        except NoSuchServer as e:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(e)) from None
        except HubUnavailable as e:
            log.warning("%s", e)
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED, "hub unavailable"
            ) from None
        target = await asyncio.to_thread(may_connect, session, host, port)
        if target is None:
            log.info("Refused %s's forward to %s:%d", self.username, host, port)
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"{host}:{port} is not a port of your own server",
            )
        try:
            sock = await asyncio.to_thread(connect, target)
        except OSError as e:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_CONNECT_FAILED, str(e)) from None
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_connection(TargetForwarder, sock=sock)
        log.info("%s forwards to %s:%d", self.username, host, port)
        return SSHForwarder(peer)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # remote (-R) forwarding: never a listener on the node for a user

    def unix_connection_requested(self, dest_path: str) -> bool:
        return False

    def unix_server_requested(self, listen_path: str) -> bool:
        return False


def main(argv: list[str] | None = None) -> None:
    app = SshService.instance()
    app.initialize(argv)
    app.start()
