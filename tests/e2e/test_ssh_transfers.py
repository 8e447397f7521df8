"""File transfers with no server running (issue 25, attack wave: findings F1-F3), with Debian's
``sftp`` against a real hub's SSH gateway: confined like a local server, bounded, unseen.

Issue 25 points covered: "SFTP/scp/rsync to the home, with the user's quota and permissions (as
their account) ... it works while the user's server is stopped, in no-GPU terms (nothing billed
beyond storage)"; "SSH as a way around the balance check (a stopped or out-of-credit user)";
"SFTP outside the home".

Each test fails on the code before this fix: stopped-mode transfers ran on the host as the
account in the host's mount namespace and cgroup, with no cap (a probe put into /tmp, /var/tmp
and /dev/shm landed on the host; ``ls /proc`` listed every process of the node; the sftp-server
was in the root cgroups; a fifth session ran like the first four).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from course_helpers import token_for
from harness import Hub, wait_for
from ssh_helpers import Key, add_key, keygen, session_of, ssh_cmd, wait_gateway

SFTP_SERVER = "/usr/lib/openssh/sftp-server"


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    h = module_hub_factory("ssh-transfers", ssh_port=True)
    wait_gateway(h)
    return h


def person(hub: Hub, folder: Path) -> tuple[str, Key]:
    name = hub.create_user(f"sst{uuid.uuid4().hex[:6]}")
    key = keygen(folder)
    add_key(hub, name, token_for(hub, name), key)
    return name, key


def sftp_argv(hub: Hub, name: str, key: Key) -> list[str]:
    opts = ssh_cmd(hub, name, key)[3:-1]  # the key options
    return ["sftp", "-P", str(hub.ssh_port), *opts, "-b", "-", f"{name}@127.0.0.1"]


def sftp_batch(hub: Hub, name: str, key: Key, commands: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        sftp_argv(hub, name, key), input=commands.encode(), capture_output=True, timeout=60
    )


def sftp_servers_of(uid: int) -> list[int]:
    """The node's sftp-server processes running as ``uid`` (read as root from the host)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(SFTP_SERVER.encode()):
            found.append(int(entry))
    return found


def held_sftp(hub: Hub, name: str, key: Key) -> subprocess.Popen:
    """An sftp session kept open (its batch comes on stdin, which stays open)."""
    return subprocess.Popen(
        sftp_argv(hub, name, key),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def close(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.stdin:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_no_server_sftp_writes_nothing_on_the_host_and_sees_no_other_process(
    hub: Hub, tmp_path: Path
) -> None:
    """Finding F1/F2: with no server, a put into /tmp, /var/tmp and /dev/shm lands in the
    transfer's own small scratch, never in the host's folder (which has no such file after);
    ``ls /proc`` shows the account's processes only; files still land in the home, the
    account's."""
    name, key = person(hub, tmp_path)
    assert hub.server(name) is None
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(2**16))
    probe = f"f3probe-{uuid.uuid4().hex[:8]}"
    targets = [f"/tmp/{probe}", f"/var/tmp/{probe}", f"/dev/shm/{probe}"]
    # "-put": a refused put is no failure of the batch (the point is where nothing lands).
    batch = "".join(f"-put {blob} {t}\n" for t in targets) + f"put {blob} home.bin\n"
    r = sftp_batch(hub, name, key, batch + "ls -1 /proc\n")
    assert r.returncode == 0, r.stderr
    for t in targets:
        assert not os.path.exists(t), f"{t} landed on the host"
    session = session_of(hub, name)
    st = (Path(session["home"]) / "home.bin").stat()
    assert st.st_uid == session["uid"] and st.st_size == blob.stat().st_size

    listed = {
        int(w.rsplit("/", 1)[-1])
        for w in r.stdout.decode().split()
        if w.rsplit("/", 1)[-1].isdigit()
    }
    assert listed, r.stdout  # the sftp-server itself, at least
    assert os.getpid() not in listed and 1 not in listed, sorted(listed)[:20]
    assert len(listed) <= 8, sorted(listed)[:20]


def test_no_server_transfer_runs_in_the_users_transfer_cgroup(hub: Hub, tmp_path: Path) -> None:
    """Finding F3: a no-server sftp-server is in the user's transfer cgroup, whose limits hold
    (CPU half a core, 64 pids, 512 MiB); it ends with its session, and the emptied group is
    removed (nothing left behind on the node)."""
    name, key = person(hub, tmp_path)
    uid = session_of(hub, name)["uid"]
    proc = held_sftp(hub, name, key)
    try:
        pids = wait_for(lambda: sftp_servers_of(uid), 30, 0.1, "the sftp-server")
        groups = dict(
            (line.split(":", 2)[1], line.split(":", 2)[2])
            for line in Path(f"/proc/{pids[0]}/cgroup").read_text().splitlines()
        )
        expected = "/gpulab-ssh/"
        cpu = next(v for k, v in groups.items() if "cpu" in k.split(","))
        for path in (groups["pids"], groups["memory"], cpu):
            assert path.startswith(expected), groups
        root = Path("/sys/fs/cgroup")
        assert (root / "pids" / groups["pids"].lstrip("/") / "pids.max").read_text().strip() == (
            "64"
        )
        memory = root / "memory" / groups["memory"].lstrip("/") / "memory.limit_in_bytes"
        assert int(memory.read_text()) == 512 * 2**20
        quota = root / "cpu" / cpu.lstrip("/") / "cpu.cfs_quota_us"
        assert int(quota.read_text()) == 50_000
    finally:
        close([proc])
    wait_for(lambda: not sftp_servers_of(uid), 30, 0.1, "the sftp-server to end")
    group = Path("/sys/fs/cgroup/pids") / groups["pids"].lstrip("/")
    wait_for(lambda: not group.exists(), 30, 0.1, "the transfer cgroup to go")


def test_a_fifth_no_server_transfer_is_refused(hub: Hub, tmp_path: Path) -> None:
    """Finding F3: at most 4 transfer sessions of one user at once with no server; the fifth
    gets a message saying so, and one more runs when one has ended."""
    name, key = person(hub, tmp_path)
    uid = session_of(hub, name)["uid"]
    held = [held_sftp(hub, name, key) for _ in range(4)]
    try:
        wait_for(lambda: len(sftp_servers_of(uid)) == 4, 60, 0.1, "4 sftp-servers")
        r = sftp_batch(hub, name, key, "ls\n")
        assert r.returncode != 0
        assert b"at most 4 at once" in r.stderr, r.stderr
        close(held[:1])
        wait_for(lambda: len(sftp_servers_of(uid)) == 3, 30, 0.1, "one sftp-server to end")
        r = sftp_batch(hub, name, key, "ls\n")
        assert r.returncode == 0, r.stderr
    finally:
        close(held)
