"""SSH benchmark: gpulab's SSH gateway vs OpenSSH's own sshd on the same machine, in one run.

Issue 25's goal: ``ssh NAME@hub true`` round trip (p50/p95) and SFTP throughput for a 1 GB
file within 2x of OpenSSH. Both sides serve the same account (the gpulab user's own Unix
account, made by the hub at the user's first start), the same home and the same client:

- gpulab: a real hub (``gpulab up``, as the tests start it) with its gateway on a free port; the
  user's key added through the hub's API, a no-GPU server running (the shell runs in it:
  authorize and session asked of the hub, then the server's cgroup and namespaces joined);
- OpenSSH: ``/usr/sbin/sshd -D -f TEMPCONFIG`` as root on 127.0.0.1, a temporary host key and
  an authorized_keys file holding the same public key for that account (``StrictModes no``:
  the file lives in the benchmark's temp folder), the same ``sftp-server`` binary, and Debian's
  PAM stack (``UsePAM yes``, sshd's packaged default; without PAM sshd refuses the account,
  which has no password and so counts as locked).

Each round trip is a new connection (``ssh -p P -i KEY ... NAME@127.0.0.1 true``: key exchange,
public-key log-in, a session, the command, exit status), alternating between the two so that
drift on a shared machine hits both alike. SFTP puts and then gets a 1 GiB file of random bytes
(written once to the temp folder: a real file, not sparse; the copies are removed after each
transfer). Needs root (sshd, the accounts).

    .venv/bin/python benchmarks/ssh.py [--rounds 30] [--sftp-rounds 3] [--size-mb 1024]
"""

from __future__ import annotations

import argparse
import os
import platform
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import Hub, free_port, wait_for
from ssh_helpers import CLIENT_OPTIONS, KEY_ONLY, banner

from gpulab.spawners.storage.loopfs import unmount_below

# The tests' client options (ConnectTimeout included), key only; --cipher adds to it.
CLIENT = [*CLIENT_OPTIONS, *KEY_ONLY]

SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {tmp}/host_ed25519
PidFile {tmp}/sshd.pid
AuthorizedKeysFile {tmp}/authorized_keys/%u
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
AllowUsers {account}
AllowAgentForwarding no
X11Forwarding no
PrintMotd no
Subsystem sftp {sftp_server}
"""


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def ssh_true(port: int, user: str, key: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(
        ["ssh", "-p", str(port), *CLIENT, "-i", str(key), f"{user}@127.0.0.1", "true"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"ssh -p {port} {user}@ true: {r.returncode} {r.stderr.decode()}")
    return dt


def negotiated(port: int, user: str, key: Path) -> str:
    """The cipher this client and that server agree on (``ssh -v``: "cipher: ...")."""
    r = subprocess.run(
        ["ssh", "-v", "-p", str(port), *CLIENT, "-i", str(key), f"{user}@127.0.0.1", "true"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    for line in r.stderr.decode(errors="replace").splitlines():
        if "cipher: " in line:
            return line.split("cipher: ", 1)[1].split()[0]
    return "?"


def sftp(port: int, user: str, key: Path, batch: str) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(
        ["sftp", "-P", str(port), *CLIENT, "-i", str(key), "-b", "-", f"{user}@127.0.0.1"],
        input=batch.encode(),
        capture_output=True,
        timeout=1800,
    )
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"sftp -P {port}: {r.returncode} {r.stderr.decode()[-2000:]}")
    return dt


def start_sshd(tmp: Path, account: str, public_key: str) -> tuple[subprocess.Popen, int]:
    sshd = shutil.which("sshd", path="/usr/sbin:/usr/bin") or "/usr/sbin/sshd"
    sftp_server = next(
        (
            p
            for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/sftp-server")
            if Path(p).exists()
        ),
        "internal-sftp",
    )
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "host_ed25519")],
        check=True,
    )
    keys = tmp / "authorized_keys"
    keys.mkdir(mode=0o755)
    (keys / account).write_text(public_key + "\n")
    (keys / account).chmod(0o644)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    port = free_port()
    config = tmp / "sshd_config"
    config.write_text(
        SSHD_CONFIG.format(port=port, tmp=tmp, account=account, sftp_server=sftp_server)
    )
    proc = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "sshd.log", "wb"),
        start_new_session=True,
    )
    wait_for(lambda: proc.poll() is None and banner(port), 30, 0.1, "sshd to answer")
    return proc, port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="ssh true round trips per side")
    ap.add_argument("--sftp-rounds", type=int, default=3, help="1 GB puts and gets per side")
    ap.add_argument("--size-mb", type=int, default=1024, help="the SFTP file's size in MiB")
    ap.add_argument(
        "--cipher",
        default="",
        help="the client's cipher for both sides (ssh -c), e.g. aes128-gcm@openssh.com; "
        "default: the client's own choice among what each server offers (OpenSSH 9 with sshd: "
        "chacha20-poly1305@openssh.com; with the gateway, which offers AES-GCM only: "
        "aes128-gcm@openssh.com)",
    )
    args = ap.parse_args()
    if args.cipher:
        CLIENT.extend(["-c", args.cipher])
    if os.geteuid() != 0:
        print("benchmarks/ssh.py needs root (sshd, the user's account)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="gpulab-bench-ssh-"))
    tmp.chmod(0o755)
    hub = Hub(tmp / "data", simulate="RTX-4090:1", ssh_port=True)
    sshd = None
    name = f"sshb{uuid.uuid4().hex[:6]}"
    account = ""
    try:
        hub.start()
        wait_for(lambda: banner(hub.ssh_port), 60, 0.2, "the gateway to answer")
        hub.create_user(name)
        token = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 3600}).json()["token"]
        key = tmp / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        public = Path(f"{key}.pub").read_text().strip()
        r = hub.api("POST", f"/gpulab/users/{name}/ssh-keys", token=token, json={"key": public})
        assert r.status_code == 201, r.text
        hub.spawn_ready(name, {"gpu": "none"})
        session = hub.api(
            "POST",
            "/gpulab/ssh/session",
            token=(hub.data_dir / "ssh-api-token").read_text().strip(),
            json={"user": name, "server": ""},
        ).json()
        account, home = session["account"], session["home"]
        assert pwd.getpwnam(account).pw_dir == home, (account, home)
        sshd, sshd_port = start_sshd(tmp, account, public)
        sides = {"gpulab": (hub.ssh_port, name), "openssh": (sshd_port, account)}

        ciphers = {side: negotiated(port, user, key) for side, (port, user) in sides.items()}
        for port, user in sides.values():  # warm both (first connections load code)
            for _ in range(2):
                ssh_true(port, user, key)
        times: dict[str, list[float]] = {s: [] for s in sides}
        for _ in range(args.rounds):
            for side, (port, user) in sides.items():
                times[side].append(ssh_true(port, user, key))

        payload = tmp / "payload.bin"
        with open(payload, "wb") as f:
            for _ in range(args.size_mb):
                f.write(os.urandom(2**20))
        size_mb = payload.stat().st_size / 2**20
        put: dict[str, list[float]] = {s: [] for s in sides}
        get: dict[str, list[float]] = {s: [] for s in sides}
        for i in range(args.sftp_rounds):
            for side, (port, user) in sides.items():
                remote = f"bench-{side}-{i}.bin"
                put[side].append(size_mb / sftp(port, user, key, f"put {payload} {remote}\n"))
                back = tmp / "back.bin"
                get[side].append(
                    size_mb / sftp(port, user, key, f"get {remote} {back}\nrm {remote}\n")
                )
                assert back.stat().st_size == payload.stat().st_size
                back.unlink()
        payload.unlink()

        print(
            f"# {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"load {os.getloadavg()[0]:.1f}; {args.rounds} round trips, "
            f"{args.sftp_rounds} x {size_mb:.0f} MiB each way; cipher "
            f"{args.cipher or 'the client default'} ("
            + ", ".join(f"{side}: {c}" for side, c in ciphers.items())
            + ")"
        )
        print(f"{'':10} {'ssh true p50':>13} {'p95':>8} {'sftp put MB/s':>14} {'get MB/s':>9}")
        for side in sides:
            print(
                f"{side:10} {statistics.median(times[side]):12.3f}s "
                f"{pct(times[side], 95):7.3f}s {statistics.median(put[side]):14.0f} "
                f"{statistics.median(get[side]):9.0f}"
            )
        g, o = "gpulab", "openssh"
        print(
            f"{'ratio':10} {statistics.median(times[g]) / statistics.median(times[o]):12.2f}x "
            f"{pct(times[g], 95) / pct(times[o], 95):7.2f}x "
            f"{statistics.median(put[o]) / statistics.median(put[g]):13.2f}x "
            f"{statistics.median(get[o]) / statistics.median(get[g]):8.2f}x"
            "   (time ratios: gpulab / OpenSSH; lower is better)"
        )
        return 0
    finally:
        if sshd is not None and sshd.poll() is None:
            os.killpg(sshd.pid, signal.SIGTERM)
            sshd.wait(10)
        if hub.proc is not None and hub.server(name) is not None:
            hub.stop_server(name)
        hub.stop()
        # The Unix account gpulab made for this throwaway user: gpulab never removes one.
        if account.startswith("jupyter-"):
            subprocess.run(["userdel", account], capture_output=True, timeout=60)
        unmount_below(tmp)  # the user's home is a loop-mounted image (it stays mounted at a stop)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
