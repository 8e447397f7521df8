"""Who listens on a port (spawners/local/ports.py), asked of this machine's real /proc with real
listening processes: a starting server's own listener, one of its children's, another's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from harness import wait_for

from gpulab.spawners.local.ports import held_by_another
from gpulab.spawners.node.sockets import listeners_on

LISTEN = "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)"


def listener(*wrap: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [*wrap, sys.executable, "-c", LISTEN],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # ended whole (end())
    )
    return proc, int(proc.stdout.readline())


def end(*procs: subprocess.Popen) -> None:
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()


def test_the_servers_own_listener_is_its_own_and_anothers_is_not():
    mine, port = listener()
    other, _ = listener()
    try:
        assert listeners_on(port)
        assert not held_by_another(port, mine.pid)
        assert held_by_another(port, other.pid)  # the port is `mine`'s, not `other`'s
    finally:
        end(mine, other)
    assert not held_by_another(port, other.pid)  # nobody listens now: nothing to say


def test_a_listener_in_a_child_of_the_server_is_the_servers():
    # A launcher that forks the server (a shell here) holds no socket itself.
    shell, port = listener("bash", "-c", '"$@"; true', "sh")
    try:
        assert not held_by_another(port, shell.pid)
    finally:
        end(shell)


def test_a_port_only_connected_to_is_nobodys_listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        try:
            assert len(listeners_on(port)) == 1  # the listener, not the connected pair
        finally:
            client.close()
    wait_for(lambda: not listeners_on(port), 5, 0.05, "the listener to close")
