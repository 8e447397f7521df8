"""Whose is a TCP port (spawners/node/sockets.py): parsing /proc/net/tcp*, and the ownership
rule the SSH gateway's forwarding and published ports both rest on (issue 25: "forward to
127.0.0.1:<hub port> ... to another user's port" refused; "publishing a port the hub or another
user's server listens on" refused). Real sockets and real processes, read from the real /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from gpulab.spawners.node import sockets

TCP4 = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 17 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  1000        0 999 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:1F9"""

TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5151 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:0051 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 78 1 0000000000000000 100 0 0 10 0
"""


@pytest.mark.skipif(
    sys.byteorder != "little", reason="the samples were taken on a little-endian node"
)
def test_only_listening_sockets_are_parsed_with_their_address_port_and_inode() -> None:
    assert sockets.parse_proc_net_tcp(TCP4) == [
        sockets.Listener(8080, "127.0.0.1", 4242),
        sockets.Listener(22, "0.0.0.0", 17),
    ]
    assert sockets.parse_proc_net_tcp(TCP6) == [
        sockets.Listener(8081, "::1", 5151),
        sockets.Listener(80, "::", 77),
        sockets.Listener(81, "127.0.0.1", 78),
    ]
    assert sockets.Listener(80, "::", 77).wildcard and not sockets.Listener(1, "::1", 2).wildcard


def _listen(address: str = "127.0.0.1", port: int = 0, family=socket.AF_INET) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((address, port))
    s.listen()
    return s


def test_a_port_this_process_listens_on_is_its_own_and_nobody_elses() -> None:
    with _listen() as s:
        port = s.getsockname()[1]
        assert sockets.listener_owned_by(port, [os.getpid()])
        assert sockets.loopback_address(port) == "127.0.0.1"
        # pid 1 (init) holds no such socket; no pids at all owns nothing
        assert not sockets.listener_owned_by(port, [1])
        assert not sockets.listener_owned_by(port, [])
    # closed: nothing listens, so nobody owns it
    assert not sockets.listener_owned_by(port, [os.getpid()])


def test_a_second_listener_on_another_loopback_address_does_not_make_the_port_yours() -> None:
    """The attack: the hub listens on 127.0.0.1:P; the user binds 127.0.0.2:P (or [::1]:P) to
    make "localhost:P" look like theirs. Every listener on P must be the user's."""
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen();"
            "print(s.getsockname()[1], flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(other.stdout.readline())
        assert sockets.listener_owned_by(port, [other.pid])
        with _listen("127.0.0.2", port):
            assert not sockets.listener_owned_by(port, [os.getpid()])
            assert not sockets.listener_owned_by(port, [other.pid])
            assert sockets.listener_owned_by(port, [os.getpid(), other.pid])
    finally:
        other.stdin.close()
        other.wait(timeout=10)


def test_ipv6_loopback_listeners_are_seen() -> None:
    require(socket.has_ipv6, "IPv6")
    try:
        s = _listen("::1", 0, socket.AF_INET6)
    except OSError:
        s = None
    require(s is not None, "an IPv6 loopback (::1)")
    assert s is not None
    with s:
        port = s.getsockname()[1]
        assert sockets.listeners_on(port)[0].address == "::1"
        assert sockets.listener_owned_by(port, [os.getpid()])
        assert sockets.loopback_address(port) == "::1"


def test_pids_of_a_cgroup_include_its_subgroups_and_a_gone_group_has_none(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("10\n11\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cgroup.procs").write_text("12\n")
    assert sockets.pids_of_cgroup(tmp_path) == [10, 11, 12]
    assert sockets.pids_of_cgroup(tmp_path / "cgroup.procs") == [10, 11, 12]
    assert sockets.pids_of_cgroup(tmp_path, recursive=False) == [10, 11]
    assert sockets.pids_of_cgroup(tmp_path / "gone") == []


def test_a_containers_sockets_are_read_in_its_own_network_namespace() -> None:
    """``netns_pid`` reads /proc/PID/net: for our own pid that is our namespace, the same."""
    with _listen() as s:
        port = s.getsockname()[1]
        assert sockets.listener_owned_by(port, [os.getpid()], netns_pid=os.getpid())
