"""Course staff's rights over students: decided here, and only here.

A TA or teacher holds ``servers!group=C``, which JupyterHub reads as "start any server of any
member of C, with any options". Unchecked, a TA of one course could start or switch a student's
server under the student's other course (that course's pool pays) or with options the course does
not allow, and a teacher could pull any student of a course they only assist into their own course.
So every path that starts, switches or launches someone else's server (REST start, the spawn form
GET and POST, the switch API, app launch, and through them the spot queue) and every path that
enrols people (the roster) asks this module, and each refusal names the rule:

- **start rule**: someone other than the owner (and not an admin or a service) may start, switch
  or launch the owner's server only under a course they teach or assist AND the owner takes; the
  spawner then holds the server to that course's limits and billing charges that course's pool
  ONLY (:func:`mark_payer`): the hub reports the server with ``paid_by = "course"``, so the
  student's own balance never pays for what the staff started (it runs as under overflow
  "refuse": refused at start, or stopped, when the pool or the student's cap cannot pay).
- **enrol rule**: a teacher adds an existing user to their course directly (no invitation) only
  when they already TEACH that user (as teacher, not as TA) in another course; admins always may.
- **share rule** (:func:`share_problem`): a user shares their own dataset with a course's class
  only when they teach or assist that course (admins always may).
- **dashboard rights** (:func:`page_rights`): what the course pages show a caller: the create
  form to admins (``admin:groups``, as ``POST /courses`` needs), the roster upload and the
  bookings form with Cancel to holders of ``course-manage!group=C`` (as the roster and booking
  APIs need). The pages only show; the APIs behind every form check the same scopes again.
"""

from __future__ import annotations

from typing import Any

from gpulab.hub_config.courses.groups import CourseError, find, staff_courses, students
from gpulab.hub_config.scopes import COURSE_MANAGE_SCOPE
from gpulab.spawners.courses import set_payer, student_courses


def _acting_staff(handler: Any, owner_name: str) -> Any:
    """The user acting on ``owner_name``'s server when the start rule applies to them, else None
    (the owner themselves, an admin of servers, a service or a token without a user)."""
    me = handler.current_user
    if me is None or getattr(me, "kind", "user") != "user" or me.name == owner_name:
        return None
    if handler.has_scope("admin:servers"):
        return None
    return me


def shared_courses(db: Any, actor: str, owner_orm_user: Any) -> list[str]:
    """The courses ``actor`` teaches or assists that ``owner`` takes as a student, by name."""
    staffed = {c.name for _, c, _ in staff_courses(db, actor)}
    return sorted(staffed & {c.name for c in student_courses(owner_orm_user)})


def start_problem(db: Any, actor: str, owner_orm_user: Any, course: Any) -> str | None:
    """Why ``actor`` may not start/switch/launch ``owner``'s server under ``course`` (None: they
    may). ``course`` is what the options name (None: none named)."""
    common = shared_courses(db, actor, owner_orm_user)
    if course in common:
        return None
    where = ", ".join(common) or "none"
    named = f"course {course!r}" if course else "no course"
    return (
        f"you may start {owner_orm_user.name}'s server only under a course you teach or assist "
        f"and they take (set course to one of: {where}; the request names {named})"
    )


def check_staff_start(handler: Any, owner: Any, raw_options: Any) -> str | None:
    """Raise :class:`CourseError` (403, field ``course``) unless ``handler``'s caller may start
    ``owner``'s server with ``raw_options`` (JSON options, the form's converted options, or a
    running server's options merged with a switch's changes). Return the acting staff member's
    name when the start rule applied (someone other than the owner), else None."""
    me = _acting_staff(handler, owner.name)
    if me is None:
        return None
    course = raw_options.get("course") if isinstance(raw_options, dict) else None
    problem = start_problem(handler.db, me.name, owner.orm_user, course)
    if problem is not None:
        raise CourseError(403, "course", problem)
    return me.name


def mark_payer(spawner: Any, actor: str | None) -> None:
    """Record who may pay for the start about to happen on ``spawner``: ``"course"`` (the pool
    only) when ``actor`` (course staff, from :func:`check_staff_start`) is not its owner, else
    None (billed as usual). Set by the hub on every start path, never from the user's request;
    read by ``billing_hooks`` (the start's balance check and the options it reports)."""
    set_payer(spawner.user.name, spawner.name or "", "course" if actor else None)


def check_staff_view(handler: Any, owner: Any, course: Any = None) -> None:
    """The spawn form for someone else's server: the caller must staff a course the owner takes
    (and, when the link names a course, that one). Raise :class:`CourseError` (403) otherwise."""
    me = _acting_staff(handler, owner.name)
    if me is None:
        return
    common = shared_courses(handler.db, me.name, owner.orm_user)
    if (course is None and common) or course in common:
        return
    raise CourseError(403, "course", start_problem(handler.db, me.name, owner.orm_user, course))


def taught_students(db: Any, teacher: str) -> set[str]:
    """Everyone ``teacher`` teaches as a teacher (not as a TA), in any course."""
    out: set[str] = set()
    for group, _, role in staff_courses(db, teacher):
        if role == "teacher":
            out.update(students(group))
    return out


def enrols_directly(handler: Any, username: str, taught: set[str] | None = None) -> bool:
    """The enrol rule: may ``handler``'s caller add the existing user ``username`` to a course
    without an invitation? Admins (``admin:groups``) may; a teacher may when they already teach
    that user as a teacher in another course. ``taught`` caches :func:`taught_students`."""
    if handler.has_scope("admin:groups"):
        return True
    me = handler.current_user
    if me is None:
        return False
    if taught is None:
        taught = taught_students(handler.db, me.name)
    return username in taught


def share_problem(handler: Any, course: str) -> tuple[int, str] | None:
    """The **share rule**: may ``handler``'s caller share their own dataset with ``course``'s
    class (``hub_config/api/datasets.py``)? Its teachers and TAs may, and admins of groups;
    a student, or anyone else, may not. (status, why) when not: 400 for no such course, 403
    for one they do not teach or assist."""
    found = find(handler.db, course) if isinstance(course, str) else None
    if found is None:
        return 400, f"courses: there is no course {course!r}"
    me = handler.current_user
    if handler.has_scope("admin:groups"):
        return None
    if me is not None and found[1].staff_role(me.name) is not None:
        return None
    return 403, (f"courses: you may share only with courses you teach or assist, not {course!r}")


def may_create_courses(handler: Any) -> bool:
    """May ``handler``'s caller create courses (and see every course)? Admins of groups only, as
    ``POST /hub/api/gpulab/courses`` requires."""
    return bool(handler.has_scope("admin:groups"))


def may_manage(handler: Any, course: str) -> bool:
    """May the caller import rosters into, and book or cancel lab sessions of, ``course``? The
    scope the roster and booking APIs require (``course-manage!group=C``)."""
    return bool(handler.has_scope(f"{COURSE_MANAGE_SCOPE}!group={course}"))


def page_rights(handler: Any, course: str | None = None) -> dict[str, bool]:
    """What the course pages show the caller: ``create`` (the new-course form), ``manage`` (the
    roster upload, the bookings form and Cancel) for ``course`` when one is named."""
    return {
        "create": may_create_courses(handler),
        "manage": course is not None and may_manage(handler, course),
    }
