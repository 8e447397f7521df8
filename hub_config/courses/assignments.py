"""Assignments with nbgrader: the hub tells each starting server which courses its user is in.

The hub decides (a course's students are its group's members, its teachers and TAs are in the
group's properties, see :mod:`.groups`); the spawner only applies what it is told
(``GpuSpawnerMixin.course_seats_hook``): it sets up those courses' nbgrader exchanges and the
server's nbgrader config (``spawners/local/exchange.py``). See docs/nbgrader.md.

nbgrader's JupyterLab extension (its menus: assignments, courses, formgrader) and its server
extensions are installed for everyone, but mean something only to people in a course. A server
of a user in no course gets ``no_nbgrader/`` first on its ``JUPYTER_CONFIG_PATH``
(:func:`config_path`, a ``Spawner.environment`` callable decided at each start): its
``labconfig/page_config.json`` disables ``@jupyter/nbgrader`` and its
``jupyter_server_config.json`` the server extensions. A course's students and staff keep them.
(Servers on the Docker spawner see the hub's path as missing and keep nbgrader's menus.)
"""

from __future__ import annotations

import os
from pathlib import Path
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


# Jupyter config that turns nbgrader off in a server (see the module's docstring).
NO_NBGRADER = Path(__file__).with_name("no_nbgrader")


def config_path(rest: str = "") -> Any:
    """A ``Spawner.environment`` value for ``JUPYTER_CONFIG_PATH``: ``rest`` (what the config
    had), with :data:`NO_NBGRADER` first for a user in no course at this start."""

    def value(spawner: Any) -> str:
        seats = getattr(spawner, "course_seats", None)
        if seats is None:  # not a gpulab spawner: ask the database
            seats = course_seats(spawner.user.db, spawner.user.name)
        paths = [] if seats else [str(NO_NBGRADER)]
        return os.pathsep.join([*paths, *filter(None, [rest])])

    return value


def configure_assignments(c: Any) -> None:
    """Wire :func:`seats_hook` into every gpulab spawner of a hub config ``c``, and nbgrader's
    menus off for users in no course (:func:`config_path`)."""
    c.Spawner.course_seats_hook = seats_hook
    env = dict(c.Spawner.environment) if "environment" in c.Spawner else {}
    rest = env.get("JUPYTER_CONFIG_PATH", "")
    env["JUPYTER_CONFIG_PATH"] = config_path(rest if isinstance(rest, str) else "")
    c.Spawner.environment = env
