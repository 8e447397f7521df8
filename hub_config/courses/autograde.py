"""``/hub/api/gpulab/courses/C/assignments/A/autograde``: grade submissions in sandboxes, not as staff.

``nbgrader autograde`` in a teacher's server runs every student's code as the teacher (see
docs/nbgrader.md). This endpoint is the safe path: the hub (root) grades each collected
submission in the teacher's ``~/courses/C/submitted`` in a sandbox of its own
(:mod:`gpulab.spawners.local.grader`: a throwaway uid, a fresh cgroup, no network, private temp
folders, a wall-clock limit) and the grades reach the teacher's gradebook through a step run as
the teacher's account that executes nothing.

- ``POST .../autograde`` (``custom:gpulab:course-manage!group=C``: the course's teachers; the
  hub checks the scope), body optional ``{"students": ["jupyter-alice", ...]}`` (default: every
  collected submission): 202 with ``{"id", "status_url"}``; 409 while a grading of the same
  assignment runs, or where the hub cannot sandbox (not root, no cgroups, no account).
- ``GET .../autograde/ID`` (the same scope): the job and each submission's state (``queued``,
  ``running``, ``graded`` with its score, ``failed`` or ``timeout`` with the reason).

Grading time is recorded per submission (``DATA_DIR/courses/grading/usage.jsonl``: course,
assignment, student, seconds); billing has no hub-side entry point for a course's non-server
usage yet, so nothing is charged for it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pwd
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyterhub.scopes import needs_scope
from tornado import web
from traitlets import Float, Integer, Unicode
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.handlers import CourseAPIHandler
from gpulab.hub_config.scopes import COURSE_MANAGE_SCOPE
from gpulab.spawners.local import accounts, grader
from gpulab.spawners.local.cgroup import Cgroups, parse_memory
from gpulab.spawners.node.pool import GpuPool


class Autograder(SingletonConfigurable):
    """Settings of sandboxed autograding (one instance per hub)."""

    time_limit = Float(
        300.0,
        config=True,
        help="""Wall-clock seconds one submission may take to grade (kernel start included).
        At the limit every process of its sandbox is killed and the submission is reported as
        `timeout`, ungraded.""",
    )
    memory_limit = Unicode(
        "2G",
        config=True,
        help="""Memory limit of one submission's grading sandbox (its cgroup), e.g. `2G`;
        empty for none.""",
    )
    pids_limit = Integer(
        256,
        config=True,
        help="Most processes and threads one submission's grading sandbox may have at once.",
    )
    max_megabytes = Integer(
        200,
        config=True,
        help="""Largest submission (and largest set of graded notebooks) handled, in MiB; a
        larger one fails with that reason.""",
    )
    sandbox_uid_base = Integer(
        2_100_000_000,
        config=True,
        help="""First of the throwaway uids submissions are graded as (one per submission, never
        an account's; uids at and above this must belong to no account on the node).""",
    )

    _uids = itertools.count(secrets.randbelow(1_000_000))

    def next_uid(self) -> int:
        while True:
            uid = self.sandbox_uid_base + next(self._uids) % 10_000_000
            try:
                pwd.getpwuid(uid)
            except KeyError:
                return uid


@dataclass
class Job:
    id: str
    course: str
    assignment: str
    by: str
    state: str = "queued"  # queued, running, done, failed
    reason: str = ""
    started: float = field(default_factory=time.time)
    students: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "course": self.course,
            "assignment": self.assignment,
            "requested_by": self.by,
            "state": self.state,
            "reason": self.reason,
            "submissions": self.students,
        }


JOBS: dict[str, Job] = {}
_KEEP_JOBS = 200


