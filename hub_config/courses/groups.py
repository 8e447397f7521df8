"""A course as a JupyterHub group, and its staff as roles scoped to that group.

The group's members are the students; its ``properties["gpulab_course"]`` hold the display name,
the teachers, the TAs and the limits. Staff are not members, so a TA's
``access:servers!group=C`` reaches the students' servers and nobody else's (not the teacher's,
not another course's). The roles are derived from the properties: :func:`sync_roles` makes the
database agree with them, when a course changes and at every hub start (JupyterHub drops roles
that its config does not load).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from jupyterhub import orm
from jupyterhub.roles import create_role, grant_role, strip_role

from gpulab.hub_config.scopes import COURSE_MANAGE_SCOPE, COURSE_READ_SCOPE
from gpulab.spawners.courses import COURSE_KEY, Course, course_of_group

STAFF = ("teacher", "ta")
ROLES = ("student", *STAFF)

MakeUser = Callable[[str], Any]


class CourseError(ValueError):
    """A course request that cannot be done: HTTP ``status``, the ``field`` it is about."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.status = status
        self.field = field


def role_name(course: str, kind: str) -> str:
    return f"gpulab-course-{course}-{kind}"


def staff_scopes(course: str, kind: str, students: Iterable[str] = ()) -> list[str]:
    """What a course's TA (``kind='ta'``) or teacher may do: the students' servers (open, start,
    stop), their user records, the course; teachers also manage the course.

    ``access:servers`` is also listed per student (``!user=NAME``): the hub resolves group filters,
    but a single-user server checking an API token's scopes cannot (see
    ``jupyterhub.services.auth.check_scopes``), so a TA's token would be turned away there.
    """
    f = f"!group={course}"
    scopes = [
        f"access:servers{f}",
        *(f"access:servers!user={name}" for name in sorted(students)),
        f"servers{f}",
        f"read:users{f}",
        f"list:users{f}",
        f"read:groups{f}",
        f"{COURSE_READ_SCOPE}{f}",
    ]
    if kind == "teacher":
        scopes.append(f"{COURSE_MANAGE_SCOPE}{f}")
    return scopes


def find(db: Any, name: str) -> tuple[Any, Course] | None:
    """The group and course named ``name``, or None when no such course exists."""
    group = orm.Group.find(db, name)
    course = course_of_group(group) if group is not None else None
    return None if course is None else (group, course)


def all_courses(db: Any) -> list[tuple[Any, Course]]:
    out = []
    for group in db.query(orm.Group).order_by(orm.Group.name):
        course = course_of_group(group)
        if course is not None:
            out.append((group, course))
    return out


def students(group: Any) -> list[str]:
    return sorted(u.name for u in group.users)


def _store(db: Any, group: Any, course: Course) -> None:
    """Write ``course`` into its group's properties (keeping any others), then its roles."""
    props = dict(group.properties or {})
    props[COURSE_KEY] = course.model_dump(mode="json", exclude={"name"})
    group.properties = props
    db.commit()
    sync_roles(db, group, course)


def save(db: Any, course: Course, make_user: MakeUser, *, create: bool = False) -> Any:
    """Write ``course`` into its group (creating both when ``create``), staff users included."""
    group = orm.Group.find(db, course.name)
    if create:
        if group is not None:
            kind = "course" if course_of_group(group) is not None else "group"
            raise CourseError(409, "name", f"a {kind} named {course.name!r} exists already")
        group = orm.Group(name=course.name)
        db.add(group)
    elif group is None or course_of_group(group) is None:
        raise CourseError(404, "name", f"no course named {course.name!r}")
    for name in (*course.teachers, *course.tas):
        make_user(name)
    _store(db, group, course)
    return group


