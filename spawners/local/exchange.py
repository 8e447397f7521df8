"""nbgrader on local servers: the course exchanges gpulab manages and each server's nbgrader config.

Layout under the data dir (``DATA_DIR/courses``, 0711: passable, not listable):

- ``exchange/COURSE/{outbound,inbound,feedback}``: nbgrader's exchange of one course, made by the
  hub (owned by root under a root hub). The course folder is the gate: under a root hub with
  per-user accounts only the accounts of the course's students and staff may enter it, through
  a POSIX ACL on that one folder (mode 0750 + ``user:jupyter-NAME:r-x`` per person). Inside,
  nbgrader's own modes apply: ``outbound`` readable by all who passed the gate and writable by
  staff; ``inbound`` writable but not listable by students (1773: nobody else's submission can
  be listed, renamed or removed); ``feedback`` passable only (files are found by a secret hash).
  Staff get ``rwx`` on the three through named ACL entries (defaults on outbound and feedback, so
  co-teachers can replace each other's releases).
- ``users/NAME/``: per user, readable by that user's account only: ``nbgrader_config.py`` (put
  first on the server's ``JUPYTER_CONFIG_PATH``) and ``exchange/`` with one link per course of
  the user, the ``Exchange.root`` of that user's nbgrader: ``nbgrader list`` (and JupyterLab's
  Assignments tab) see the user's courses and nothing of others, not even their names.

Bounded (issue 23): students write into ``inbound`` from their own servers, so under a hub that
can loop-mount (the home store enforces quotas) each course's folder is an ext4 image of its own
(``DATA_DIR/storage/exchange-images/COURSE.img``, loop-mounted at ``exchange/COURSE``, made with
:mod:`gpulab.spawners.storage.loopfs`), sized per person of the course and grown as the course
grows: a huge submission or 100,000 tiny files fill that course's exchange (ENOSPC in the
student's own code: its blocks or its inodes), never the node's disk. Within a course one
student can still fill the course's room until its staff clean up (nbgrader's inbound is one
folder for all; there is no per-student bound without the kernel's user quotas).

ACLs instead of a Unix group per course: a server drops every supplementary group when it becomes
its account (``setgroups([gid])`` in the launcher), and an ACL entry applies at once, also to
servers already running. Without per-user accounts (the hub not root) every server runs as one
account and nothing here isolates courses from each other.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from gpulab.spawners.local.accounts import Account
from gpulab.spawners.request import CourseSeat
from gpulab.spawners.storage.loopfs import ImageError, ImageHomes

CONFIG_NAME = "nbgrader_config.py"
# Course names become folder names (gpulab's own are lowercase letters, digits and '-').
SAFE_COURSE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
EXCHANGE_PARTS = ("outbound", "inbound", "feedback")
# Where a teacher's course directories live, in their home (nbgrader's CourseDirectory.root).
COURSE_DIRS = "~/courses"
# What `nbgrader autograde` (or the Formgrader's autograde button) in a staff server answers.
AUTOGRADE_REFUSAL = (
    "gpulab: autograding in your own server would run your students' code as you (it could "
    "read every submission and your files). Let the hub grade each submission in a sandbox: "
    "POST /hub/api/gpulab/courses/COURSE/assignments/ASSIGNMENT/autograde with a token of "
    "yours (after `nbgrader collect`); see docs/nbgrader.md. To run it here anyway, set "
    "GPULAB_UNSAFE_AUTOGRADE=1."
)

# POSIX ACLs as Linux keeps them in xattrs (linux/posix_acl_xattr.h).
ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
R, W, X = 4, 2, 1
RX, RWX, WX = R | X, R | W | X, W | X


class ExchangeError(RuntimeError):
    """The exchange could not be set up; the message says why."""


def encode_acl(owner: int, named: dict[int, int], group: int, other: int) -> bytes:
    """A POSIX ACL xattr value: ``owner``/``group``/``other`` permission bits (0-7), ``named``
    uid -> bits, and a mask that lets every named entry have all its bits."""
    entries = [(_USER_OBJ, owner, _NO_ID)]
    entries += [(_USER, perm, uid) for uid, perm in sorted(named.items())]
    entries.append((_GROUP_OBJ, group, _NO_ID))
    if named:
        mask = group
        for perm in named.values():
            mask |= perm
        entries.append((_MASK, mask, _NO_ID))
    entries.append((_OTHER, other, _NO_ID))
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def decode_acl(value: bytes) -> dict[str, object]:
    """The entries of an ACL xattr value: ``owner``, ``group``, ``mask``, ``other`` (bits or
    None) and ``named`` (uid -> bits)."""
    (version,) = struct.unpack_from("<I", value)
    if version != _ACL_VERSION:
        raise ValueError(f"unknown ACL version {version}")
    out: dict[str, object] = {"owner": None, "group": None, "mask": None, "other": None}
    named: dict[int, int] = {}
    for offset in range(4, len(value), 8):
        tag, perm, uid = struct.unpack_from("<HHI", value, offset)
        if tag == _USER:
            named[uid] = perm
        else:
            key = {_USER_OBJ: "owner", _GROUP_OBJ: "group", _MASK: "mask", _OTHER: "other"}[tag]
            out[key] = perm
    out["named"] = named
    return out


def set_acl(path: Path, value: bytes, default: bytes | None = None) -> None:
    try:
        os.setxattr(path, ACL_ACCESS, value)
        if default is not None:
            os.setxattr(path, ACL_DEFAULT, default)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise ExchangeError(
                f"{path}: this filesystem has no POSIX ACLs (mount it with 'acl'); course "
                "exchanges stay closed"
            ) from None
        raise


def _mkdir(path: Path, mode: int) -> None:
    """``path`` exists as a folder; made with ``mode`` when missing (left as it is if not)."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise ExchangeError(f"{path} is not a folder") from None
        return
    os.chmod(path, mode)


