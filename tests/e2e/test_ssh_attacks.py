"""Attacks on the SSH gateway (issue 25), each with Debian's OpenSSH client against the real
gateway a real hub started, and real local servers.

Issue 25 attacks covered: "log in as another user with your token or key"; "forward to
127.0.0.1:<hub port>, to billing, to PostgreSQL, to another user's app socket or port"; "agent
forwarding to steal keys" (and X11, remote and Unix-socket forwarding); "SFTP outside the home via
`..` or symlinks"; "brute-force passwords (there are none: keys and tokens only, rate-limited)".

"A removed SSH key or a revoked token ends the connections already open with it" (attack wave
on issue 25: a removed key or revoked token still opened new exec and SFTP channels on an open
connection): test_a_removed_key_or_revoked_token_opens_no_new_channel and
test_an_open_connection_is_closed_once_its_log_in_is_gone fail on the code before that fix (the
SFTP channel opened after the removal worked, and the connection stayed open).

Each fails on the code before issue 25 (no SSH endpoint: the client cannot connect, so even the
"refused" cases fail their check that the right key or token does get in); the forwarding test
also fails with a gateway that forwards wherever the client asks (verified by making
``ssh_service/forwarding.py: may_connect`` allow every loopback target: the hub, billing, the root
listener and the other user's port were then reached).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import asyncssh
import pytest
from harness import Hub, free_port, wait_for
from ssh_helpers import (
    HTTP_GET,
    Key,
    keygen,
    person,
    session_of,
    ssh,
    ssh_cmd,
    ssh_with_token,
    start_http_server,
    wait_gateway,
)

RECHECK = 4.0


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    # Open connections' log-ins are re-checked every RECHECK s (+-20%; 30 s by default).
    h = module_hub_factory(
        "ssh-attacks", ssh_port=True, extra_args=[f"--SshGateway.recheck_seconds={RECHECK}"]
    )
    wait_gateway(h)
    return h


def via_w(hub: Hub, name: str, key: Key, host: str, port: int) -> subprocess.CompletedProcess:
    """``ssh -W host:port``: one direct-tcpip channel carrying an HTTP request."""
    return ssh(hub, name, key, "-W", f"{host}:{port}", "", input=HTTP_GET, timeout=60)


def serve_http(hub: Hub, name: str, key: Key, port: int, bind: str = "127.0.0.1") -> None:
    """An HTTP server in ``name``'s own server, started over SSH."""
    start_http_server(hub, name, key, port, bind)

    def up() -> bool:
        with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as s:
            return s.connect_ex((bind, port)) == 0

    wait_for(up, 30, 0.2, f"{name}'s HTTP server on {bind}:{port}")


def test_a_key_or_token_logs_in_only_as_its_owner(hub: Hub, tmp_path: Path) -> None:
    """Alice's key and Alice's token do not log in as Bob; a key nobody added does not log in;
    each of them does log in as its owner."""
    alice, alice_token, alice_key = person(hub, tmp_path, "ssa")
    bob, _, bob_key = person(hub, tmp_path, "ssa")
    stranger = keygen(tmp_path)
    # Logged in (exit 1: no server runs to open a shell in; 255 is the client's refusal).
    assert ssh(hub, alice, alice_key, "true").returncode == 1
    assert ssh(hub, bob, bob_key, "true").returncode == 1
    r = ssh(hub, bob, alice_key, "true")
    assert r.returncode == 255 and b"Permission denied" in r.stderr
    assert ssh(hub, alice, stranger, "true").returncode == 255
    assert ssh_with_token(hub, alice, alice_token, "true", tmp_path).returncode == 1  # no server
    r = ssh_with_token(hub, bob, alice_token, "true", tmp_path)
    assert r.returncode == 255 and b"Permission denied" in r.stderr
    # The gateway's own service token is no user's either.
    gw = (hub.data_dir / "ssh-api-token").read_text().strip()
    assert ssh_with_token(hub, alice, gw, "true", tmp_path).returncode == 255


