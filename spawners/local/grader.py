"""Autograding a submission in a sandbox of its own: nobody's code runs under someone else's account.

``nbgrader autograde`` executes each student's notebook. Run in a teacher's server it executes a
student's code as the teacher: it can read every other submission, write the teacher's home,
reach the hub and leave processes billed to the teacher. Here each submission is graded in three
steps, each under the account that owns what it touches (the hub runs as root):

1. **export**, as the teacher's account: the collected submission (``submitted/S/A``, regular
   files only, never following a link the student planted) plus the assignment's non-notebook
   source files and a gradebook that holds this assignment and this student only (no other
   student's grades, no other assignment's hidden tests), as a tar on stdout.
2. **sandbox**, as a throwaway uid that no account owns (a fresh one per submission): root
   unpacks the tar into a fresh folder of its own (regular files and folders only), joins a
   fresh cgroup, enters new network, mount, IPC and pid namespaces (``unshare``; loopback only,
   so 127.0.0.1 is not the host's; private ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``;
   every user's home below the data dir detached, so no home is pinned), drops to the
   throwaway uid and runs the real ``nbgrader autograde``. A wall-clock limit ends it; then the
   whole cgroup is killed, detached processes included. Root reads back only the executed
   notebooks, opening each with ``O_NOFOLLOW`` under a folder fd, and removes the folder.
3. **import**, as the teacher's account: the executed notebooks go into the teacher's course
   folder (``gpulab-sandboxed/S/A``) and nbgrader's own autograde runs *without executing
   anything* (its sanitizing and scoring steps, minus ``Execute`` and ``ClearOutput``): the
   grades land in the teacher's gradebook and ``autograded/``, as after ``nbgrader autograde``.

The student's code could still make its own tests pass (as under any nbgrader); it cannot reach
anyone else's files, the network, or outlive its grading. Run as ``python -I -m
gpulab.spawners.local.grader OP``: ``export`` and ``import`` as the teacher, ``sandbox`` and
``inner`` as root (the hub calls :func:`grade_submission`).
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.spawners.inside.launcher import SHARED_WRITABLE, detach_mounts_below, libc
from gpulab.spawners.local.accounts import Account
from gpulab.spawners.local.cgroup import CgroupError, Cgroups, Limits

# nbgrader's student ids under a root hub (``jupyter-NAME``) and assignment names.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
# Where the teacher's import step puts the sandbox's executed notebooks, in the course folder.
HANDOFF = "gpulab-sandboxed"
CGROUP_PARENT = "gpulab-grading"
# Where the submission's folder appears inside the sandbox (bound into its private /tmp).
SANDBOX_WORK = "/tmp/gpulab-grading"
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REMOUNT = 0x1, 0x2, 0x4, 0x1000, 0x20
_ENV_KEEP = ("LANG", "LC_ALL")


# The cgroups of the gradings running in this process (the others are orphans).
ACTIVE: set[str] = set()


class GradingError(RuntimeError):
    """One submission could not be graded; the message says why (shown to the teacher)."""


@dataclass
class Grade:
    """What grading one submission came to."""

    student: str
    state: str  # "graded", "failed" or "timeout"
    reason: str = ""
    score: float | None = None
    max_score: float | None = None
    seconds: float = 0.0
    notebooks: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {
            "student": self.student,
            "state": self.state,
            "reason": self.reason,
            "score": self.score,
            "max_score": self.max_score,
            "seconds": round(self.seconds, 1),
        }


@dataclass(frozen=True)
class SandboxSettings:
    time_limit: float = 300.0
    memory_bytes: int | None = 2 << 30
    pids: int | None = 256
    max_bytes: int = 200 << 20
    uid: int = 0  # the throwaway uid (no account has it)
    # Folder whose mounts (users' homes, datasets) the sandbox's namespace detaches; "" for the
    # data dir that holds the grading scratch (``DATA/courses/grading/JOB``).
    data_dir: str = ""


def _python() -> str:
    return sys.executable


def _helper(op: str, *args: str) -> list[str]:
    return [_python(), "-I", "-m", "gpulab.spawners.local.grader", op, *args]


def _clean_env(home: str, user: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    bin_dir = str(Path(_python()).parent)
    env.update(
        HOME=home,
        USER=user,
        LOGNAME=user,
        PATH=os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def as_account(
    account: Account, argv: list[str], *, stdin: bytes = b"", cwd: str | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``argv`` as ``account`` (its uid and gid only, a clean environment); blocking."""
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        timeout=timeout,
        user=account.uid,
        group=account.gid,
        extra_groups=[],
        cwd=cwd or account.home,
        env=_clean_env(account.home, account.name),
        start_new_session=True,
    )


