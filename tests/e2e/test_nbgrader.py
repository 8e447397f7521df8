"""nbgrader across courses on a real hub: the exchange gpulab manages, and who reaches what.

One teacher teaches two courses; one student takes both, another only the first. For each course
the whole round trip runs with nbgrader's own commands in the users' real kernels: the teacher
writes and releases an assignment, students fetch, answer and submit, the teacher collects,
has the hub autograde (each submission in a sandbox, attacked in test_autograde_sandbox.py; in
the teacher's own server `nbgrader autograde` refuses), the score is what each answer deserves,
and the teacher releases feedback that the students fetch. Under a root hub (each user their own
Unix account) the attacks fail: the first course's student cannot fetch or read anything of the
second course, and no student can list or read another's submission.
"""

from __future__ import annotations

import json
import os
import re
import uuid

import pytest
from course_helpers import NBGRADER_SOURCE
from harness import Hub, Kernel, wait_for

# Grading sandboxes share the machine's "gpulab-grading" cgroups and grading uids: a hub's grading
# sweeps orphaned groups and the tests count those machine-wide, so gradings never run side by side
# (one worker of a parallel run runs these modules one after another).
pytestmark = pytest.mark.xdist_group("grading")

ISOLATED = os.geteuid() == 0
ASSIGNMENT = "ps1"

# The assignment: one function to write, two graded tests (1 and 2 points). COURSE and
# ASSIGNMENT are replaced.
SOURCE = NBGRADER_SOURCE

ANSWER = r"""
import nbformat
path = "{course}/{assignment}/{assignment}.ipynb"
nb = nbformat.read(path, as_version=4)
cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {{}}).get("grade_id") == "square")
assert "NotImplementedError" in cell.source, cell.source
cell.source = "def square(x):\n    return {body}"
nbformat.write(nb, path)
print("answered")
"""

SCORES = r"""
import json, os
from nbgrader.api import Gradebook
db = "sqlite:///" + os.path.expanduser("~/courses/{course}/gradebook.db")
with Gradebook(db, course_id="{course}") as gb:
    print(json.dumps({{s: gb.find_submission("{assignment}", s).score for s in {students!r}}}))
"""

RUN = r"""
import json, os, subprocess
env = dict(os.environ, **{env!r})
r = subprocess.run({argv!r}, capture_output=True, text=True, timeout=240, env=env)
print(json.dumps({{"rc": r.returncode, "out": r.stdout + r.stderr}}))
"""

# What trying to read something answers: "denied", "missing" or "read".
PROBE = r"""
import json, os
def probe(path):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read()
        return "read"
    except PermissionError:
        return "denied"
    except FileNotFoundError:
        return "missing"
print(json.dumps({{p: probe(p) for p in {paths!r}}}))
"""


def nbgrader(kernel: Kernel, *args: str, unsafe: bool = False) -> tuple[int, str]:
    """``nbgrader ARGS`` in ``kernel``; ``unsafe``: autograding allowed in a staff server."""
    env = {"GPULAB_UNSAFE_AUTOGRADE": "1"} if unsafe else {}
    out = kernel.execute(RUN.format(argv=["nbgrader", *args], env=env), timeout=300)
    result = json.loads(out.strip().splitlines()[-1])
    return result["rc"], result["out"]


def ok(kernel: Kernel, *args: str, unsafe: bool = False) -> str:
    rc, out = nbgrader(kernel, *args, unsafe=unsafe)
    assert rc == 0, f"nbgrader {' '.join(args)} as {kernel.user} failed ({rc}):\n{out}"
    return out


def probe(kernel: Kernel, *paths: str) -> dict[str, str]:
    out = kernel.execute(PROBE.format(paths=list(paths)))
    return json.loads(out.strip().splitlines()[-1])


