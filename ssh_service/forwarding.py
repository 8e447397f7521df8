"""Port forwarding (``ssh -L``) reaches a user's own server, and nothing else on the node.

A local server shares the node's network: ``localhost:PORT`` may be the user's TensorBoard, or
the hub, billing, PostgreSQL, another user's app. So the one rule, :func:`may_connect`, allows a
``direct-tcpip`` target only when it names loopback and every socket listening on that port is
held by a process in the user's server (its cgroup, read from ``/proc``:
``gpulab.spawners.node.sockets``), or, for a container server, lives in the container's own
network namespace (never the node's). Everything else is refused: other hosts, the node's
services, other users, a stopped server. Agent, X11, remote (``-R``) and Unix-socket forwarding
are refused by the gateway itself (``app.py``).

Blocking (it walks ``/proc`` and may ask Docker): call it in a thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import subprocess
import threading
from dataclasses import dataclass

from gpulab.spawners.node import sockets

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost", "[::1]"})
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class Target:
    """Where an allowed forward connects: ``address:port``, in ``netns_pid``'s network namespace
    (a container's) or the node's own (None)."""

    address: str
    port: int
    netns_pid: int | None = None


def may_connect(session, host: str, port: int) -> Target | None:
    """The target to connect to when ``session``'s user may reach ``host:port``; None if not.

    ``session`` is the hub's answer for the user's server (:class:`~.hub.Session`)."""
    if host.strip().lower().rstrip(".") not in LOOPBACK_NAMES or not 0 < port < 65536:
        return None
    if not session.running:
        return None
    if session.kind == "local":
        if not session.cgroup:
            return None  # no cgroup (not a root hub): nothing proves a port is the user's
        pids = sockets.pids_of_cgroup(session.cgroup[0])
        if not pids or not sockets.listener_owned_by(port, pids):
            return None
        address = sockets.loopback_address(port)
        return Target(address, port) if address else None
    if session.kind == "docker" and session.container:
        pid = container_pid(session.container)
        if pid is None or _same_netns(pid):
            return None  # host networking: the container's ports are the node's
        if not sockets.listeners_on(port, pid):
            return None
        address = sockets.loopback_address(port, pid) or "127.0.0.1"
        return Target(address, port, netns_pid=pid)
    return None


def container_pid(container: str) -> int | None:
    """The container's first process on this node (its namespaces), None if it is not running."""
    try:
        out = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Running}} {{.State.Pid}}", container],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    running, _, pid = out.stdout.strip().partition(" ")
    if out.returncode != 0 or running != "true" or not pid.isdigit() or pid == "0":
        return None
    return int(pid)


def _same_netns(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return True


def connect(target: Target, timeout: float = 10) -> socket.socket:
    """A connected, non-blocking socket to ``target``; blocking. In a container's namespace the
    socket is made by a thread of its own that enters the namespace (a thread's network
    namespace is its own; the socket keeps the one it was made in) and then ends."""
    if target.netns_pid is None:
        return _connect(target, timeout)
    result: list = []
    ns_fd = os.open(f"/proc/{target.netns_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    def run() -> None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.setns(ns_fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the container's network")
            result.append(_connect(target, timeout))
        except OSError as e:
            result.append(e)

    try:
        thread = threading.Thread(target=run, name="gpulab-ssh-netns", daemon=True)
        thread.start()
        thread.join(timeout + 5)
    finally:
        os.close(ns_fd)
    if not result:
        raise OSError("timed out connecting in the container's network")
    if isinstance(result[0], OSError):
        raise result[0]
    return result[0]


def _connect(target: Target, timeout: float) -> socket.socket:
    family = socket.AF_INET6 if ":" in target.address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect((target.address, target.port))
        sock.setblocking(False)
        return sock
    except BaseException:
        sock.close()
        raise