def _uids(names: Iterable[str], account_of: Callable[[str], Account | None]) -> set[int]:
    uids = set()
    for name in names:
        account = account_of(name)
        if account is not None:
            uids.add(account.uid)
    return uids


def prepare_course(
    exchange: Path, seat: CourseSeat, account_of: Callable[[str], Account | None] | None
) -> Path:
    """Make (or bring up to date) ``exchange/COURSE`` for ``seat``'s course; return it.

    ``account_of`` maps a hub user to their Unix account (None while they have none): given, the
    course folder is closed to all but the course's people (their entries are set from the
    seat's lists, so someone who left loses theirs). None: no isolation (one account for all)."""
    course_dir = exchange / seat.course
    if account_of is None:
        _mkdir(course_dir, 0o755)
        os.chmod(course_dir, 0o755)  # a bounded exchange's image root is made 0700
        for part in EXCHANGE_PARTS:
            _mkdir(course_dir / part, 0o755 if part == "outbound" else 0o733)
        return course_dir
    staff = _uids(seat.staff, account_of)
    people = staff | _uids(seat.students, account_of)
    _mkdir(course_dir, 0o700)  # closed until its ACL is in place
    outbound, inbound, feedback = (course_dir / p for p in EXCHANGE_PARTS)
    _mkdir(outbound, 0o755)
    _mkdir(inbound, 0o1733)
    _mkdir(feedback, 0o711)
    if not inbound.stat().st_mode & stat.S_ISVTX:
        os.chmod(inbound, 0o1733)
    staff_rwx = dict.fromkeys(staff, RWX)
    # Readable by all past the gate, writable by staff; what staff create there stays theirs.
    set_acl(
        outbound,
        encode_acl(RWX, staff_rwx, 0, RX),
        default=encode_acl(RWX, staff_rwx, RX, RX),
    )
    # Students may drop a submission in but not list what others dropped (sticky: nor rename
    # or remove it).
    set_acl(inbound, encode_acl(RWX, staff_rwx, 0, WX))
    set_acl(
        feedback,
        encode_acl(RWX, staff_rwx, 0, X),
        default=encode_acl(RWX, staff_rwx, RX, R),
    )
    # The gate, last: nobody outside the course passes it.
    set_acl(course_dir, encode_acl(RWX, dict.fromkeys(people, RX), 0, 0))
    return course_dir