def test_forwarding_reaches_only_the_users_own_ports(hub: Hub, tmp_path: Path) -> None:
    """``ssh -L``/``-W`` reaches a port of the user's own server, never the hub, its API,
    billing, a node service (a root listener, as PostgreSQL would be), another user's server,
    nor a port the user shares with a node service by binding ::1 next to it."""
    alice, _, alice_key = person(hub, tmp_path, "ssa")
    bob, _, bob_key = person(hub, tmp_path, "ssa")
    hub.spawn_ready(alice, {"gpu": "none"})
    hub.spawn_ready(bob, {"gpu": "none"})
    own, bobs = free_port(), free_port()
    serve_http(hub, alice, alice_key, own)
    serve_http(hub, bob, bob_key, bobs)
    root = socket.socket()
    root.bind(("127.0.0.1", 0))
    root.listen()
    try:
        r = via_w(hub, alice, alice_key, "localhost", own)
        assert r.returncode == 0 and r.stdout.startswith(b"HTTP/1.0 200"), r.stderr
        r = via_w(hub, alice, alice_key, "127.0.0.1", own)
        assert r.stdout.startswith(b"HTTP/1.0 200"), r.stderr
        targets = {
            "the hub's proxy": ("127.0.0.1", hub.port),
            "the hub's own API": ("127.0.0.1", hub.hub_port),
            "billing": ("127.0.0.1", hub.billing_port),
            "a root listener (PostgreSQL)": ("127.0.0.1", root.getsockname()[1]),
            "bob's server": ("127.0.0.1", bobs),
            "bob's server by name": ("localhost", bobs),
            "another host": ("10.255.255.1", own),
        }
        for what, (host, port) in targets.items():
            r = via_w(hub, alice, alice_key, host, port)
            assert r.returncode == 255 and b"HTTP" not in r.stdout, (what, r.stdout, r.stderr)
            assert b"forwarding failed" in r.stderr, (what, r.stderr)
        # Alice listens on [::1]:<hub port> next to the hub's proxy: the port is not hers.
        serve_http(hub, alice, alice_key, hub.port, bind="::1")
        r = via_w(hub, alice, alice_key, "localhost", hub.port)
        assert r.returncode == 255 and b"HTTP" not in r.stdout, r.stderr
        # With her server stopped nothing is hers.
        hub.stop_server(alice)
        r = via_w(hub, alice, alice_key, "localhost", own)
        assert r.returncode == 255
    finally:
        root.close()
        hub.stop_server(bob)
        if hub.server(alice) is not None:
            hub.stop_server(alice)


