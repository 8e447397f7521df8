"""Issue 23, scratch space (point "/tmp, /dev/shm per server bounded by the catalog and wiped at
stop") beyond /tmp: what a local server's sandbox still shared with the host.

Attacks from the red team, each on real hubs, servers and kernels (root):

1. /var/tmp and /run/lock (/var/lock) were the host's root disk, shared by every server: a kernel
   wrote there unbounded and uncounted, kept after stop, readable by another user's server.
2. SysV shared memory outlived the server (and every tenant saw every segment): memory nobody
   accounts for, piling up across starts.
3. A grading job's mount namespace held every user's home: a quota change or release of any
   user answered "in use" for as long as the grading ran.
"""

from __future__ import annotations

import os
import pwd
import random
import subprocess
import uuid
from pathlib import Path

import pytest
from course_helpers import NBGRADER_SOURCE
from harness import FAST_BILLING_ENV, Hub, Kernel, catalog_with, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="private namespaces need a root hub")

MiB = 2**20


@pytest.fixture(scope="module")
def shub(module_hub_factory, tmp_path_factory) -> Hub:
    """A hub whose servers have 32 MiB of /tmp and of /dev/shm."""
    folder = tmp_path_factory.mktemp("sandbox-catalog")
    catalog = catalog_with(folder, free_gb=0.0625, max_gb=0.25, tmp_gb=0.03125, shm_gb=0.03125)
    return module_hub_factory(
        "sandbox-storage", simulate="RTX-4090:1", catalog=catalog, env=FAST_BILLING_ENV
    )


FILL = """
import errno, os
n, got = 0, "NOT-REFUSED"
try:
    with open({path!r}, "wb") as f:
        while n < {limit}:
            f.write(b"v" * 2**20); f.flush(); os.fsync(f.fileno()); n += 1
except OSError as e:
    got = errno.errorcode[e.errno]
print(got, n)
"""


def test_var_tmp_and_run_lock_are_the_servers_own(shub: Hub) -> None:
    """Attack 1: alice's kernel fills /var/tmp (bounded at 40 MiB here; on the old code all of it
    went to the host's disk): ENOSPC at her 32 MiB of scratch; a file she leaves in /var/tmp and
    in /var/lock (/run/lock) is neither on the host nor visible in bob's server, and is gone after
    her server restarts."""
    alice, bob = shub.create_user(), shub.create_user()
    big, left, lock = f"/var/tmp/big-{alice}", f"/var/tmp/left-{alice}", f"/var/lock/lk-{alice}"
    try:
        shub.spawn_ready(alice, {"gpu": "none"})
        with shub.kernel(alice) as k:
            got, n = k.execute(FILL.format(path=big, limit=40), timeout=120).split()
            assert got == "ENOSPC" and int(n) <= 32, (got, n)
            k.execute(f"import os; os.remove({big!r})")
            out = k.execute(
                f"open({left!r}, 'w').write('alice'); open({lock!r}, 'w').write('alice');"
                f"import os; print(os.path.exists({left!r}), os.path.exists({lock!r}))"
            )
            assert out.strip() == "True True"
            for path in (big, left, lock):
                assert not Path(path).exists(), f"{path} reached the host"
            shub.spawn_ready(bob, {"gpu": "none"})
            with shub.kernel(bob) as kb:
                seen = kb.execute(
                    f"import os; print(os.path.exists({left!r}), os.path.exists({lock!r}))"
                )
                assert seen.strip() == "False False"
        shub.stop_server(alice)
        shub.spawn_ready(alice, {"gpu": "none"})
        with shub.kernel(alice) as k:
            again = k.execute(
                f"import os; print(os.path.exists({left!r}), os.path.exists({lock!r}))"
            )
            assert again.strip() == "False False"
    finally:
        for path in (big, left, lock):  # what the old code left on the host
            Path(path).unlink(missing_ok=True)


SHMGET = """
import ctypes
c = ctypes.CDLL(None, use_errno=True)
shmid = c.shmget({key}, {size}, 0o1000 | 0o600)  # IPC_CREAT
print(shmid)
"""


def segment_keys(text: str) -> set[int]:
    """The keys of /proc/sysvipc/shm's segments."""
    return {int(line.split()[0]) for line in text.splitlines()[1:] if line.strip()}


def test_sysv_shared_memory_dies_with_the_server_and_is_private(shub: Hub) -> None:
    """Attack 2: carla's kernel makes a 16 MiB SysV segment (on the old code: listed by every
    tenant's /proc/sysvipc/shm and kept in the host's after her server stopped, unaccounted);
    dan's server cannot see it while hers runs, and after the stop it is gone from the host."""
    carla, dan = shub.create_user(), shub.create_user()
    key = random.randint(1 << 20, 1 << 30)
    try:
        shub.spawn_ready(carla, {"gpu": "none"})
        with shub.kernel(carla) as k:
            shmid = int(k.execute(SHMGET.format(key=key, size=16 * MiB)).strip())
            assert shmid >= 0
            mine = k.execute("print(open('/proc/sysvipc/shm').read())")
            assert key in segment_keys(mine)
            shub.spawn_ready(dan, {"gpu": "none"})
            with shub.kernel(dan) as kd:
                theirs = kd.execute("print(open('/proc/sysvipc/shm').read())")
                assert key not in segment_keys(theirs)
        shub.stop_server(carla)
        assert key not in segment_keys(Path("/proc/sysvipc/shm").read_text())
    finally:
        subprocess.run(["ipcrm", "-M", str(key)], capture_output=True)  # the old code's leftover


