"""The SSH gateway's host key (issue 25): made once, root's alone, and the same at every start
(a new key at each start would make every client's known_hosts warn of an impostor)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpulab.ssh_service.app import host_key
from gpulab.ssh_service.sessions import transfer_command


def test_the_host_key_is_made_once_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "data" / "ssh" / "host_ed25519"
    first = host_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.stat().st_uid == os.geteuid()
    again = host_key(path)
    assert again.export_public_key() == first.export_public_key()
    assert first.get_algorithm() == "ssh-ed25519"
    assert [p.name for p in path.parent.iterdir()] == ["host_ed25519"]  # no temporary left


def test_only_plain_transfers_run_without_a_server() -> None:
    """With no server running, only rsync's and scp's server sides run (issue 25: files with no
    server, nothing billed), split without a shell: no command rides along, and rsync's daemon
    mode (whose config can run commands) is refused."""
    assert transfer_command("rsync --server -vlogDtpre.iLsfxCIvu . dest/") is not None
    assert transfer_command("scp -t -- dest") is not None
    assert transfer_command("scp -v -f src") is not None
    for command in (
        "python train.py",
        "rsync --server --daemon .",
        "rsync --server --config=/tmp/x.conf --daemon .",
        "rsync -e sh x y",
        "scp src dest",
        "scp -o ProxyCommand=sh -t x",
        "bash -c 'rsync --server .'",
        "rsync --server . 'unclosed",
    ):
        assert transfer_command(command) is None, command
    # A shell's separators are plain arguments to rsync then, never a second command.
    assert transfer_command("rsync --server . x; touch pwned")[-2:] == ["touch", "pwned"]