def _helper_json(result: subprocess.CompletedProcess, what: str) -> dict:
    if result.returncode != 0:
        tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise GradingError(f"{what} failed: {tail[0]}")
    return json.loads(result.stdout.decode().strip().splitlines()[-1])


def collected(teacher: Account, course_root: str, assignment: str) -> list[str]:
    """The students with a collected submission of ``assignment`` in the teacher's course folder
    (read as the teacher)."""
    out = _helper_json(
        as_account(teacher, _helper("list", course_root, assignment), timeout=60),
        "listing the collected submissions",
    )
    return sorted(s for s in out["students"] if SAFE_NAME.fullmatch(s))


# ---- root: the sandbox --------------------------------------------------------------------


def _unpack(data: bytes, dest: Path, max_bytes: int) -> None:
    """Unpack the export tar into ``dest`` (a fresh root-owned folder): regular files and folders
    under relative, link-free names only; everything else is refused."""
    total = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            parts = Path(member.name).parts
            if not parts or member.name.startswith("/") or any(p in ("..", ".", "") for p in parts):
                raise GradingError(f"refused a path in the submission: {member.name!r}")
            target = dest.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            if not member.isreg():
                continue  # links and devices are not part of a submission
            total += member.size
            if total > max_bytes:
                raise GradingError(f"the submission is larger than {max_bytes >> 20} MiB")
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(src, f)


def _chown_tree(root: Path, uid: int) -> None:
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lchown(os.path.join(folder, name), uid, uid)
    os.lchown(root, uid, uid)


def _read_outputs(work: Path, student: str, assignment: str, max_bytes: int) -> dict[str, str]:
    """The executed notebooks the sandbox left, read by root without following any link the
    sandbox's code may have put in their place."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(work, flags | os.O_DIRECTORY)
    out: dict[str, str] = {}
    try:
        for part in ("autograded", student, assignment):
            try:
                nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            except OSError:
                return out
            os.close(fd)
            fd = nxt
        total = 0
        for name in os.listdir(fd):
            if not name.endswith(".ipynb") or not SAFE_NAME.fullmatch(name):
                continue
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except OSError:
                continue
            with os.fdopen(nfd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    continue
                data = f.read(max_bytes + 1)
            total += len(data)
            if total > max_bytes:
                raise GradingError(f"the graded notebooks are larger than {max_bytes >> 20} MiB")
            out[name] = data.decode("utf-8", errors="replace")
    finally:
        os.close(fd)
    return out


def _sandbox_config(course: str, work: str = SANDBOX_WORK) -> str:
    return f"""\
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {course!r}
c.CourseDirectory.root = {work!r}
c.CourseDirectory.db_url = "sqlite:///" + {work + "/gradebook.db"!r}
# The hub's wall-clock limit ends the grading; no per-cell limit of nbgrader's cuts in first.
c.Execute.timeout = None
c.Execute.interrupt_on_timeout = False
"""


def run_sandbox(
    work: Path, course: str, assignment: str, student: str, cgroups: Cgroups,
    settings: SandboxSettings, name: str,
) -> tuple[str, str, float]:  # fmt: skip
    """Run ``nbgrader autograde`` for ``student`` in ``work`` (prepared, owned by the throwaway
    uid) in a fresh cgroup ``name``; returns (state, reason, seconds). The cgroup is emptied and
    removed whatever happens."""
    group = cgroups.group(name)
    ACTIVE.add(name)
    try:
        group.create(Limits(pids=settings.pids, memory_bytes=settings.memory_bytes))
    except (CgroupError, OSError) as e:
        raise GradingError(f"could not create the grading cgroup: {e}") from None
    argv = _helper(
        "sandbox",
        "--uid", str(settings.uid),
        "--work", str(work),
        "--procs", os.pathsep.join(group.procs_files),
        "--max-bytes", str(settings.max_bytes),
        "--time-limit", str(settings.time_limit),
        "--private-below", settings.data_dir or _data_dir_of(work),
        assignment, student,
    )  # fmt: skip
    log = open(work.parent / f"{work.name}.log", "wb")
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_clean_env(SANDBOX_WORK + "/home", "gpulab-grader"),
        cwd="/",
        start_new_session=True,
    )
    log.close()
    state, reason = "graded", ""
    try:
        try:
            rc = proc.wait(timeout=settings.time_limit)
        except subprocess.TimeoutExpired:
            state = "timeout"
            reason = f"stopped at the time limit ({settings.time_limit:g} s); not graded"
        else:
            if rc != 0:
                state = "failed"
                reason = f"nbgrader autograde exited with {rc}: {_log_tail(work)}"
    finally:
        seconds = time.monotonic() - started
        try:
            group.kill_all()
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            try:
                group.kill_all()
                group.remove()
            except (CgroupError, OSError):
                pass
            ACTIVE.discard(name)
    return state, reason, seconds


def _data_dir_of(work: Path) -> str:
    """The data dir of a work folder ``DATA/courses/grading/JOB/WORK`` (see
    :mod:`gpulab.hub_config.courses.autograde`); else the work folder's own parent."""
    scratch = work.parent
    if scratch.parent.name == "grading" and scratch.parent.parent.name == "courses":
        return str(scratch.parent.parent.parent)
    return str(scratch)