def prepare_user(
    user_dir: Path,
    exchange: Path,
    seats: Iterable[CourseSeat],
    account: Account | None,
    config_text: str,
) -> Path:
    """Write ``user_dir`` (config and exchange links, see the module doc); return the folder
    to put on ``JUPYTER_CONFIG_PATH``. ``account``: the server's own account (None: the hub's)."""
    seats = list(seats)
    user_dir.mkdir(parents=True, exist_ok=True)
    view = user_dir / "exchange"
    view.mkdir(exist_ok=True)
    if view.is_symlink():
        raise ExchangeError(f"{view} is not a folder")
    wanted = {s.course for s in seats}
    for entry in view.iterdir():
        if entry.name not in wanted and entry.is_symlink():
            entry.unlink(missing_ok=True)  # another start of this user's may have done it
    for seat in seats:
        link = view / seat.course
        target = exchange / seat.course
        if link.is_symlink() and os.readlink(link) == str(target):
            continue
        if link.is_symlink():
            link.unlink(missing_ok=True)
        try:
            link.symlink_to(target, target_is_directory=True)
        except FileExistsError:  # made by another start of this user's at the same moment
            if not (link.is_symlink() and os.readlink(link) == str(target)):
                raise
    config = user_dir / CONFIG_NAME
    # A temporary name of this start's own: several servers of one user (a user's jobs) may
    # start at once, each writing the same config (a shared name made the others' starts fail).
    tmp = user_dir / f".{CONFIG_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(config_text)
    if account is not None:
        # The user's account reads it (and may not change it); nobody else may.
        for path, mode in ((tmp, 0o640), (view, 0o750), (user_dir, 0o750)):
            os.chown(path, 0, account.gid)
            os.chmod(path, mode)
    else:
        for path, mode in ((tmp, 0o644), (view, 0o755), (user_dir, 0o755)):
            os.chmod(path, mode)
    tmp.replace(config)
    return user_dir


def render_config(
    exchange_root: str, seats: Iterable[CourseSeat], student_id: str | None = None
) -> str:
    """The ``nbgrader_config.py`` of a user's servers.

    ``exchange_root``: the user's exchange (a folder with one entry per course). The course a
    command is about is its ``--course`` (or ``--CourseDirectory.course_id``), else the teacher's
    course folder it runs in (``~/courses/COURSE/...``), else the user's only course. For a
    course the user teaches or assists, ``CourseDirectory.root`` is ``~/courses/COURSE`` (made
    if missing). ``student_id``: submit under this name in the user's student courses (only
    where every server shares one account, so the account name cannot tell students apart).
    """
    roles = {s.course: s.role for s in seats}
    return f"""\
# Written by gpulab at every start of this server: changes here are lost. Your own settings go
# in a course directory's nbgrader_config.py (~/courses/COURSE/, read after this file) or in
# ~/.jupyter/nbgrader_config.py (read before it: what this file sets wins).
import os as _os
import sys as _sys

c = get_config()  # noqa: F821
GPULAB_EXCHANGE = {exchange_root!r}
GPULAB_COURSES = {roles!r}  # course -> your role
GPULAB_COURSE_DIRS = _os.path.expanduser({COURSE_DIRS!r})
GPULAB_STUDENT_ID = {student_id!r}

c.Exchange.root = GPULAB_EXCHANGE
c.Exchange.path_includes_course = True
# The exchange's folders belong to the hub, not to the teacher who releases first.
c.CourseDirectory.groupshared = True


def _gpulab_course(argv, cwd):
    for i, arg in enumerate(argv):
        for flag in ("--course", "--CourseDirectory.course_id"):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    inside = _os.path.relpath(cwd, GPULAB_COURSE_DIRS).split(_os.sep)[0]
    if inside in GPULAB_COURSES and GPULAB_COURSES[inside] != "student":
        return inside
    if len(GPULAB_COURSES) == 1:
        return next(iter(GPULAB_COURSES))
    return None


GPULAB_COURSE = _gpulab_course(_sys.argv[1:], _os.getcwd())
if GPULAB_COURSE in GPULAB_COURSES:
    c.CourseDirectory.course_id = GPULAB_COURSE
    if GPULAB_COURSES[GPULAB_COURSE] in ("teacher", "ta"):
        _root = _os.path.join(GPULAB_COURSE_DIRS, GPULAB_COURSE)
        _os.makedirs(_os.path.join(_root, "source"), exist_ok=True)
        c.CourseDirectory.root = _root
    elif GPULAB_STUDENT_ID:
        c.CourseDirectory.student_id = GPULAB_STUDENT_ID

# Autograding here would run every student's code as you: it could read all submissions and
# your files, reach the hub as you and leave processes billed to you. The hub grades each
# submission in a sandbox of its own instead (docs/nbgrader.md, "Autograding"). To run it here
# anyway (your own test notebooks), set GPULAB_UNSAFE_AUTOGRADE=1 in the command's environment.
if (
    any(role != "student" for role in GPULAB_COURSES.values())
    and not _os.environ.get("GPULAB_UNSAFE_AUTOGRADE")
):
    from nbgrader.preprocessors import NbGraderPreprocessor as _Preprocessor

    class GpulabSandboxedAutograde(_Preprocessor):
        def preprocess(self, nb, resources):
            raise RuntimeError({AUTOGRADE_REFUSAL!r})

    c.Autograde.autograde_preprocessors = [GpulabSandboxedAutograde]
"""


