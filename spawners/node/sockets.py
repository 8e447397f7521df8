"""Which process listens on a TCP port of this node, read from /proc: is a port a user's own?

A local server shares the host's network, so "localhost:PORT" may be the user's web app, the
hub, billing, PostgreSQL or another user's server. Whatever connects to a port on a user's
behalf (the SSH gateway's ``-L`` forwarding, a published port) first asks here whether every
socket listening on that port belongs to a process of the user's own server (its cgroup).

Pure reading, no side effects: ``/proc/net/tcp`` and ``tcp6`` give the listening sockets (port,
address, inode); ``/proc/PID/fd`` links (``socket:[INODE]``) give which process holds which
socket. Root reads every process's; a port with no listener, or one listener that is not the
user's, is not the user's. Blocking (it walks /proc): call it in a thread from the event loop.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

# The kernel's TCP state number for LISTEN (include/net/tcp_states.h).
TCP_LISTEN = 0x0A


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its port, the address it is bound to and its inode."""

    port: int
    address: str
    inode: int

    @property
    def wildcard(self) -> bool:
        """Bound to every address (0.0.0.0 or ::): reachable on loopback too."""
        return ipaddress.ip_address(self.address).is_unspecified


def _address(hexaddr: str) -> str:
    """/proc/net/tcp's hex address (each 32-bit word in host byte order) as text."""
    raw = bytes.fromhex(hexaddr)
    words = [raw[i : i + 4] for i in range(0, len(raw), 4)]
    fixed = b"".join(int.from_bytes(w, sys.byteorder).to_bytes(4, "big") for w in words)
    addr = ipaddress.ip_address(fixed)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def parse_proc_net_tcp(text: str) -> list[Listener]:
    """The listening sockets in the text of ``/proc/net/tcp`` or ``/proc/net/tcp6``.

    Lines that do not parse are skipped (the header, a truncated last line)."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        try:
            if int(fields[3], 16) != TCP_LISTEN:
                continue
            hexaddr, _, hexport = fields[1].rpartition(":")
            found.append(Listener(int(hexport, 16), _address(hexaddr), int(fields[9])))
        except ValueError:
            continue
    return found


def listeners(pid: int | None = None, proc: Path = PROC) -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) in this node's network namespace, or, with
    ``pid``, in that process's (a container's: ``/proc/PID/net``)."""
    base = proc / "net" if pid is None else proc / str(pid) / "net"
    found: list[Listener] = []
    for name in ("tcp", "tcp6"):
        try:
            found += parse_proc_net_tcp((base / name).read_text())
        except OSError:
            continue
    return found


def listeners_on(port: int, pid: int | None = None, proc: Path = PROC) -> list[Listener]:
    """The listening sockets on ``port`` (every address)."""
    return [item for item in listeners(pid, proc) if item.port == port]


def pids_of_cgroup(path: str | os.PathLike, *, recursive: bool = True) -> list[int]:
    """The processes in a cgroup: ``path`` is its directory or its ``cgroup.procs`` file.

    With ``recursive`` (the default) the groups below it count too (they are the same
    server's). A group that is gone has no processes: []."""
    path = Path(path)
    top = path.parent if path.name == "cgroup.procs" else path
    found: list[int] = []
    walk = os.walk(top) if recursive else [(str(top), [], [])]
    for dirpath, _dirs, _files in walk:
        try:
            text = (Path(dirpath) / "cgroup.procs").read_text()
        except OSError:
            continue
        found += [int(x) for x in text.split() if x.isdigit()]
    return sorted(set(found))


def socket_inodes(pids: list[int] | set[int], proc: Path = PROC) -> set[int]:
    """The inodes of every socket the processes ``pids`` hold open (gone processes: none)."""
    inodes: set[int] = set()
    for pid in pids:
        fd_dir = proc / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(fd_dir / name)
            except OSError:
                continue
            if target.startswith("socket:[") and target.endswith("]"):
                inodes.add(int(target[8:-1]))
    return inodes


def listener_owned_by(
    port: int, pids: list[int] | set[int], *, netns_pid: int | None = None, proc: Path = PROC
) -> bool:
    """True when something listens on TCP ``port`` and EVERY socket listening on it (any
    address, IPv4 and IPv6) is held by one of ``pids``.

    Every, not any: a user who binds 127.0.0.2:PORT or [::1]:PORT next to the hub's
    127.0.0.1:PORT must not make "localhost:PORT" theirs. ``netns_pid`` reads the sockets of
    that process's network namespace instead of the node's."""
    found = listeners_on(port, netns_pid, proc)
    if not found or not pids:
        return False
    held = socket_inodes(pids, proc)
    return all(item.inode in held for item in found)


def loopback_address(port: int, netns_pid: int | None = None, proc: Path = PROC) -> str | None:
    """A loopback address on which a connection to ``port`` reaches its listener: "127.0.0.1"
    or "::1" (None when nothing listens there on loopback or a wildcard)."""
    for item in listeners_on(port, netns_pid, proc):
        if item.address in ("0.0.0.0", "127.0.0.1"):
            return "127.0.0.1"
        if item.address in ("::", "::1"):
            return "::1"
    return None
