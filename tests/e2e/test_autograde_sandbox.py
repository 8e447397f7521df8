"""Autograding never runs a student's code as the teacher: the hub grades each submission in a
sandbox of its own (docs/nbgrader.md, "Autograding").

Attack (issue 20, 3): a solution cell run by ``nbgrader autograde`` in the teacher's server runs
as the teacher; it copied another student's submission to a world-readable place and left a
detached process billed to the teacher. Here one submission tries every side effect at once (copy
another submission out, a double-forked ``setsid`` process, connections to the hub and to a port
on 127.0.0.1, a file in the teacher's home), another loops forever, a third is honest. The hub's
``POST .../autograde`` grades them with real nbgrader; the honest and the attacking answers get
what they deserve in the teacher's gradebook, none of the side effects happened, the loop is
stopped at the time limit, and only the course's teachers may ask for it.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from course_helpers import NBGRADER_SOURCE
from harness import Hub, Kernel, wait_for

# Grading sandboxes share the machine's "gpulab-grading" cgroups and grading uids: a hub's grading
# sweeps orphaned groups and the tests count those machine-wide, so gradings never run side by side
# (one worker of a parallel run runs these modules one after another).
pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="sandboxed autograding needs a root hub (per-user accounts, cgroups)",
    ),
    pytest.mark.xdist_group("grading"),
]

ASSIGNMENT = "ps1"
TIME_LIMIT = 45

# The teacher's assignment (as in test_nbgrader.py): square(x), tests worth 1 and 2 points.
SOURCE = NBGRADER_SOURCE

# A submission as `nbgrader collect` leaves it in the teacher's course folder: the released
# notebook with the solution cell answered, and the submission's timestamp.
SUBMIT = r"""
import os, nbformat
root = os.path.expanduser("~/courses/{course}")
nb = nbformat.read(f"{{root}}/release/{assignment}/{assignment}.ipynb", as_version=4)
cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {{}}).get("grade_id") == "square")
cell.source = {answer!r}
folder = f"{{root}}/submitted/{student}/{assignment}"
os.makedirs(folder, exist_ok=True)
nbformat.write(nb, f"{{folder}}/{assignment}.ipynb")
open(f"{{folder}}/timestamp.txt", "w").write("2026-01-01 10:00:00.000000 UTC")
print("submitted")
"""

# Everything the attacking answer tries; each step prints what happened.
ATTACK = r"""
import os, shutil, socket, subprocess, sys

def square(x):
    return abs(x) * 2

def attempt(what, f):
    try:
        f()
        print(what, "DONE")
    except Exception as e:
        print(what, "failed:", type(e).__name__)

for dest in ("/tmp/{leak}", "/dev/shm/{leak}"):
    attempt("copy " + dest, lambda: (shutil.copy({other!r}, dest), os.chmod(dest, 0o644)))
attempt("write home", lambda: open({teacher_file!r}, "w").write("pwned"))
attempt("hub", lambda: socket.create_connection(("127.0.0.1", {hub_port}), timeout=3).close())
attempt("port", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3).close())
attempt("detach", lambda: subprocess.Popen(
    ["setsid", "sh", "-c",
     sys.executable + " -c 'import time; time.sleep(1000)' {marker} >/dev/null 2>&1 &"],
    start_new_session=True, stdin=subprocess.DEVNULL).wait())
"""

LOOP = "def square(x):\n    return x * x\n\nwhile True:\n    pass\n"

SCORES = r"""
import json, os
from nbgrader.api import Gradebook
db = "sqlite:///" + os.path.expanduser("~/courses/{course}/gradebook.db")
with Gradebook(db, course_id="{course}") as gb:
    print(json.dumps({{s: gb.find_submission("{assignment}", s).score for s in {students!r}}}))
"""


class Listener:
    """A TCP port on 127.0.0.1 that counts the connections it gets."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