def token_for(hub: Hub, name: str) -> str:
    r = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 3600, "note": "nbgrader"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def autograde_on_hub(
    hub: Hub, course: str, token: str, students: list[str], kernels: list[Kernel]
) -> None:
    """Grade the collected submissions through the hub's sandboxed path; wait until done (using
    ``kernels`` meanwhile, so that their websockets do not go quiet long enough to be closed)."""
    r = hub.api("POST", f"/gpulab/courses/{course}/assignments/{ASSIGNMENT}/autograde", token=token)
    assert r.status_code == 202, r.text
    path = r.json()["status_url"].split("/hub/api", 1)[1]

    def done() -> dict | None:
        for kernel in kernels:
            kernel.execute("0")
        job = hub.api("GET", path, token=token).json()
        return job if job["state"] in ("done", "failed") else None

    job = wait_for(done, timeout=600, interval=1, what=f"autograding {course}")
    assert job["state"] == "done", job
    assert sorted(job["submissions"]) == sorted(students), job
    assert {s["state"] for s in job["submissions"].values()} == {"graded"}, job


def make_course(hub: Hub, name: str, teacher: str) -> None:
    hub.create_user(teacher)  # a course's staff are existing users
    r = hub.api("POST", "/gpulab/courses", json={"name": name, "teachers": [teacher]})
    assert r.status_code == 201, r.text


def roster(hub: Hub, course: str, text: str, token: str) -> None:
    r = hub.api(
        "POST",
        f"/gpulab/courses/{course}/roster",
        token=token,
        data=text.encode(),
        headers={"Content-Type": "text/csv"},
    )
    assert r.status_code == 200, r.text


def student_id(name: str) -> str:
    """The name nbgrader files a submission under: the server's Unix account under a root hub,
    else the hub user (gpulab's config sets it, since every server shares one account)."""
    return f"jupyter-{name}" if ISOLATED else name