def course_room(seat: CourseSeat, bytes_per_person: int) -> int:
    """The room of a course's bounded exchange: ``bytes_per_person`` for each of its people."""
    people = len(set(seat.students) | set(seat.staff))
    return max(1, people) * bytes_per_person


def bound_course(data_dir: Path, exchange: Path, seat: CourseSeat, room: int) -> str | None:
    """The course's exchange folder is its own filesystem image of at least ``room`` bytes:
    made (an existing plain folder copied in) and mounted when it is not, grown when the course
    grew. Never shrunk here. A growth the node refuses while the exchange is in use (a kernel
    without online resizing) leaves it at its size, still bounded: the problem is returned and
    the course stays open."""
    images = ImageHomes(exchange, Path(data_dir) / "storage" / "exchange-images")
    if images.mounted_device(seat.course) is None:
        images.ensure(seat.course, room, None, None)
    got = images.usage(seat.course)
    if got is not None and got.capacity_bytes < room:
        try:
            images.resize(seat.course, room)
        except ImageError as e:
            return f"exchange kept at {got.capacity_bytes} bytes, not grown to {room}: {e}"
    return None


def prepare(
    data_dir: str | os.PathLike,
    home_name: str,
    user_name: str,
    seats: Iterable[CourseSeat],
    account: Account | None,
    account_of: Callable[[str], Account | None] | None,
    bytes_per_person: int | None = None,
) -> tuple[Path, list[str]]:
    """Everything nbgrader needs for one server of ``user_name`` (blocking): the exchanges of
    its courses and its own folder. Returns that folder (for ``JUPYTER_CONFIG_PATH``) and the
    problems met (a course whose exchange could not be set up stays closed; the server starts).
    ``bytes_per_person``: bound each course's exchange (an image of its own, see the module's
    docstring) to this much per person of the course; None: plain folders on the data dir.
    """
    problems = []
    safe = []
    for seat in seats:
        if SAFE_COURSE.fullmatch(seat.course):
            safe.append(seat)
        else:
            problems.append(f"course {seat.course!r}: not a safe folder name, left out")
    seats = safe
    base = Path(data_dir) / "courses"
    exchange = base / "exchange"
    for folder in (base, exchange, base / "users"):
        _mkdir(folder, 0o711)
    for seat in seats:
        try:
            if bytes_per_person is not None:
                room = course_room(seat, bytes_per_person)
                problem = bound_course(Path(data_dir), exchange, seat, room)
                if problem:
                    problems.append(f"course {seat.course}: {problem}")
            prepare_course(exchange, seat, account_of)
        except (ExchangeError, ImageError, OSError) as e:
            problems.append(f"course {seat.course}: {e}")
    user_dir = base / "users" / home_name
    text = render_config(
        str(user_dir / "exchange"), seats, student_id=None if account is not None else user_name
    )
    return prepare_user(user_dir, exchange, seats, account, text), problems
