"""Assignments with nbgrader: the hub tells each starting server which courses its user is in.

The hub decides (a course's students are its group's members, its teachers and TAs are in the
group's properties, see :mod:`.groups`); the spawner only applies what it is told
(``GpuSpawnerMixin.course_seats_hook``): it sets up those courses' nbgrader exchanges and the
server's nbgrader config (``spawners/local/exchange.py``). See docs/nbgrader.md.
"""

from __future__ import annotations

from typing import Any

from jupyterhub import orm

from gpulab.hub_config.courses.groups import all_courses, students
from gpulab.spawners.request import CourseSeat


def course_seats(db: Any, name: str) -> list[CourseSeat]:
    """Every course ``name`` studies, teaches or assists, with the course's people, by course
    name. Staff of a course are never its students there (one role per course).

    On every spawn: a course's members are read only for the courses ``name`` is in (their
    membership comes from the user's own groups), not for every course of the hub."""
    user = orm.User.find(db, name)
    studies = {g.name for g in user.groups} if user is not None else set()
    seats = []
    for group, course in all_courses(db):
        role = course.staff_role(name) or ("student" if course.name in studies else None)
        if role is None:
            continue
        staff = tuple(dict.fromkeys([*course.teachers, *course.tas]))
        seats.append(
            CourseSeat(
                course=course.name,
                role=role,
                students=tuple(m for m in students(group) if m not in staff),
                staff=staff,
            )
        )
    return seats


def seats_hook(spawner: Any) -> list[CourseSeat]:
    """``course_seats_hook``: the courses of the spawner's user, read from the hub's database."""
    user = spawner.user
    return course_seats(user.db, user.name)


def configure_assignments(c: Any) -> None:
    """Wire :func:`seats_hook` into every gpulab spawner of a hub config ``c``."""
    c.Spawner.course_seats_hook = seats_hook