def _record_usage(path: Path, job: Job, grade: grader.Grade) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {
        "t": time.time(),
        "course": job.course,
        "assignment": job.assignment,
        "student": grade.student,
        "requested_by": job.by,
        "seconds": round(grade.seconds, 2),
        "state": grade.state,
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


async def run_job(
    job: Job, teacher: accounts.Account, wanted: list[str] | None, settings: Autograder,
    scratch: Path, cgroups: Cgroups, log: Any,
) -> None:  # fmt: skip
    """Grade each submission of ``job`` in turn (blocking work off the event loop)."""
    root = os.path.join(teacher.home, "courses", job.course)
    try:
        found = await asyncio.to_thread(grader.collected, teacher, root, job.assignment)
    except (grader.GradingError, OSError, ValueError) as e:
        job.state, job.reason = "failed", str(e)
        return
    students = [s for s in found if wanted is None or s in wanted]
    missing = sorted(set(wanted or ()) - set(found))
    for name in missing:
        job.students[name] = {"state": "failed", "reason": "no collected submission"}
    for name in students:
        job.students[name] = {"state": "queued"}
    job.state = "running"
    for name in students:
        job.students[name] = {"state": "running"}
        sandbox = grader.SandboxSettings(
            time_limit=settings.time_limit,
            memory_bytes=parse_memory(settings.memory_limit or None),
            pids=settings.pids_limit or None,
            max_bytes=settings.max_megabytes << 20,
            uid=settings.next_uid(),
        )
        try:
            grade = await asyncio.to_thread(
                grader.grade_submission,
                teacher, root, job.course, job.assignment, name, scratch, cgroups, sandbox,
            )  # fmt: skip
        except Exception as e:
            log.exception("Autograding %s of %s/%s failed", name, job.course, job.assignment)
            grade = grader.Grade(student=name, state="failed", reason=str(e))
        job.students[name] = grade.as_json()
        await asyncio.to_thread(_record_usage, scratch.parent / "usage.jsonl", job, grade)
        log.info(
            "Autograded %s of %s/%s in a sandbox: %s %s", name, job.course, job.assignment,
            grade.state, grade.reason,
        )  # fmt: skip
    job.state = "done"


class AutogradeAPIHandler(CourseAPIHandler):
    @property
    def grading(self) -> Autograder:
        return Autograder.instance(config=self.settings["config"])

    def account_prefix(self) -> str:
        config = self.settings["config"]
        spawner_class = self.settings.get("spawner_class")
        for cls in getattr(spawner_class, "__mro__", ()):
            section = config.get(cls.__name__) if cls.__name__ in config else None
            if section is not None and "account_prefix" in section:
                return section["account_prefix"]
        return accounts.PREFIX

    def job(self, course: str, assignment: str, job_id: str) -> Job:
        job = JOBS.get(job_id)
        if job is None or job.course != course or job.assignment != assignment:
            raise CourseError(404, "id", f"no autograding {job_id!r} of {course}/{assignment}")
        return job

    @needs_scope(COURSE_MANAGE_SCOPE)
    async def post(self, group_name: str, assignment: str) -> None:
        _, course = self.course(group_name)
        if not grader.SAFE_NAME.fullmatch(assignment):
            raise CourseError(400, "assignment", f"{assignment!r} is not an assignment name")
        body = self.json_object_body() if self.request.body.strip() else {}
        unknown = sorted(set(body) - {"students"})
        if unknown:
            raise CourseError(400, unknown[0], "unknown field; allowed: students")
        wanted = body.get("students")
        if wanted is not None and (
            not isinstance(wanted, list)
            or not all(isinstance(s, str) and grader.SAFE_NAME.fullmatch(s) for s in wanted)
        ):
            raise CourseError(400, "students", "a list of student ids (e.g. jupyter-alice)")
        me = self.current_user
        if getattr(me, "kind", "user") != "user":
            raise CourseError(403, "user", "autograding runs for a teacher (their course folder)")
        if os.geteuid() != 0:
            raise CourseError(
                409, "course", "sandboxed autograding needs the hub to run as root"
            )  # fmt: skip
        cgroups = Cgroups.detect(parent=grader.CGROUP_PARENT)
        if cgroups is None:
            raise CourseError(409, "course", "sandboxed autograding needs writable cgroups")
        teacher = accounts.lookup(accounts.account_name(me.name, self.account_prefix()))
        if teacher is None:
            raise CourseError(
                409, "user", f"{me.name} has no account yet: start your server once first"
            )
        for other in JOBS.values():
            if (other.course, other.assignment) == (course.name, assignment) and other.state in (
                "queued",
                "running",
            ):
                raise CourseError(
                    409, "assignment", f"autograding {other.id} of {assignment} is still running"
                )
        job = Job(id=secrets.token_hex(8), course=course.name, assignment=assignment, by=me.name)
        JOBS[job.id] = job
        for old in sorted(JOBS.values(), key=lambda j: j.started)[:-_KEEP_JOBS]:
            JOBS.pop(old.id, None)
        swept = await asyncio.to_thread(grader.sweep_orphans, cgroups)
        if swept:
            self.log.warning("Removed grading cgroups left by an earlier hub: %s", swept)
        data_dir = Path(GpuPool.instance(config=self.settings["config"]).data_dir)
        scratch = data_dir / "courses" / "grading" / job.id
        await asyncio.to_thread(_make_scratch, scratch)
        task = asyncio.ensure_future(
            run_job(job, teacher, wanted, self.grading, scratch, cgroups, self.log)
        )
        task.add_done_callback(lambda _: _remove_scratch(scratch))
        url = f"{self.hub.base_url}api/gpulab/courses/{course.name}/assignments/{assignment}"
        status_url = f"{url}/autograde/{job.id}"
        self.set_status(202)
        self.set_header("Location", status_url)
        self.write(json.dumps({**job.as_json(), "status_url": status_url}))

    @needs_scope(COURSE_MANAGE_SCOPE)
    def get(self, group_name: str, assignment: str) -> None:
        raise web.HTTPError(405, "POST starts an autograding; GET .../autograde/ID reads one")


class AutogradeJobHandler(AutogradeAPIHandler):
    @needs_scope(COURSE_MANAGE_SCOPE)
    def get(self, group_name: str, assignment: str, job_id: str) -> None:  # type: ignore[override]
        self.course(group_name)
        self.write(json.dumps(self.job(group_name, assignment, job_id).as_json()))

    async def post(self, *args: str) -> None:  # type: ignore[override]
        raise web.HTTPError(405)


def _make_scratch(scratch: Path) -> None:
    """``courses/grading/JOB``: root's, passable (not listable) so each sandbox's uid reaches its
    own folder inside."""
    base = scratch.parent
    for folder in (base.parent, base):
        folder.mkdir(exist_ok=True)
        os.chmod(folder, 0o711)
    scratch.mkdir(mode=0o711)
    os.chmod(scratch, 0o711)


def _remove_scratch(scratch: Path) -> None:
    try:
        scratch.rmdir()
    except OSError:
        pass


ROUTES = [
    (r"/api/gpulab/courses/([^/]+)/assignments/([^/]+)/autograde", AutogradeAPIHandler),
    (r"/api/gpulab/courses/([^/]+)/assignments/([^/]+)/autograde/([^/]+)", AutogradeJobHandler),
]