@pytest.mark.timeout(900)
def test_assignments_round_trip_in_two_courses(hub_factory) -> None:
    hub = hub_factory("nbgrader", simulate="RTX-4090:1")
    tag = uuid.uuid4().hex[:5]
    teacher, both, only_a = f"tch{tag}", f"both{tag}", f"onea{tag}"
    course_a, course_b = f"alg{tag}", f"bio{tag}"
    make_course(hub, course_a, teacher)
    make_course(hub, course_b, teacher)
    t_token = token_for(hub, teacher)
    roster(hub, course_a, f"{both},student\n{only_a},student\n", t_token)
    roster(hub, course_b, f"{both},student\n", t_token)
    people = (teacher, both, only_a)
    for name in people:
        r = hub.spawn(name, {"gpu": "none"})
        assert r.status_code in (201, 202), r.text
    for name in people:
        hub.wait_ready(name, timeout=180)
    exchange = hub.data_dir / "courses" / "exchange"

    kernels = {name: Kernel(hub, name) for name in people}
    try:
        tk, bk, ak = (kernels[n] for n in people)
        # The hub told each server its courses and roles.
        courses_env = "import os; print(os.environ['GPULAB_COURSES'])"
        assert tk.execute(courses_env).strip() == f"{course_a}:teacher,{course_b}:teacher"
        assert bk.execute(courses_env).strip() == f"{course_a}:student,{course_b}:student"
        assert ak.execute(courses_env).strip() == f"{course_a}:student"
        # Each course: who answers how, and the score that answer deserves (of 3).
        answers = {
            course_a: {both: ("x * x", 3.0), only_a: ("abs(x) * 2", 1.0)},
            course_b: {both: ("x ** 2 if x > 0 else 0", 1.0)},
        }
        for course, students in answers.items():
            # The teacher writes the assignment and releases it from ~/courses/COURSE.
            source = SOURCE.replace("COURSE", course).replace("ASSIGNMENT", ASSIGNMENT)
            assert "written" in tk.execute(source)
            ok(tk, "generate_assignment", ASSIGNMENT, "--course", course)
            ok(tk, "release_assignment", ASSIGNMENT, "--course", course)
            listed = ok(bk, "list", "--course", course)
            assert f"{course} {ASSIGNMENT}" in listed, listed
            for name, (body, _) in students.items():
                kernel = kernels[name]
                ok(kernel, "fetch_assignment", ASSIGNMENT, "--course", course)
                done = kernel.execute(
                    ANSWER.format(course=course, assignment=ASSIGNMENT, body=body)
                )
                assert "answered" in done
                ok(kernel, "submit", ASSIGNMENT, "--course", course)

            if course == course_a and ISOLATED:
                # A student cannot list the course's inbound, nor find another's submission.
                inbound = str(exchange / course_a / "inbound")
                assert probe(bk, inbound) == {inbound: "denied"}
                found = bk.execute(
                    f"import glob; print(glob.glob({inbound!r} + '/{student_id(only_a)}+*'))"
                )
                assert found.strip() == "[]"
                # Nor forge a release.
                forged = str(exchange / course_a / "outbound" / ASSIGNMENT / "forged.ipynb")
                assert "PermissionError" in bk.execute(
                    f"try:\n    open({forged!r}, 'w')\nexcept Exception as e:\n"
                    "    print(type(e).__name__)"
                )
                # The teacher sees every submission there.
                listed = ok(tk, "list", "--inbound", "--course", course_a)
                for name in students:
                    assert f"{course_a} {student_id(name)} {ASSIGNMENT}" in listed, listed

            ok(tk, "collect", ASSIGNMENT, "--course", course)
            if ISOLATED:
                # Not in the teacher's server (students' code would run as the teacher): there
                # nbgrader refuses and points at the hub, which grades each in a sandbox.
                rc, out = nbgrader(tk, "autograde", ASSIGNMENT, "--course", course)
                assert rc != 0 and "GPULAB_UNSAFE_AUTOGRADE" in out, out
                ids = [student_id(n) for n in students]
                autograde_on_hub(hub, course, t_token, ids, list(kernels.values()))
            else:
                ok(tk, "autograde", ASSIGNMENT, "--course", course, unsafe=True)
            ids = {student_id(n): score for n, (_, score) in students.items()}
            out = tk.execute(
                SCORES.format(course=course, assignment=ASSIGNMENT, students=sorted(ids))
            )
            assert json.loads(out.strip().splitlines()[-1]) == ids
            ok(tk, "generate_feedback", ASSIGNMENT, "--course", course)
            ok(tk, "release_feedback", ASSIGNMENT, "--course", course)
            for name, (_, score) in students.items():
                kernel = kernels[name]
                ok(kernel, "fetch_feedback", ASSIGNMENT, "--course", course)
                html = kernel.execute(
                    "import glob; "
                    f"print(open(glob.glob('{course}/{ASSIGNMENT}/feedback/*/{ASSIGNMENT}.html')"
                    "[0]).read())"
                )
                shown = re.search(r"\(Score: ([\d.]+) / ([\d.]+)\)", html)
                assert shown is not None and float(shown.group(1)) == score, (name, course)
                assert float(shown.group(2)) == 3.0

        # The student of both courses sees both in one list (one server, one config).
        listed = ok(bk, "list")
        assert f"{course_a} {ASSIGNMENT}" in listed and f"{course_b} {ASSIGNMENT}" in listed

        # The first course's student: nothing of the second course.
        rc, out = nbgrader(ak, "fetch_assignment", ASSIGNMENT, "--course", course_b)
        assert rc != 0, out
        assert course_b not in ok(ak, "list")
        b_files = [
            str(exchange / course_b),
            str(exchange / course_b / "outbound"),
            str(exchange / course_b / "outbound" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"),
            str(exchange / course_b / "inbound"),
        ]
        seen = probe(ak, *b_files)
        if ISOLATED:
            assert set(seen.values()) == {"denied"}, seen
            # Naming the exchange itself does not help.
            rc, out = nbgrader(
                ak,
                "fetch_assignment",
                ASSIGNMENT,
                "--course",
                course_b,
                f"--Exchange.root={exchange}",
            )
            assert rc != 0, out
            assert probe(ak, f"{course_b}/{ASSIGNMENT}") == {f"{course_b}/{ASSIGNMENT}": "missing"}
            # Nor can they list which courses exist.
            assert probe(ak, str(exchange)) == {str(exchange): "denied"}
    finally:
        for kernel in kernels.values():
            kernel.close()
        for name in people:
            hub.stop_server(name)
