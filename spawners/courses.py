"""Courses as the spawner sees them: which course a server runs under, and what that course allows.

A course is a JupyterHub group (its name is the course's name) whose members are the course's
students; the group's ``properties["gpulab_course"]`` hold the rest (see :class:`Course`). The hub
keeps those properties and the staff roles (``hub_config/courses``); this module only reads them,
so a spawner needs nothing but the user's groups to apply a course's rules.

A student is held to their courses: every server they start runs under one of them (the one the
options name, else the first whose rules allow the request), with that course's GPU types,
images, datasets and apps only. Anything else is refused with 403 naming the course rule.
Users in no course pay as they go, as before.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpulab.catalog import NO_GPU, Catalog
from gpulab.spawners.options import ServerOptions
from gpulab.spawners.storage.datasets import is_private

COURSE_KEY = "gpulab_course"
# The limits a course sets, each against the catalog section it picks from and the options field
# it constrains. ``gpu_types`` may also list NO_GPU (no-GPU servers).
LIMIT_FIELDS = {"gpu_types": "gpu", "images": "image", "datasets": "datasets", "apps": "app"}


class CourseLimits(BaseModel):
    """What a course's servers may use; ``None`` means everything in the catalog."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_types: tuple[str, ...] | None = None
    images: tuple[str, ...] | None = None
    datasets: tuple[str, ...] | None = None
    apps: tuple[str, ...] | None = None

    def allowed(self, section: str, catalog: Catalog) -> list[str]:
        """The slugs of ``section`` this course allows, in catalog order."""
        everything = _catalog_slugs(section, catalog)
        chosen = getattr(self, section)
        return everything if chosen is None else [s for s in everything if s in chosen]

    def check(self, catalog: Catalog) -> None:
        """Raise ValueError naming the first limit that names something the catalog lacks."""
        for section in LIMIT_FIELDS:
            chosen = getattr(self, section)
            if chosen is None:
                continue
            everything = _catalog_slugs(section, catalog)
            for slug in chosen:
                if slug not in everything:
                    raise ValueError(
                        f"limits.{section}: unknown {section[:-1].replace('_', ' ')} {slug!r}; "
                        f"allowed: {', '.join(everything)}"
                    )


class Course(BaseModel):
    """One course, as kept in its group's properties (students are the group's members)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    display_name: str = ""
    teachers: tuple[str, ...] = ()
    tas: tuple[str, ...] = ()
    limits: CourseLimits = Field(default_factory=CourseLimits)
    # Existing users a teacher put on the roster as students: they join when they accept (the
    # course's staff would otherwise reach their servers and files without their say).
    invited: tuple[str, ...] = ()
    # Those of ``invited`` the roster named as TAs: accepting makes them a TA, not a student.
    invited_tas: tuple[str, ...] = ()

    def invited_as(self, user: str) -> str | None:
        if user not in self.invited:
            return None
        return "ta" if user in self.invited_tas else "student"

    @property
    def title(self) -> str:
        return self.display_name or self.name

    def staff_role(self, user: str) -> str | None:
        if user in self.teachers:
            return "teacher"
        if user in self.tas:
            return "ta"
        return None


class CourseRuleError(Exception):
    """A request a course does not allow: 403, with the field and the rule in the message."""

    status = 403

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _catalog_slugs(section: str, catalog: Catalog) -> list[str]:
    if section == "gpu_types":
        return [*catalog.gpu_types, NO_GPU]
    return list(getattr(catalog, section))


def course_of_group(group: Any) -> Course | None:
    """The course a JupyterHub group (ORM object or API model) is, or None for a plain group."""
    props = getattr(group, "properties", None)
    if props is None and isinstance(group, dict):
        props = group.get("properties")
    data = (props or {}).get(COURSE_KEY)
    if not isinstance(data, dict):
        return None
    name = getattr(group, "name", None) or (group.get("name") if isinstance(group, dict) else None)
    try:
        return Course.model_validate({**data, "name": name})
    except ValidationError:
        return None


def student_courses(user: Any) -> list[Course]:
    """The courses ``user`` (a JupyterHub User or ORM user) is a student of, by name."""
    groups = getattr(user, "groups", None) or []
    courses = [c for c in (course_of_group(g) for g in groups) if c is not None]
    return sorted(courses, key=lambda c: c.name)


def violation(opts: ServerOptions, course: Course, catalog: Catalog) -> CourseRuleError | None:
    """The first rule of ``course`` that ``opts`` breaks, or None."""
    limits = course.limits
    picked = {
        "gpu_types": [opts.gpu],
        "images": [opts.image],
        # A user's own dataset (@OWNER/NAME) is not the catalog's: who reads it is decided by
        # its sharing (spawners/storage/datasets.py), not by a course's catalog limits.
        "datasets": [d for d in opts.datasets if not is_private(d)],
        "apps": [opts.app],
    }
    for section, field in LIMIT_FIELDS.items():
        allowed = limits.allowed(section, catalog)
        for slug in picked[section]:
            if slug not in allowed:
                what = section[:-1].replace("_", " ")
                return CourseRuleError(
                    field,
                    f"course {course.name} does not allow {what} {slug!r}; "
                    f"allowed: {', '.join(allowed) or 'none'}",
                )
    return None


def apply_course_rules(
    opts: ServerOptions, courses: list[Course], catalog: Catalog
) -> ServerOptions:
    """``opts`` with the course it runs under; raise :class:`CourseRuleError` when no course of
    the student allows it. A user in no course may not name one."""
    if not courses:
        if opts.course is not None:
            raise CourseRuleError("course", f"you are not a student of course {opts.course!r}")
        return opts
    by_name = {c.name: c for c in courses}
    if opts.course is not None:
        course = by_name.get(opts.course)
        if course is None:
            raise CourseRuleError(
                "course",
                f"you are not a student of course {opts.course!r}; your courses: "
                f"{', '.join(by_name)}",
            )
        error = violation(opts, course, catalog)
        if error is not None:
            raise error
        return opts
    errors = []
    for course in courses:
        error = violation(opts, course, catalog)
        if error is None:
            return opts.model_copy(update={"course": course.name})
        errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    raise CourseRuleError(
        errors[0].field,
        "none of your courses allows this server: " + "; ".join(str(e) for e in errors),
    )


def allowed_choices(courses: list[Course], catalog: Catalog) -> dict[str, list[str]] | None:
    """For the form and the home page: per limit section, the slugs any of ``courses`` allows
    (None when the user is in no course, i.e. unrestricted)."""
    if not courses:
        return None
    out: dict[str, list[str]] = {}
    for section in LIMIT_FIELDS:
        union = {s for c in courses for s in c.limits.allowed(section, catalog)}
        out[section] = [s for s in _catalog_slugs(section, catalog) if s in union]
    return out


# Who pays for the start under way on each server ((user, server name) -> "course"), set by the
# hub's start paths (hub_config/courses/staff.py ``mark_payer``) and never from a user's request:
# kept here, not on the spawner object, because JupyterHub may hand a later start a new one.
_PAYERS: dict[tuple[str, str], str] = {}


def set_payer(user: str, server: str, payer: str | None) -> None:
    """Record (``"course"``: the course's pool only) or clear who pays for ``user``'s server."""
    if payer is None:
        _PAYERS.pop((user, server), None)
    else:
        _PAYERS[(user, server)] = payer


def payer_of(user: str, server: str) -> str | None:
    """``"course"`` when the start of ``user``'s server was made by course staff, else None."""
    return _PAYERS.get((user, server))
