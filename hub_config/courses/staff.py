"""Course staff starting a student's server: only under a course they teach and the student takes.

A TA or teacher holds ``servers!group=C``, which JupyterHub reads as "start any server of any
member of C, with any options". Unchecked, a teacher of one course could start a student's server
under the student's other course (that course's pool pays) or with options the course does not
allow. So a start requested by someone other than the owner (and not by an admin or a service)
must name a course the requester staffs and the owner studies; the spawner then holds the server
to that course's limits and billing charges that course's pool.
"""

from __future__ import annotations

from typing import Any

from gpulab.hub_config.courses.groups import CourseError, staff_courses
from gpulab.spawners.courses import student_courses


def check_staff_start(handler: Any, owner: Any, raw_options: Any) -> None:
    """Raise :class:`CourseError` (403) unless ``handler``'s caller may start ``owner``'s server
    with ``raw_options`` (the JSON options or the form's converted options)."""
    me = handler.current_user
    if me is None or getattr(me, "kind", "user") != "user" or me.name == owner.name:
        return
    if handler.has_scope("admin:servers"):
        return
    staffed = {c.name for _, c, _ in staff_courses(handler.db, me.name)}
    theirs = {c.name for c in student_courses(owner.orm_user)}
    common = sorted(staffed & theirs)
    course = raw_options.get("course") if isinstance(raw_options, dict) else None
    if course not in common:
        where = ", ".join(common) or "none"
        raise CourseError(
            403,
            "course",
            f"you may start {owner.name}'s server only under a course you teach or assist and "
            f"they take (set course to one of: {where})",
        )