def sync_roles(db: Any, group: Any, course: Course) -> None:
    """Make the course's staff roles and their holders agree with ``course`` and the group's
    members (idempotent): run after every change of either."""
    wanted = {"teacher": set(course.teachers), "ta": set(course.tas)}
    for kind in STAFF:
        role = create_role(
            db,
            {
                "name": role_name(course.name, kind),
                "description": f"{kind.upper() if kind == 'ta' else kind.title()} of course "
                f"{course.name} (gpulab)",
                "scopes": staff_scopes(course.name, kind, students(group)),
            },
            commit=False,
        )
        db.flush()
        for user in list(role.users):
            if user.name not in wanted[kind]:
                strip_role(db, user, role, commit=False)
        for name in sorted(wanted[kind]):
            user = orm.User.find(db, name)
            if user is not None:
                grant_role(db, user, role, commit=False)
    db.commit()


def sync_all(db: Any) -> int:
    """Restore every course's roles (at hub start); the number of courses."""
    courses = all_courses(db)
    for group, course in courses:
        sync_roles(db, group, course)
    return len(courses)


def add_members(
    db: Any, group: Any, course: Course, rows: Iterable[tuple[str, str]], make_user: MakeUser
) -> Course:
    """Add (username, role) rows to the course: students join the group, staff the properties.
    A user keeps one role per course: the last row wins and the other role is dropped."""
    teachers, tas = list(course.teachers), list(course.tas)
    for name, role in rows:
        user = make_user(name)
        for staff in (teachers, tas):
            if name in staff:
                staff.remove(name)
        if role == "student":
            if user not in group.users:
                group.users.append(user)
        else:
            if user in group.users:
                group.users.remove(user)
            (teachers if role == "teacher" else tas).append(name)
    updated = course.model_copy(update={"teachers": tuple(teachers), "tas": tuple(tas)})
    _store(db, group, updated)
    return updated


def invite(
    db: Any, group: Any, course: Course, names: Iterable[str], tas: Iterable[str] = ()
) -> Course:
    """Invite existing users to join as students, those in ``tas`` as TAs (see
    :attr:`Course.invited`); nobody gets the role before they accept."""
    tas, names = set(tas), list(names)
    names += [n for n in sorted(tas) if n not in names]
    invited = [*course.invited, *(n for n in names if n not in course.invited)]
    as_ta = [n for n in course.invited_tas if n not in names] + [n for n in names if n in tas]
    updated = course.model_copy(update={"invited": tuple(invited), "invited_tas": tuple(as_ta)})
    _store(db, group, updated)
    return updated


def accept(db: Any, group: Any, course: Course, name: str, make_user: MakeUser) -> Course:
    """``name`` accepts their invitation: they join in the role it names (student or TA)."""
    role = course.invited_as(name)
    if role is None:
        raise CourseError(404, "course", f"{name!r} has no invitation to course {course.name}")
    pending = _uninvite(course, name)
    return add_members(db, group, pending, [(name, role)], make_user)


def _uninvite(course: Course, name: str) -> Course:
    return course.model_copy(
        update={
            "invited": tuple(n for n in course.invited if n != name),
            "invited_tas": tuple(n for n in course.invited_tas if n != name),
        }
    )


def remove_member(db: Any, group: Any, course: Course, name: str) -> Course:
    user = orm.User.find(db, name)
    if name in course.invited:
        updated = _uninvite(course, name)
        _store(db, group, updated)
        return updated
    if user is None or (
        user not in group.users and name not in course.teachers and name not in course.tas
    ):
        raise CourseError(404, "user", f"{name!r} is not in course {course.name}")
    if user in group.users:
        group.users.remove(user)
    updated = course.model_copy(
        update={
            "teachers": tuple(n for n in course.teachers if n != name),
            "tas": tuple(n for n in course.tas if n != name),
        }
    )
    _store(db, group, updated)
    return updated


def staff_courses(db: Any, user: str) -> list[tuple[Any, Course, str]]:
    """The courses ``user`` teaches or assists: (group, course, 'teacher' | 'ta')."""
    out = []
    for group, course in all_courses(db):
        role = course.staff_role(user)
        if role is not None:
            out.append((group, course, role))
    return out
