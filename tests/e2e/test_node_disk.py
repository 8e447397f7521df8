"""The node's disk on a user's behalf (issue 23, part B): what the hub writes for a user's server
is bounded, so a user cannot fill the disk the hub, billing and every other home live on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import Hub, wait_for

LOG_CAP = 256 * 1024
# The hub appends its own lines (a start banner, an exit code) to the current file besides the
# keeper's output; a few of them may pass the cap by their length.
HUB_LINES = 4096


def keepers_of(log: Path) -> list[int]:
    """Pids of the log keepers writing ``log``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"gpulab.spawners.local.serverlog" in argv and str(log).encode() in argv:
            out.append(int(entry.name))
    return out


def on_disk(log: Path) -> int:
    return sum(p.stat().st_size for p in (log, Path(f"{log}.1")) if p.exists())


@pytest.mark.parametrize("forkserver", [True, False], ids=["forkserver", "popen"])
def test_a_server_printing_forever_keeps_its_log_under_the_cap(hub_factory, forkserver) -> None:
    """Issue 23, attack "fill the node's disk through logs the hub writes on the user's behalf":
    a kernel prints 3x the cap into the server's stdout (which the hub writes to
    DATA_DIR/logs/NAME.log); the log and its rotated half stay under the cap, the writer is not
    killed, the next start's banner is still logged, and no keeper outlives the server.
    Fails on the old code: the server wrote the log file itself, 768 KiB and growing."""
    hub: Hub = hub_factory(
        "logcap",
        simulate="A100-80G:1",
        extra_args=[
            f"--GpuLocalSpawner.log_max_bytes={LOG_CAP}",
            f"--GpuLocalSpawner.use_forkserver={forkserver}",
        ],
    )
    user = hub.create_user()
    hub.spawn_ready(user, {"gpu": "none"})
    log = next((hub.data_dir / "logs").glob(f"{user}*.log"))
    line = "y" * 1023 + "\n"
    with hub.kernel(user) as k:
        wrote = k.execute(
            # The kernel's fd 1 goes to the notebook; what it had from the server (ipykernel
            # keeps a copy) goes to the server's log.
            "import os, sys\n"
            f"line = {line.encode()!r}\n"
            "n = 0\n"
            "out = sys.stdout._original_stdstream_copy\n"
            f"while n < {3 * LOG_CAP}:\n"
            "    n += os.write(out, line)\n"
            "os.write(out, b'END-OF-FLOOD\\n')\n"
            "print(n)"
        )
    assert int(wrote) >= 3 * LOG_CAP
    wait_for(lambda: "END-OF-FLOOD" in log.read_text(errors="replace"), 30, what="the flood")
    assert on_disk(log) <= LOG_CAP + HUB_LINES, f"{on_disk(log)} bytes of log for a cap {LOG_CAP}"
    assert keepers_of(log), "the server's output goes through a keeper"

    hub.stop_server(user)
    wait_for(lambda: not keepers_of(log), 30, what="the log keeper to end with the server")
    hub.spawn_ready(user, {"gpu": "none"})
    text = "".join(p.read_text(errors="replace") for p in (Path(f"{log}.1"), log) if p.exists())
    assert text.rfind("--- gpulab: starting") > text.rfind("END-OF-FLOOD"), text[-2000:]
    assert on_disk(log) <= LOG_CAP + HUB_LINES
    assert os.stat(log).st_uid == 0 or os.geteuid() != 0, "the log stays the hub's file"
    hub.stop_server(user)
    wait_for(lambda: not keepers_of(log), 30, what="the log keeper to end with the server")


EXCHANGE_MB = 16  # per person: a course of a teacher and a student has 32 MiB

FLOOD_EXCHANGE = """
import errno, glob, os
inbound = glob.glob(os.environ['JUPYTER_CONFIG_PATH'].split(':')[0] + '/exchange/*/inbound')[0]
n = 0
try:
    with open(os.path.join(inbound, 'huge'), 'wb', buffering=0) as f:
        while n < {size}:
            n += f.write(b'x' * 2**20)
        os.fsync(f.fileno())
    big = ('wrote', n)
except OSError as e:
    big = (errno.errorcode[e.errno], n)
os.remove(os.path.join(inbound, 'huge'))
os.mkdir(os.path.join(inbound, 'tiny'))
files = 0
try:
    while files < 100_000:
        open(os.path.join(inbound, 'tiny', str(files)), 'w').close()
        files += 1
    tiny = ('wrote', files)
except OSError as e:
    tiny = (errno.errorcode[e.errno], files)
import shutil
shutil.rmtree(os.path.join(inbound, 'tiny'))  # the student cleans up
print(*big, *tiny)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="bounded exchanges need a root hub")
def test_a_student_cannot_fill_the_node_through_the_nbgrader_exchange(hub_factory) -> None:
    """Issue 23, attack "fill the node's disk through the nbgrader exchange": a student writes a
    huge file, then 100,000 tiny files, into their course's inbound (what `nbgrader submit`
    does, done by hand). Both stop with ENOSPC in the student's own code at the course's room
    (its bytes, then its inodes); the node's disk does not notice. Fails on the old code: the
    exchange was a folder of the data dir's filesystem and took all of it."""
    from course_helpers import make_course, roster, token_for

    hub: Hub = hub_factory(
        "exchange",
        simulate="A100-80G:1",
        extra_args=[f"--GpuLocalSpawner.exchange_mb_per_person={EXCHANGE_MB}"],
    )
    teacher, student = f"t{os.urandom(3).hex()}", f"s{os.urandom(3).hex()}"
    course = f"c{os.urandom(3).hex()}"
    make_course(hub, course, [teacher])
    r = roster(hub, course, f"{student},student\n", token_for(hub, teacher))
    assert r.status_code == 200, r.text
    hub.spawn_ready(student, {"gpu": "none"}, timeout=120)
    room = 2 * EXCHANGE_MB * 2**20
    with hub.kernel(student) as k:
        big, wrote, tiny, files = k.execute(FLOOD_EXCHANGE.format(size=3 * room), 300).split()
    assert big == "ENOSPC" and int(wrote) <= room, (big, wrote)
    assert tiny == "ENOSPC" and int(files) < 100_000, (tiny, files)
    # What the node's disk holds for the course: its exchange image's blocks, about its room.
    image = hub.data_dir / "storage" / "exchange-images" / f"{course}.img"
    assert os.stat(image).st_blocks * 512 < room + 16 * 2**20
    # The course's exchange is its own filesystem, at the course's room.
    exchange = hub.data_dir / "courses" / "exchange" / course
    assert (
        os.path.ismount(exchange)
        and (lambda v: v.f_blocks * v.f_frsize)(os.statvfs(exchange)) >= room
    )
    # A student who joins later (the course grows while the exchange is mounted and in use, so
    # the node may refuse to grow it): their server starts and the course stays open to them.
    newcomer = f"s{os.urandom(3).hex()}"
    r = roster(hub, course, f"{student},student\n{newcomer},student\n", token_for(hub, teacher))
    assert r.status_code == 200, r.text
    hub.spawn_ready(newcomer, {"gpu": "none"}, timeout=120)
    with hub.kernel(newcomer) as k:
        listed = k.execute(
            "import glob, os\n"
            "inbound = glob.glob(os.environ['JUPYTER_CONFIG_PATH'].split(':')[0]"
            " + '/exchange/*/inbound')[0]\n"
            "os.mkdir(os.path.join(inbound, 'mine')); print('ok')"
        )
    assert listed.strip() == "ok"