def sweep_orphans(cgroups: Cgroups) -> list[str]:
    """Empty and remove the grading cgroups no grading of this process runs in (left by a hub
    that stopped mid-grading); returns their names."""
    swept = []
    for name in cgroups.groups():
        if name in ACTIVE:
            continue
        group = cgroups.group(name)
        try:
            group.kill_all()
            group.remove()
        except (CgroupError, OSError):
            continue
        swept.append(name)
    return swept


def _log_tail(work: Path) -> str:
    try:
        with open(work.parent / f"{work.name}.log", "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "no log"
    errors = [ln for ln in lines if "[AutogradeApp | ERROR]" in ln or "Error" in ln]
    return (errors or lines or ["no log"])[-1][:300]


def grade_submission(
    teacher: Account, course_root: str, course: str, assignment: str, student: str,
    scratch: Path, cgroups: Cgroups | None, settings: SandboxSettings,
) -> Grade:  # fmt: skip
    """Grade one collected submission in a sandbox of its own and hand the grades to the teacher
    (blocking; see the module doc). ``scratch``: a root-owned folder passable by others."""
    if os.geteuid() != 0 or cgroups is None:
        raise GradingError("sandboxed grading needs the hub to run as root with cgroups")
    for value, what in ((assignment, "assignment"), (student, "student"), (course, "course")):
        if not SAFE_NAME.fullmatch(value):
            raise GradingError(f"{what} {value!r} is not a safe name")
    grade = Grade(student=student, state="failed")
    exported = as_account(
        teacher, _helper("export", course_root, course, assignment, student), timeout=300
    )
    if exported.returncode != 0:
        tail = exported.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        grade.reason = f"could not read the submission: {tail[0]}"
        return grade
    work = scratch / f"{student}-{settings.uid}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(mode=0o700)
    try:
        _unpack(exported.stdout, work, settings.max_bytes)
        (work / "home").mkdir(exist_ok=True)
        (work / "nbgrader_config.py").write_text(_sandbox_config(course))
        _chown_tree(work, settings.uid)
        state, reason, seconds = run_sandbox(
            work, course, assignment, student, cgroups, settings,
            name=f"{course}-{assignment}-{student}-{settings.uid}",
        )  # fmt: skip
        grade.state, grade.reason, grade.seconds = state, reason, seconds
        if state != "graded":
            return grade
        notebooks = _read_outputs(work, student, assignment, settings.max_bytes)
        if not notebooks:
            grade.state = "failed"
            grade.reason = f"nbgrader left no graded notebook: {_log_tail(work)}"
            return grade
    except GradingError as e:
        grade.state, grade.reason = "failed", str(e)
        return grade
    finally:
        shutil.rmtree(work, ignore_errors=True)
        try:
            (scratch / f"{work.name}.log").unlink()
        except OSError:
            pass
    imported = as_account(
        teacher,
        _helper("import", course_root, course, assignment, student),
        stdin=json.dumps(notebooks).encode(),
        timeout=300,
    )
    try:
        result = _helper_json(imported, "recording the grades")
    except (GradingError, ValueError) as e:
        grade.state, grade.reason = "failed", str(e)
        return grade
    grade.state = "graded"
    grade.score, grade.max_score = result["score"], result["max_score"]
    grade.notebooks = result.get("notebooks", {})
    return grade


# ---- the helper processes ------------------------------------------------------------------


def _op_list(course_root: str, assignment: str) -> None:
    """As the teacher: the students with ``submitted/S/ASSIGNMENT``."""
    submitted = Path(course_root) / "submitted"
    students = []
    if submitted.is_dir() and not submitted.is_symlink():
        for entry in sorted(os.listdir(submitted)):
            folder = submitted / entry / assignment
            if SAFE_NAME.fullmatch(entry) and folder.is_dir() and not folder.is_symlink():
                students.append(entry)
    print(json.dumps({"students": students}))


def _add_tree(tar: tarfile.TarFile, src: Path, arcname: str, skip_notebooks: bool) -> None:
    """Regular files and folders under ``src``; links anywhere are left out (not followed)."""
    if not src.is_dir() or src.is_symlink():
        return
    for folder, dirs, files in os.walk(src, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        rel = os.path.relpath(folder, src)
        base = arcname if rel == "." else f"{arcname}/{rel}"
        info = tarfile.TarInfo(base)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        for name in files:
            if skip_notebooks and name.endswith(".ipynb"):
                continue
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    continue
                info = tarfile.TarInfo(f"{base}/{name}")
                info.size, info.mode, info.mtime = st.st_size, 0o644, int(st.st_mtime)
                tar.addfile(info, f)


def _op_export(course_root: str, course: str, assignment: str, student: str) -> None:
    """As the teacher: the tar the sandbox grades from (see the module doc), on stdout."""
    from nbgrader.api import Gradebook

    root = Path(course_root)
    submission = root / "submitted" / student / assignment
    if not submission.is_dir() or submission.is_symlink():
        raise SystemExit(f"no collected submission at {submission}")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "gradebook.db"
        source = sqlite3.connect(f"file:{root / 'gradebook.db'}?mode=ro", uri=True)
        target = sqlite3.connect(db)
        source.backup(target)
        source.close()
        target.close()
        with Gradebook(f"sqlite:///{db}", course_id=course) as gb:
            names = {a.name for a in gb.assignments}
            if assignment not in names:
                raise SystemExit(f"no assignment {assignment!r} in the gradebook")
            for other in names - {assignment}:
                gb.remove_assignment(other)
            for s in gb.students:
                if s.id != student:
                    gb.remove_student(s.id)
        vacuum = sqlite3.connect(db)
        vacuum.execute("VACUUM")
        vacuum.close()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:") as tar:
            tar.add(db, arcname="gradebook.db", recursive=False)
            _add_tree(tar, submission, f"submitted/{student}/{assignment}", False)
            _add_tree(tar, root / "source" / assignment, f"source/{assignment}", True)
    sys.stdout.buffer.write(buf.getvalue())


def _op_import(course_root: str, course: str, assignment: str, student: str) -> None:
    """As the teacher: record the grades of the executed notebooks on stdin (JSON name -> text)
    with nbgrader's own autograde, minus executing anything."""
    from nbgrader.api import Gradebook
    from nbgrader.apps.autogradeapp import AutogradeApp
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        DeduplicateIds,
        IgnorePattern,
        LimitOutput,
        OverwriteCells,
        OverwriteKernelspec,
        SaveAutoGrades,
    )  # fmt: skip
    from traitlets.config import Config

    notebooks = json.loads(sys.stdin.read())
    root = Path(course_root)
    handoff = root / HANDOFF / student / assignment
    shutil.rmtree(handoff, ignore_errors=True)
    handoff.mkdir(parents=True)
    # The submission's other files (its timestamp, nbgrader's submission secret, data files) as
    # collected; its notebooks as the sandbox executed them. Links are left out.
    submitted = root / "submitted" / student / assignment
    for folder, dirs, files in os.walk(submitted, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
        rel = Path(folder).relative_to(submitted)
        (handoff / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            path = Path(folder) / name
            if (rel == Path(".") and name.endswith(".ipynb")) or path.is_symlink():
                continue
            shutil.copyfile(path, handoff / rel / name)
    for name, text in notebooks.items():
        if SAFE_NAME.fullmatch(name) and name.endswith(".ipynb"):
            (handoff / name).write_text(text)
    os.chdir(root)
    app = AutogradeApp()
    app.initialize([
        assignment, "--student", student, "--force", "--course", course,
        f"--CourseDirectory.root={root}", f"--CourseDirectory.submitted_directory={HANDOFF}",
    ])  # fmt: skip
    cfg = Config()
    cfg.Autograde.sanitize_preprocessors = [
        DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata,
    ]  # fmt: skip
    cfg.Autograde.autograde_preprocessors = [
        IgnorePattern, LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata,
    ]  # fmt: skip
    app.update_config(cfg)
    try:
        app.start()
    except SystemExit as e:
        if e.code:
            raise
    shutil.rmtree(root / HANDOFF / student, ignore_errors=True)
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", course_id=course) as gb:
        sub = gb.find_submission(assignment, student)
        out = {
            "score": sub.score,
            "max_score": sub.max_score,
            "notebooks": {nb.name: nb.score for nb in sub.notebooks},
        }
    print(json.dumps(out))


def _bring_up_loopback() -> None:
    for ip in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if os.path.exists(ip):
            subprocess.run([ip, "link", "set", "lo", "up"], check=True)
            return
    raise SystemExit("gpulab: no `ip` command to bring the sandbox's loopback up")


def _op_sandbox(
    uid: int, work: str, procs: str, max_bytes: int, time_limit: float, private_below: str,
    assignment: str, student: str,
) -> None:  # fmt: skip
    """As root: join the cgroup, then run :func:`_op_inner` in fresh namespaces.

    The time limit holds without the hub too (a hub that died mid-grading): ``timeout`` (root)
    kills ``unshare`` (root) a little after the hub would have, ``--kill-child`` then kills the
    namespace's pid 1, and with it every process of the namespace."""
    for path in filter(None, procs.split(os.pathsep)):
        with open(path, "w") as f:
            f.write("0")
    tools = "/usr/bin:/bin:/usr/sbin:/sbin"
    unshare, timeout = shutil.which("unshare", path=tools), shutil.which("timeout", path=tools)
    if unshare is None or timeout is None:
        raise SystemExit("gpulab: the grading sandbox needs `unshare` and `timeout`")
    argv = [
        timeout, "--signal=KILL", f"{time_limit + 10:g}",
        unshare, "--net", "--mount", "--ipc", "--pid", "--kill-child", "--mount-proc",
        "--propagation", "private", "--",
        *_helper(
            "inner", "--uid", str(uid), "--work", work, "--max-bytes", str(max_bytes),
            "--private-below", private_below, assignment, student,
        ),
    ]  # fmt: skip
    os.execve(timeout, argv, dict(os.environ))


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        err = ctypes.get_errno()
        raise SystemExit(f"gpulab: mount {source} on {target}: {os.strerror(err)}")


def _software_under_tmp() -> list[str]:
    """The folders gpulab and nbgrader run from (this checkout, the interpreter's prefix, its
    import path) that lie in a folder the sandbox makes private: outermost ones only."""
    wanted = {
        str(Path(__file__).resolve().parents[2]),
        os.path.realpath(sys.prefix),
        os.path.dirname(os.path.realpath(_python())),
        *(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)),
    }
    hidden = [
        p
        for p in wanted
        if any(p == f or p.startswith(f.rstrip("/") + "/") for f in SHARED_WRITABLE)
        and os.path.isdir(p)
    ]
    hidden.sort(key=len)
    outer: list[str] = []
    for p in hidden:
        if not any(p == o or p.startswith(o + "/") for o in outer):
            outer.append(p)
    return outer


def _op_inner(
    uid: int, work: str, max_bytes: int, private_below: str, assignment: str, student: str
) -> None:
    """As root, pid 1 of the sandbox's namespaces: loopback up, every home and dataset mounted
    below the data dir detached (a grading job pins no user's home: their quota change or
    release would answer "in use" until it ends), private temp folders (the work folder bound
    at :data:`SANDBOX_WORK` inside them, wherever the data dir is), then become the throwaway
    uid and run nbgrader."""
    _bring_up_loopback()
    if private_below:
        detach_mounts_below(libc(), private_below, keep=[work])
    # Held open: a tmpfs over /tmp may hide the work folder's own path.
    work_fd = os.open(work, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    # So may it hide the software that grades (a checkout and its venv under /tmp, as CI has):
    # held open too, and bound back read-only at their own paths in the private folder.
    software = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in _software_under_tmp()}
    for folder in SHARED_WRITABLE:
        if os.path.isdir(folder) and not os.path.islink(folder):
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=256m")
    old_umask = os.umask(0o022)  # the folders leading to them: passable for the grading uid
    for path, fd in software.items():
        os.makedirs(path, 0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND, None)
        _mount("none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.close(fd)
    os.umask(old_umask)
    os.mkdir(SANDBOX_WORK, 0o755)
    _mount(f"/proc/self/fd/{work_fd}", SANDBOX_WORK, None, MS_BIND, None)
    os.close(work_fd)
    # No file the sandbox writes (its log included) grows past the submission limit.
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("gpulab: could not become the grading uid")
    os.umask(0o077)
    os.chdir(SANDBOX_WORK)
    nbgrader = str(Path(_python()).parent / "nbgrader")
    env = _clean_env(os.path.join(SANDBOX_WORK, "home"), "gpulab-grader")
    env["JUPYTER_CONFIG_DIR"] = os.path.join(SANDBOX_WORK, "home", ".jupyter")
    argv = [nbgrader, "autograde", assignment, "--student", student, "--force"]
    proc = subprocess.Popen(argv, env=env)
    # pid 1 of the namespace: when nbgrader ends, every process left in it ends with us.
    sys.exit(proc.wait())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpulab.spawners.local.grader")
    parser.add_argument("op", choices=["list", "export", "import", "sandbox", "inner"])
    parser.add_argument("--uid", type=int, default=0)
    parser.add_argument("--work", default="")
    parser.add_argument("--procs", default="")
    parser.add_argument("--max-bytes", type=int, default=200 << 20)
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--private-below", default="")
    parser.add_argument("args", nargs="*")
    ns = parser.parse_intermixed_args(argv)
    if ns.op == "list":
        _op_list(*ns.args)
    elif ns.op == "export":
        _op_export(*ns.args)
    elif ns.op == "import":
        _op_import(*ns.args)
    elif ns.op == "sandbox":
        if ns.uid <= 0:
            raise SystemExit("gpulab: the sandbox needs a non-root uid")
        _op_sandbox(
            ns.uid, ns.work, ns.procs, ns.max_bytes, ns.time_limit, ns.private_below, *ns.args
        )
    else:
        if ns.uid <= 0:
            raise SystemExit("gpulab: the sandbox needs a non-root uid")
        _op_inner(ns.uid, ns.work, ns.max_bytes, ns.private_below, *ns.args)


if __name__ == "__main__":
    main()