ASSIGNMENT = "ps1"
TIME_LIMIT = 40
SUBMIT = r"""
import os, nbformat
root = os.path.expanduser("~/courses/{course}")
nb = nbformat.read(f"{{root}}/release/{assignment}/{assignment}.ipynb", as_version=4)
cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {{}}).get("grade_id") == "square")
cell.source = "import time\nwhile True:\n    time.sleep(1)"
folder = f"{{root}}/submitted/{student}/{assignment}"
os.makedirs(folder, exist_ok=True)
nbformat.write(nb, f"{{folder}}/{assignment}.ipynb")
open(f"{{folder}}/timestamp.txt", "w").write("2026-01-01 10:00:00.000000 UTC")
print("submitted")
"""


def grading_pids() -> list[int]:
    """Processes of the throwaway grading uids (Autograder.sandbox_uid_base and up)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid >= 2_100_000_000:
                pids.append(int(entry))
        except OSError:
            pass
    return pids


def mount_points(pid: int) -> list[str] | None:
    """The mount points of ``pid``'s mount namespace; None once it has ended."""
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return [line.split()[4] for line in f] or None
    except OSError:
        return None


def a_grading_namespace() -> list[str] | None:
    """The mount points seen by a process of the grading sandbox, once one runs."""
    for pid in grading_pids():
        points = mount_points(pid)
        if points:
            return points
    return None


@pytest.mark.xdist_group("grading")
@pytest.mark.timeout(900)
def test_a_grading_job_pins_no_home(hub_factory) -> None:
    """Attack 3: while a (never-ending) submission is graded, the grading sandbox's mount
    namespace holds no user's home: not the teacher's, not a bystander's with a running server
    (on the old code ``unshare --mount`` copied every home mount of the node and kept them for
    the whole time limit, so each one's quota change or release answered 409 "in use")."""
    hub = hub_factory(
        "sandbox-grading", simulate="RTX-4090:1",
        extra_args=[f"--Autograder.time_limit={TIME_LIMIT}"],
    )  # fmt: skip
    tag = uuid.uuid4().hex[:6]
    teacher, student, bystander, course = f"tch{tag}", f"stu{tag}", f"eve{tag}", f"alg{tag}"
    hub.create_user(teacher)
    r = hub.api("POST", "/gpulab/courses", json={"name": course, "teachers": [teacher]})
    assert r.status_code == 201, r.text
    r = hub.api(
        "POST", f"/gpulab/courses/{course}/roster", data=f"{student},student\n".encode(),
        headers={"Content-Type": "text/csv"},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    hub.create_user(bystander)
    hub.spawn_ready(bystander, {"gpu": "none"})
    hub.spawn_ready(teacher, {"gpu": "none"})
    homes = str(hub.data_dir / "users") + "/"
    assert any(p.startswith(homes + bystander) for p in mount_points(os.getpid()) or [])
    kernel = Kernel(hub, teacher)
    try:
        src = NBGRADER_SOURCE.replace("COURSE", course).replace("ASSIGNMENT", ASSIGNMENT)
        assert "written" in kernel.execute(src)
        out = kernel.execute(
            "import subprocess; r = subprocess.run(['nbgrader', 'generate_assignment', "
            f"'{ASSIGNMENT}', '--course', '{course}'], capture_output=True, text=True); "
            "print(r.returncode, r.stderr[-2000:])",
            timeout=240,
        )
        assert out.startswith("0 "), out
        done = kernel.execute(
            SUBMIT.format(course=course, assignment=ASSIGNMENT, student=f"jupyter-{student}")
        )
        assert "submitted" in done
        r = hub.api("POST", f"/users/{teacher}/tokens", json={"expires_in": 3600})
        assert r.status_code == 201, r.text
        token = r.json()["token"]
        url = f"/gpulab/courses/{course}/assignments/{ASSIGNMENT}/autograde"
        r = hub.api("POST", url, token=token, json={})
        assert r.status_code == 202, r.text
        job_path = r.json()["status_url"].split("/hub/api", 1)[1]
        points = wait_for(a_grading_namespace, timeout=120, interval=0.5, what="grading")
        held = [p for p in points if p.startswith(homes)]
        assert held == [], f"the grading namespace holds homes: {held}"
        home = Path(pwd.getpwnam(f"jupyter-{teacher}").pw_dir)
        assert home.is_dir()

        def finished() -> dict | None:
            got = hub.api("GET", job_path, token=token).json()
            return got if got["state"] in ("done", "failed") else None

        job = wait_for(finished, timeout=TIME_LIMIT + 240, interval=1, what="the grading")
        assert job["submissions"][f"jupyter-{student}"]["state"] == "timeout", job
    finally:
        kernel.close()
