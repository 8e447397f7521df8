"""Debian's OpenSSH client (``ssh``, ``scp``, ``sftp``) and ``rsync`` against a hub's real SSH
gateway (``gpulab.ssh_service``, started by a hub made with ``ssh_port=True``).

Keys are made by ``ssh-keygen`` in a test's temp folder and added through the hub's API with the
user's own token; a token logs in as the password through ``SSH_ASKPASS`` (the client reads no
password from anywhere else, and BatchMode would forbid asking).
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from course_helpers import token_for
from harness import Hub, wait_for

# An HTTP request for `ssh -W host:port` to carry: its answer shows what the channel reached.
HTTP_GET = b"GET / HTTP/1.0\r\nHost: x\r\n\r\n"

CLIENT_OPTIONS = [
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=30",
]

# With a key, and only that key: no agent, no other identity, no password prompt.
KEY_ONLY = [
    "-o",
    "IdentitiesOnly=yes",
    "-o",
    "BatchMode=yes",
    "-o",
    "PasswordAuthentication=no",
]


@dataclass
class Key:
    path: Path
    public: str


def keygen(folder: Path) -> Key:
    path = folder / f"id_{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return Key(path, Path(f"{path}.pub").read_text().strip())


def add_key(hub: Hub, name: str, token: str, key: Key) -> dict:
    r = hub.api("POST", f"/gpulab/users/{name}/ssh-keys", token=token, json={"key": key.public})
    assert r.status_code in (200, 201), r.text
    return r.json()


def person(hub: Hub, folder: Path, prefix: str = "ssh") -> tuple[str, str, Key]:
    """A new user, a token of theirs, and a key they added through the hub's API."""
    name = hub.create_user(f"{prefix}{uuid.uuid4().hex[:6]}")
    token = token_for(hub, name)
    key = keygen(folder)
    add_key(hub, name, token, key)
    return name, token, key


def key_options(key: Key) -> list[str]:
    return [*CLIENT_OPTIONS, *KEY_ONLY, "-i", str(key.path)]


def banner(port: int) -> bool:
    """Whether an SSH server on 127.0.0.1:``port`` answers with its banner."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def wait_gateway(hub: Hub, timeout: float = 60) -> None:
    """Until the gateway the hub started answers with an SSH banner."""
    wait_for(lambda: banner(hub.ssh_port), timeout, 0.2, "the SSH gateway to answer")


def ssh(
    hub: Hub,
    name: str,
    key: Key,
    *args: str,
    input: bytes | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    """``ssh -p PORT [args] NAME@127.0.0.1`` with ``key``; stdout and stderr captured (bytes)."""
    cmd = ["ssh", "-p", str(hub.ssh_port), *key_options(key), *args[:-1], f"{name}@127.0.0.1"]
    if args and args[-1]:
        cmd.append(args[-1])
    return subprocess.run(
        cmd,
        input=input,
        capture_output=True,
        timeout=timeout,
        stdin=None if input else subprocess.DEVNULL,
    )


def ssh_cmd(hub: Hub, name: str, key: Key, *options: str) -> list[str]:
    """The argv of an ssh client (for Popen, tmux, rsync -e)."""
    return ["ssh", "-p", str(hub.ssh_port), *key_options(key), *options, f"{name}@127.0.0.1"]


def start_http_server(hub: Hub, name: str, key: Key, port: int, bind: str = "127.0.0.1") -> None:
    """``python3 -m http.server`` started over SSH in ``name``'s own server, left running there
    (the server's stop ends it); the caller waits for it the way it can reach it."""
    r = ssh(
        hub,
        name,
        key,
        f"nohup python3 -m http.server {port} --bind {bind} >/dev/null 2>&1 & echo ok",
    )
    assert r.returncode == 0, r.stderr


def assert_stop_ends_session(
    hub: Hub, name: str, key: Key, stop: Callable[[], None], timeout: float = 30
) -> None:
    """A command running over SSH (``exec sleep 600``) ends, failing, within ``timeout`` of
    ``stop()`` (the server's stop); the client is killed if it does not."""
    client = subprocess.Popen(
        [*ssh_cmd(hub, name, key), "echo started; exec sleep 600"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert client.stdout.readline() == b"started\n"
        stop()
        assert client.wait(timeout) != 0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)


def ssh_with_token(
    hub: Hub, name: str, token: str, command: str, folder: Path, timeout: float = 60
) -> subprocess.CompletedProcess:
    """``ssh NAME@hub COMMAND`` logging in with ``token`` as the password (no key offered)."""
    askpass = folder / f"askpass-{uuid.uuid4().hex[:6]}"
    askpass.write_text(f"#!/bin/sh\necho '{token}'\n")
    askpass.chmod(0o700)
    env = {**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force"}
    env.pop("SSH_AUTH_SOCK", None)
    cmd = [
        "ssh",
        "-p",
        str(hub.ssh_port),
        *CLIENT_OPTIONS,
        "-o",
        "PubkeyAuthentication=no",
        "-o",
        "PreferredAuthentications=password",
        "-o",
        "NumberOfPasswordPrompts=1",
        f"{name}@127.0.0.1",
        command,
    ]
    return subprocess.run(
        cmd, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def gateway_token(hub: Hub) -> str:
    """The gpulab-ssh service's hub token (kept in the data dir, like billing's)."""
    return (hub.data_dir / "ssh-api-token").read_text().strip()


def session_of(hub: Hub, name: str) -> dict:
    """What the hub tells the gateway about ``name``'s server (pid, cgroups, env)."""
    r = hub.api(
        "POST", "/gpulab/ssh/session", token=gateway_token(hub), json={"user": name, "server": ""}
    )
    assert r.status_code == 200, r.text
    return r.json()
