"""Whether the process listening on a starting server's port is that server, or someone else.

A local server's port is chosen free (``random_port``: bind to port 0, then close) and bound by
the server a second or so later. Meanwhile any other process of the host may take it: another
server starting, a kernel's ZMQ sockets, a job runner. The server then fails to bind and exits,
but a check that only connects to the port succeeded at once, on the other process: the hub
routed the user to it (CI, stop 31: a kernel request answered 403 by another hub's job runner).
So the spawner asks /proc who listens (:mod:`gpulab.spawners.node.sockets`, as the SSH gateway
and published ports do): the server's process or one below it, or another. Blocking.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from gpulab.spawners.node.sockets import PROC, listeners_on, socket_inodes


class PortTaken(Exception):
    """The port chosen for a starting server is another process's."""


def descendants(pid: int, proc: Path = PROC) -> set[int]:
    """``pid`` and every process below it (a launcher may run the server as its child)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            stat = (proc / entry.name / "stat").read_text()
            children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def held_by_another(port: int, pid: int, proc: Path = PROC) -> bool:
    """Whether something listens on TCP ``port`` and none of it is held by ``pid`` or a process
    below it. False where nobody listens, or where ``pid``'s own descriptors cannot be read
    (nobody can tell)."""
    listening = {item.inode for item in listeners_on(port, proc=proc)}
    if not listening or not os.access(proc / str(pid) / "fd", os.R_OK | os.X_OK):
        return False
    if listening & socket_inodes([pid], proc):
        return False
    return not listening & socket_inodes(descendants(pid, proc), proc)