def token_for(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 3600, "note": "grading"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def make_course(hub: Hub, name: str, teacher: str, students: list[str]) -> None:
    hub.create_user(teacher)  # a course's staff are existing users
    r = hub.api("POST", "/gpulab/courses", json={"name": name, "teachers": [teacher]})
    assert r.status_code == 201, r.text
    if not students:
        return
    rows = "".join(f"{s},student\n" for s in students)
    r = hub.api(
        "POST", f"/gpulab/courses/{name}/roster", data=rows.encode(),
        headers={"Content-Type": "text/csv"},
    )  # fmt: skip
    assert r.status_code == 200, r.text


def marked_pids(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                pids.append(int(entry))
    return pids


def sandbox_uid_pids() -> list[int]:
    """Processes of the throwaway grading uids (Autograder.sandbox_uid_base and up)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid >= 2_100_000_000:
                pids.append(int(entry))
        except OSError:
            pass
    return pids


def grading_cgroups() -> list[Path]:
    """The grading sandboxes' cgroups that still exist, in every hierarchy."""
    found = []
    root = Path("/sys/fs/cgroup")
    for parent in [root / "gpulab-grading", *root.glob("*/gpulab-grading")]:
        if parent.is_dir():
            found += [p for p in parent.iterdir() if p.is_dir()]
    return found


@pytest.mark.timeout(900)
def test_autograde_runs_each_submission_in_a_sandbox(hub_factory) -> None:
    hub = hub_factory(
        "autograde", simulate="RTX-4090:1", extra_args=[f"--Autograder.time_limit={TIME_LIMIT}"]
    )
    tag = uuid.uuid4().hex[:6]
    teacher, other_teacher = f"tch{tag}", f"oth{tag}"
    honest, attacker, looper = f"hon{tag}", f"att{tag}", f"loop{tag}"
    course, other_course = f"alg{tag}", f"bio{tag}"
    make_course(hub, course, teacher, [honest, attacker, looper])
    make_course(hub, other_course, other_teacher, [])
    r = hub.spawn(teacher, {"gpu": "none"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(teacher, timeout=180)
    home = Path(pwd.getpwnam(f"jupyter-{teacher}").pw_dir)
    root = home / "courses" / course
    sid = {n: f"jupyter-{n}" for n in (honest, attacker, looper)}
    leak, marker = f"leak-{tag}.ipynb", f"marker-{tag}"
    teacher_file = home / f"pwned-{tag}"
    listener = Listener()
    kernel = Kernel(hub, teacher)
    try:
        src = SOURCE.replace("COURSE", course).replace("ASSIGNMENT", ASSIGNMENT)
        assert "written" in kernel.execute(src)
        out = kernel.execute(
            "import subprocess; r = subprocess.run(['nbgrader', 'generate_assignment', "
            f"'{ASSIGNMENT}', '--course', '{course}'], capture_output=True, text=True); "
            "print(r.returncode, r.stderr[-2000:])",
            timeout=240,
        )
        assert out.startswith("0 "), out
        attack = ATTACK.format(
            leak=leak,
            other=str(root / "submitted" / sid[honest] / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"),
            teacher_file=str(teacher_file),
            hub_port=hub.port,
            port=listener.port,
            marker=marker,
        )
        answers = {honest: "def square(x):\n    return x * x", attacker: attack, looper: LOOP}
        for name, answer in answers.items():
            done = kernel.execute(
                SUBMIT.format(
                    course=course, assignment=ASSIGNMENT, student=sid[name], answer=answer
                )
            )
            assert "submitted" in done
        url = f"/gpulab/courses/{course}/assignments/{ASSIGNMENT}/autograde"

        # Only the course's teachers may ask: not a student, not another course's teacher
        # (JupyterHub answers 404 to a scope held for other groups only: nothing to see here).
        for who in (honest, other_teacher):
            r = hub.api("POST", url, token=token_for(hub, who), json={})
            assert r.status_code in (403, 404), (who, r.status_code, r.text)
        t_token = token_for(hub, teacher)
        r = hub.api("POST", url, token=t_token, json={"student": [sid[honest]]})
        assert r.status_code == 400 and r.json()["field"] == "student", r.text
        r = hub.api("POST", url, token=t_token, json={"students": ["../x"]})
        assert r.status_code == 400 and r.json()["field"] == "students", r.text

        started = time.monotonic()
        r = hub.api("POST", url, token=t_token, json={})
        assert r.status_code == 202, r.text
        job_url = r.json()["status_url"]
        assert job_url.endswith(f"/autograde/{r.json()['id']}")
        job_path = job_url.split("/hub/api", 1)[1]
        # A second grading of the same assignment waits for the first.
        again = hub.api("POST", url, token=t_token, json={})
        assert again.status_code == 409, again.text
        # Another course's teacher cannot read it either.
        r = hub.api("GET", job_path, token=token_for(hub, other_teacher))
        assert r.status_code in (403, 404), r.text

        def finished() -> dict | None:
            got = hub.api("GET", job_path, token=t_token)
            assert got.status_code == 200, got.text
            return got.json() if got.json()["state"] in ("done", "failed") else None

        job = wait_for(finished, timeout=3 * TIME_LIMIT + 240, interval=1, what="autograding")
        subs = job["submissions"]
        assert job["state"] == "done", job
        assert subs[sid[honest]]["state"] == "graded", subs
        assert subs[sid[honest]]["score"] == 3.0 and subs[sid[honest]]["max_score"] == 3.0
        assert subs[sid[attacker]]["state"] == "graded", subs
        assert subs[sid[attacker]]["score"] == 1.0
        # The loop was stopped at the time limit, with that reason, and not graded.
        assert subs[sid[looper]]["state"] == "timeout", subs
        assert "time limit" in subs[sid[looper]]["reason"]
        assert TIME_LIMIT - 1 <= subs[sid[looper]]["seconds"] <= TIME_LIMIT + 15, subs
        assert time.monotonic() - started < 3 * TIME_LIMIT + 240

        # The grades reached the teacher's gradebook, and the graded notebooks their folder
        # (read in a fresh kernel: the first one's websocket sat idle through the grading).
        kernel.close()
        kernel = Kernel(hub, teacher)
        graded = [sid[honest], sid[attacker]]
        scores = kernel.execute(
            SCORES.format(course=course, assignment=ASSIGNMENT, students=graded)
        )
        assert json.loads(scores.strip().splitlines()[-1]) == {
            sid[honest]: 3.0,
            sid[attacker]: 1.0,
        }
        executed = root / "autograded" / sid[attacker] / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        cells = json.loads(executed.read_text())["cells"]
        printed = "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", ()))
        # What the attacking cell saw: every side effect failed, inside the sandbox.
        for what in ("copy /tmp", "copy /dev/shm", "write home", "hub", "port"):
            assert f"{what}" in printed and "DONE" not in printed.split(what, 1)[1].split("\n")[0]

        # None of the side effects happened outside.
        assert not Path("/tmp", leak).exists() and not Path("/dev/shm", leak).exists()
        assert not teacher_file.exists()
        assert listener.accepted == 0
        assert marked_pids(marker) == [], "a detached process outlived its grading"
        assert grading_cgroups() == []
        assert sandbox_uid_pids() == [], "a process of a grading uid outlived its grading"
        teacher_uid = pwd.getpwnam(f"jupyter-{teacher}").pw_uid
        for pid in marked_pids("sleep(1000)"):
            assert os.stat(f"/proc/{pid}").st_uid != teacher_uid
        # The scratch folders are gone; the grading time is on the course's record.
        grading = hub.data_dir / "courses" / "grading"
        assert list(grading.glob("*/*")) == []
        usage = [json.loads(line) for line in (grading / "usage.jsonl").read_text().splitlines()]
        assert sorted((u["course"], u["student"], u["state"]) for u in usage) == sorted(
            [
                (course, sid[honest], "graded"),
                (course, sid[attacker], "graded"),
                (course, sid[looper], "timeout"),
            ]
        )
    finally:
        listener.close()
        kernel.close()
        hub.stop_server(teacher)
        for pid in marked_pids(marker):
            os.kill(pid, 9)