def test_agent_x11_remote_and_unix_socket_forwarding_are_refused(hub: Hub, tmp_path: Path) -> None:
    """``-A`` gives the session no agent socket (nothing to steal keys through), ``-X`` no
    display, ``-R`` no listener on the node, ``-L PORT:/unix/socket`` no socket of the node."""
    name, _, key = person(hub, tmp_path, "ssa")
    hub.spawn_ready(name, {"gpu": "none"})
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True)
    env_agent = dict(
        line.split(";")[0].split("=", 1) for line in agent.stdout.splitlines() if "=" in line
    )
    try:
        env = {**os.environ, **env_agent, "DISPLAY": ":99"}
        subprocess.run(["ssh-add", "-q", str(key.path)], env=env, check=True, timeout=30)
        r = subprocess.run(
            [
                *ssh_cmd(hub, name, key, "-A", "-o", "ForwardX11=yes"),
                'echo "agent=[$SSH_AUTH_SOCK] display=[$DISPLAY]"; ls /tmp',
            ],
            env=env,
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode == 0, r.stderr
        assert b"agent=[] display=[]" in r.stdout, r.stdout
        assert b"ssh-" not in r.stdout  # no agent socket folder made in the server
    finally:
        subprocess.run(["ssh-agent", "-k"], env={**os.environ, **env_agent}, capture_output=True)

    remote = free_port()
    r = ssh(
        hub, name, key, "-o", "ExitOnForwardFailure=yes", "-R", f"{remote}:127.0.0.1:22", "true"
    )
    assert r.returncode == 255 and b"remote port forwarding failed" in r.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", remote)) != 0  # nothing listens there

    # A Unix socket of the node (the Docker Engine's, root's): the forward's channel is refused.
    local = free_port()
    client = subprocess.Popen(
        [*ssh_cmd(hub, name, key, "-N", "-L", f"127.0.0.1:{local}:/var/run/docker.sock")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", local)) == 0

        wait_for(listening, 30, 0.2, "the client's local forward")
        with socket.create_connection(("127.0.0.1", local), timeout=30) as s:
            s.sendall(b"GET /version HTTP/1.0\r\n\r\n")
            try:
                got = s.recv(4096)
            except ConnectionResetError:
                got = b""
            assert got == b""  # closed: the gateway refused the channel
    finally:
        client.kill()
        client.wait(10)
    hub.stop_server(name)


def test_sftp_stays_within_the_accounts_rights(hub: Hub, tmp_path: Path) -> None:
    """SFTP runs as the user's account: another user's home (by `..` or by a symlink placed in
    one's own home) and root's files are out of reach, with or without a server."""
    alice, _, alice_key = person(hub, tmp_path, "ssa")
    bob, _, bob_key = person(hub, tmp_path, "ssa")
    hub.spawn_ready(bob, {"gpu": "none"})
    r = ssh(hub, bob, bob_key, "echo bob-secret > secret.txt")
    assert r.returncode == 0, r.stderr
    bob_home = session_of(hub, bob)["home"]
    alice_home = session_of(hub, alice)["home"]
    rel = os.path.relpath(f"{bob_home}/secret.txt", alice_home)
    opts = ssh_cmd(hub, alice, alice_key)[3:-1]
    for running in (False, True):
        if running:
            hub.spawn_ready(alice, {"gpu": "none"})
        batch = tmp_path / f"batch-{running}"
        batch.write_text(
            f"-get {rel} {tmp_path}/stolen1-{running}\n"
            f"-symlink {bob_home}/secret.txt link-{running}\n"
            f"-get link-{running} {tmp_path}/stolen2-{running}\n"
            f"-get /etc/shadow {tmp_path}/stolen3-{running}\n"
            f"-put {batch} {bob_home}/planted-{running}\n"
        )
        r = subprocess.run(
            ["sftp", "-P", str(hub.ssh_port), *opts, "-b", str(batch), f"{alice}@127.0.0.1"],
            capture_output=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr  # the session itself works
        for n in (1, 2, 3):
            assert not (tmp_path / f"stolen{n}-{running}").exists(), (n, r.stderr)
        assert not Path(f"{bob_home}/planted-{running}").exists()
        assert b"Permission denied" in r.stderr
    hub.stop_server(alice)
    hub.stop_server(bob)


def test_guessing_tokens_is_rate_limited(hub: Hub, tmp_path: Path) -> None:
    """There are no passwords to guess: a wrong token is refused, and after ten refusals a
    minute the hub refuses even the right key and token for that user from that address, while
    other users are not locked out."""
    victim, token, key = person(hub, tmp_path, "ssa")
    other, _, other_key = person(hub, tmp_path, "ssa")
    for _ in range(10):
        r = ssh_with_token(hub, victim, uuid.uuid4().hex, "true", tmp_path)
        assert r.returncode == 255 and b"Permission denied" in r.stderr
    assert ssh_with_token(hub, victim, token, "true", tmp_path).returncode == 255
    assert ssh(hub, victim, key, "true").returncode == 255
    r = ssh(hub, other, other_key, "true")
    assert r.returncode == 1 and b"not running" in r.stderr  # logged in; no server to run in


async def connect(hub: Hub, name: str, key: Key | None = None, token: str = ""):
    """One SSH connection kept open (asyncssh's client), logged in with ``key`` or ``token``."""
    auth = (
        {"client_keys": [str(key.path)], "preferred_auth": "publickey"}
        if key
        else {"client_keys": [], "password": token, "preferred_auth": "password"}
    )
    return await asyncssh.connect(
        "127.0.0.1", hub.ssh_port, username=name, known_hosts=None, agent_path=None, **auth
    )


async def sftp_lists(conn) -> list[str]:
    """A new SFTP channel on ``conn`` listing the home (no server needed)."""
    async with conn.start_sftp_client() as sftp:
        return await sftp.listdir(".")


def fingerprint_of(hub: Hub, name: str, token: str) -> str:
    keys = hub.api("GET", f"/gpulab/users/{name}/ssh-keys", token=token).json()["keys"]
    return keys[0]["fingerprint"]


def new_token(hub: Hub, name: str) -> dict:
    r = hub.api("POST", f"/users/{name}/tokens", json={"note": "ssh-recheck"})
    assert r.status_code in (200, 201), r.text
    return r.json()


def remove_key(hub: Hub, name: str, token: str) -> None:
    fp = fingerprint_of(hub, name, token).replace("+", "-").replace("/", "_")
    r = hub.api("DELETE", f"/gpulab/users/{name}/ssh-keys/{fp}", token=token)
    assert r.status_code == 204, r.text


def revoke(hub: Hub, name: str, tok: dict) -> None:
    r = hub.api("DELETE", f"/users/{name}/tokens/{tok['id']}")
    assert r.status_code == 204, r.text


def test_a_removed_key_or_revoked_token_opens_no_new_channel(hub: Hub, tmp_path: Path) -> None:
    """A connection open with a key that is then removed (or a token then revoked) opens no new
    SFTP channel, and the gateway closes it; the user's other keys and new log-ins are unhurt."""
    name, token, key = person(hub, tmp_path, "ssr")
    tok = new_token(hub, name)

    async def scene() -> None:
        by_key = await connect(hub, name, key=key)
        by_token = await connect(hub, name, token=tok["token"])
        try:
            assert isinstance(await sftp_lists(by_key), list)
            assert isinstance(await sftp_lists(by_token), list)
            remove_key(hub, name, token)
            with pytest.raises((asyncssh.Error, OSError)):
                await sftp_lists(by_key)
            await asyncio.wait_for(by_key.wait_closed(), 10)
            # The token's connection is another log-in: it still works, until the token goes.
            assert isinstance(await sftp_lists(by_token), list)
            revoke(hub, name, tok)
            with pytest.raises((asyncssh.Error, OSError)):
                await sftp_lists(by_token)
            await asyncio.wait_for(by_token.wait_closed(), 10)
        finally:
            by_key.close()
            by_token.close()

    asyncio.run(scene())
    # New log-ins with them are refused; the user's own token still logs in.
    assert ssh(hub, name, key, "true").returncode == 255
    assert ssh_with_token(hub, name, tok["token"], "true", tmp_path).returncode == 255
    r = ssh_with_token(hub, name, token, "true", tmp_path)
    assert r.returncode == 1 and b"not running" in r.stderr


def test_an_open_connection_is_closed_once_its_log_in_is_gone(hub: Hub, tmp_path: Path) -> None:
    """With no new channel asked, an open SFTP session whose key is removed (or whose token is
    revoked) is ended by the gateway's periodic re-check within its interval (RECHECK s, +-20%)."""
    name, token, key = person(hub, tmp_path, "ssp")
    tok = new_token(hub, name)

    async def held_until_closed(conn, take_away) -> float:
        async with conn.start_sftp_client() as sftp:
            assert isinstance(await sftp.listdir("."), list)
            take_away()
            gone = time.monotonic()
            await asyncio.wait_for(conn.wait_closed(), RECHECK * 1.2 + 5)
            with pytest.raises((asyncssh.Error, OSError)):
                await sftp.listdir(".")
            return time.monotonic() - gone

    async def scene() -> None:
        by_key = await connect(hub, name, key=key)
        by_token = await connect(hub, name, token=tok["token"])
        try:
            await held_until_closed(by_key, lambda: remove_key(hub, name, token))
            assert not by_token.is_closed()
            await held_until_closed(by_token, lambda: revoke(hub, name, tok))
        finally:
            by_key.close()
            by_token.close()

    asyncio.run(scene())
