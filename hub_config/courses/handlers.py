"""``/hub/api/gpulab/courses``: create courses, import rosters, read a course's servers.

- ``GET  /courses``: the courses the caller may see (all with ``admin:groups``; else those they
  study, teach or assist), each with the caller's role in it.
- ``POST /courses`` (``admin:groups``): create a course: name, display name, teachers, TAs, limits.
- ``GET  /courses/C`` (``custom:gpulab:course-read!group=C``: its TAs and teachers): the course,
  and per student their server (ready or not, what it runs, the cards it holds).
- ``PATCH /courses/C`` (``custom:gpulab:course-manage!group=C``: its teachers): display name and
  limits; changing the teachers needs ``admin:groups``.
- ``POST /courses/C/roster`` (course-manage): a roster CSV (``username,role``), all or nothing;
  the answer's ``report`` says per row what happened (new account, invitation sent to an existing
  user, already a member, added, role changed).
- ``DELETE /courses/C/members/NAME`` (course-manage): take someone off the course.
- ``POST /courses/C/join`` and ``POST /courses/C/decline``: the caller accepts or declines their
  own invitation to C (nobody else's: the handlers act on the caller's name only).

A course's teachers and TAs (create, PATCH) are chosen from the hub's existing users: an unknown
name is a 400 naming the field, never a new account (a typo would otherwise make one).

Errors are JSON ``{"status", "message", "field"}``; a refused request changes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import needs_scope
from pydantic import BaseModel, ConfigDict, ValidationError
from tornado import web

from gpulab.hub_config.courses import groups
from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.roster import USERNAME_RE, parse_roster
from gpulab.hub_config.courses.staff import enrols_directly, taught_students
from gpulab.hub_config.scopes import COURSE_MANAGE_SCOPE, COURSE_READ_SCOPE
from gpulab.spawners.courses import Course, CourseLimits, student_courses
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.options import COURSE_RE


class NewCourse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    display_name: str = ""
    teachers: list[str] = []
    tas: list[str] = []
    limits: CourseLimits = CourseLimits()


class CourseChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    display_name: str | None = None
    teachers: list[str] | None = None
    tas: list[str] | None = None
    limits: CourseLimits | None = None


def _first_error(e: ValidationError, allowed: list[str]) -> CourseError:
    err = e.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "body"
    if err["type"] == "extra_forbidden":
        return CourseError(400, field, f"unknown field; allowed: {', '.join(allowed)}")
    return CourseError(400, field, err["msg"].removeprefix("Value error, "))


# What a roster row did, in the words the dashboard shows (the report's ``outcome``).
OUTCOMES = {
    "new": "new account",
    "invited": "invitation sent (existing user; they accept on their home page)",
    "member": "already a member",
    "added": "added (existing user)",
    "role": "role changed",
}


def roster_report(
    rows: list[Any], course: Course, members: set[str], invited: set[str], exists: Any
) -> list[dict[str, Any]]:
    """Per roster row, what importing it does (read before anything changes): ``outcome`` is a
    key of :data:`OUTCOMES` and ``message`` its words."""
    out = []
    for r in rows:
        now = course.staff_role(r.username) or ("student" if r.username in members else None)
        if r.username in invited:
            outcome = "invited"
        elif now == r.role:
            outcome = "member"
        elif now is not None:
            outcome = "role"
        elif not exists(r.username):
            outcome = "new"
        else:
            outcome = "added"
        out.append(
            {
                "line": r.line,
                "username": r.username,
                "role": r.role,
                "outcome": outcome,
                "message": OUTCOMES[outcome],
            }
        )
    return out


def _approved_signup(authenticator: Any, name: str) -> bool | None:
    """Whether ``name`` signed up and was approved (None: they did not sign up, or the
    authenticator has no sign-ups)."""
    get = getattr(authenticator, "get_user", None)
    info = get(name) if callable(get) else None
    return None if info is None else bool(getattr(info, "is_authorized", False))


def has_account(db: Any, authenticator: Any, name: str) -> bool:
    """Does ``name`` have an account of their own: a hub user, or a sign-up (approved or not,
    logged in or not)? A roster row naming them is then an invitation, not an enrolment."""
    return orm.User.find(db, name) is not None or _approved_signup(authenticator, name) is not None


def person_problem(db: Any, authenticator: Any, name: str) -> str | None:
    """Why ``name`` cannot be made course staff (None: they can): staff are people the hub
    knows, a user or an approved sign-up, never an account made from a typo."""
    if orm.User.find(db, name) is not None:
        return None
    approved = _approved_signup(authenticator, name)
    if approved:
        return None
    if approved is False:
        return (
            f"{name!r} signed up and waits for an admin's approval; approve them "
            "(Authorize users) first."
        )
    return (
        f"{name!r} is not a user of this hub; choose course staff from existing users (they "
        "sign up or are added by an admin first)."
    )


def pickable_people(db: Any, authenticator: Any, limit: int) -> list[str]:
    """The names the create-course form offers as teachers: the hub's users and approved
    sign-ups, sorted, at most ``limit``."""
    names = {n for (n,) in db.query(orm.User.name).order_by(orm.User.name).limit(limit)}
    get_authed = getattr(authenticator, "get_authed_users", None)
    if callable(get_authed):
        names |= {n for n in get_authed() if isinstance(n, str)}
    return sorted(names)[:limit]


def me_name(handler: Any) -> str:
    return getattr(handler.current_user, "name", "")


def student_server(users: Any, name: str) -> dict[str, Any]:
    """A student's default server as course staff see it (the hub's ``users`` registry)."""
    user = users.get(name) if hasattr(users, "get") else None
    spawner = user.spawners.get("") if user is not None else None
    if spawner is None or not (spawner.active or spawner.pending):
        return {"state": "stopped"}
    opts = getattr(spawner, "gpulab_options", None)
    alloc = getattr(spawner, "allocation", None)
    return {
        "state": spawner.pending or ("ready" if spawner.ready else "starting"),
        "url": user.server_url("") if spawner.ready else None,
        "mode": getattr(spawner, "mode_label", "") or "",
        "gpu_type": opts.gpu if opts is not None else None,
        "cards": len(alloc.uuids) if alloc is not None else 0,
        "course": opts.course if opts is not None else None,
        "pricing": opts.pricing if opts is not None else None,
    }


class CourseAPIHandler(APIHandler):
    """What the course handlers share: errors with a field, users made through the hub."""

    @property
    def pool(self) -> GpuPool:
        return GpuPool.instance(config=self.settings["config"])

    def json_object_body(self) -> dict:
        body = self.get_json_body()
        if not isinstance(body, dict):
            raise CourseError(400, "body", "must be a JSON object")
        return body

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, CourseError):
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"status": exc.status, "message": str(exc), "field": exc.field}))
            return
        super().write_error(status_code, **kwargs)

    def send_error(self, status_code: int = 500, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, CourseError):
            status_code = exc.status
        super().send_error(status_code, **kwargs)

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, CourseError):
            self.log.warning("%s %s: %s", self.request.method, self.request.path, value)
            return
        super().log_exception(typ, value, tb)

    def make_user(self, name: str) -> Any:
        """The ORM user ``name``, created through the hub (default roles and all) if new."""
        if not USERNAME_RE.match(name) or not self.authenticator.validate_username(name):
            raise CourseError(400, "username", f"{name!r} is not a valid username")
        return self.user_from_username(name).orm_user

    def course(self, name: str) -> tuple[Any, Course]:
        found = groups.find(self.db, name)
        if found is None:
            raise CourseError(404, "course", f"no course named {name!r}")
        return found

    def check_people(self, names: list[str], field: str) -> None:
        """Staff named by create/PATCH: valid names of users the hub has (400 naming ``field``
        otherwise). Nobody is created here: a typo in a teacher's name is an error."""
        for name in names:
            if not USERNAME_RE.match(name) or not self.authenticator.validate_username(name):
                raise CourseError(400, field, f"{name!r} is not a valid username")
            problem = person_problem(self.db, self.authenticator, name)
            if problem is not None:
                raise CourseError(400, field, problem)

    def existing_user(self, name: str) -> Any:
        """The ORM user ``name``: a hub user, or an approved sign-up who has not logged in yet
        (made now, as their first log-in would). Nobody else (checked by :meth:`check_people`)."""
        problem = person_problem(self.db, self.authenticator, name)
        if problem is not None:
            raise CourseError(400, "username", problem)
        return self.make_user(name)

    def check_limits(self, limits: CourseLimits) -> None:
        try:
            limits.check(self.pool.catalog)
        except ValueError as e:
            field, _, message = str(e).partition(": ")
            raise CourseError(400, field, message) from None

    def course_json(self, group: Any, course: Course) -> dict[str, Any]:
        return {
            "name": course.name,
            "display_name": course.title,
            "teachers": list(course.teachers),
            "tas": list(course.tas),
            "students": groups.students(group),
            "invited": list(course.invited),
            "limits": {
                section: course.limits.allowed(section, self.pool.catalog)
                for section in ("gpu_types", "images", "datasets", "apps")
            },
        }

    def server_json(self, name: str) -> dict[str, Any]:
        return student_server(self.users, name)


class CoursesAPIHandler(CourseAPIHandler):
    def get(self) -> None:
        me = self.current_user
        if me is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if self.has_scope("admin:groups"):
            listed = [(g, c, "admin") for g, c in groups.all_courses(self.db)]
        else:
            name = getattr(me, "name", "")
            mine = {c.name: (g, c, role) for g, c, role in groups.staff_courses(self.db, name)}
            user = self.find_user(name) if getattr(me, "kind", "") == "user" else None
            for c in student_courses(user.orm_user) if user is not None else []:
                found = groups.find(self.db, c.name)
                if found is not None and c.name not in mine:
                    mine[c.name] = (*found, "student")
            for group, course in groups.all_courses(self.db):
                if name in course.invited and course.name not in mine:
                    mine[course.name] = (group, course, "invited")
            listed = [mine[k] for k in sorted(mine)]
        out = []
        for group, course, role in listed:
            entry = {"name": course.name, "display_name": course.title, "role": role}
            if role == "invited":
                entry["invited_as"] = course.invited_as(getattr(me, "name", ""))
            if role != "student":
                entry["students"] = len(group.users)
            out.append(entry)
        self.write(json.dumps({"courses": out}))

    @needs_scope("admin:groups")
    def post(self) -> None:
        try:
            new = NewCourse.model_validate(self.json_object_body())
        except ValidationError as e:
            raise _first_error(e, list(NewCourse.model_fields)) from None
        if not COURSE_RE.match(new.name) or len(new.name) > 40:
            raise CourseError(
                400,
                "name",
                f"{new.name!r}: a course name is up to 40 lowercase letters, digits and '-' "
                "(e.g. ml101)",
            )
        self.check_people(new.teachers, "teachers")
        self.check_people(new.tas, "tas")
        self.check_limits(new.limits)
        course = Course(
            name=new.name,
            display_name=new.display_name,
            teachers=tuple(dict.fromkeys(new.teachers)),
            tas=tuple(n for n in dict.fromkeys(new.tas) if n not in new.teachers),
            limits=new.limits,
        )
        group = groups.save(self.db, course, self.existing_user, create=True)
        self.log.info("Course %s created by %s", course.name, self.current_user.name)
        self.set_status(201)
        self.write(json.dumps(self.course_json(group, course)))


class CourseAPIItemHandler(CourseAPIHandler):
    @needs_scope(COURSE_READ_SCOPE)
    def get(self, group_name: str) -> None:
        group, course = self.course(group_name)
        out = self.course_json(group, course)
        out["servers"] = {name: self.server_json(name) for name in out["students"]}
        self.write(json.dumps(out))

    @needs_scope(COURSE_MANAGE_SCOPE)
    def patch(self, group_name: str) -> None:
        group, course = self.course(group_name)
        try:
            change = CourseChange.model_validate(self.json_object_body())
        except ValidationError as e:
            raise _first_error(e, list(CourseChange.model_fields)) from None
        update: dict[str, Any] = {}
        if change.display_name is not None:
            update["display_name"] = change.display_name
        if change.limits is not None:
            self.check_limits(change.limits)
            update["limits"] = change.limits
        for field in ("teachers", "tas"):
            people = getattr(change, field)
            if people is None:
                continue
            if field == "teachers" and not self.has_scope("admin:groups"):
                raise CourseError(
                    403, "teachers", "only an admin (admin:groups) changes a course's teachers"
                )
            self.check_people(people, field)
            enrolled = sorted(set(people) & set(groups.students(group)))
            if enrolled and not self.has_scope("admin:groups"):
                raise CourseError(
                    403,
                    field,
                    f"{', '.join(enrolled)} take course {course.name} as students; a course's "
                    "staff cannot be its students, and only an admin (admin:groups) changes "
                    "someone's role in a course",
                )
            update[field] = tuple(dict.fromkeys(people))
        updated = course.model_copy(update=update)
        groups.save(self.db, updated, self.existing_user)
        self.write(json.dumps(self.course_json(group, updated)))


class RosterAPIHandler(CourseAPIHandler):
    @needs_scope(COURSE_MANAGE_SCOPE)
    def post(self, group_name: str) -> None:
        group, course = self.course(group_name)
        text = self.request.body.decode("utf-8", errors="replace")
        auth = self.authenticator
        rows = parse_roster(text, auth.normalize_username, auth.validate_username)
        me = me_name(self)
        members = set(groups.students(group))
        admin = self.has_scope("admin:groups")
        for row in rows:
            # Nobody enrols themselves: a teacher naming themselves as a student would make the
            # course's pool pay for their own work.
            if row.username == me:
                raise CourseError(
                    400,
                    f"roster line {row.line}: username",
                    f"{row.username!r} is you; nobody changes their own place in a course "
                    "through a roster (ask an admin)",
                )
            if admin:
                continue
            now = course.staff_role(row.username) or (
                "student" if row.username in members else None
            )
            if now is not None and now != row.role:
                raise CourseError(
                    403,
                    f"roster line {row.line}: role",
                    f"{row.username!r} is a {now} of course {course.name}; only an admin "
                    "(admin:groups) changes someone's role in a course",
                )
        if not admin:
            for row in rows:
                if row.role == "teacher" and row.username not in course.teachers:
                    raise CourseError(
                        403,
                        f"roster line {row.line}: role",
                        "only an admin (admin:groups) adds teachers; use ta or student",
                    )
        before = set(groups.students(group)) | set(course.teachers) | set(course.tas)
        # A student or TA row naming someone the hub already has (and who is not in this course
        # yet) is an invitation they accept: the course's staff would otherwise reach their
        # server and files without their say, and a TA would get power over the students'
        # servers and the course pool without being asked. The enrol rule (courses/staff.py) says who adds them
        # directly instead: an admin, or a teacher who already TEACHES them elsewhere.
        taught = None if self.has_scope("admin:groups") else taught_students(self.db, me_name(self))

        def exists(name: str) -> bool:
            return has_account(self.db, auth, name)

        invite = [
            r.username
            for r in rows
            if r.role in ("student", "ta")
            and r.username not in before
            and not enrols_directly(self, r.username, taught)
            and exists(r.username)
        ]
        rows_now = [(r.username, r.role) for r in rows if r.username not in invite]
        report = roster_report(rows, course, members, set(invite), exists)
        updated = groups.add_members(self.db, group, course, rows_now, self.make_user)
        if invite:
            tas = [r.username for r in rows if r.role == "ta" and r.username in invite]
            updated = groups.invite(self.db, group, updated, invite, tas)
        added = [name for name, _ in rows_now if name not in before]
        self.log.info(
            "Roster of %s: %d rows, %d new, %d invited", course.name, len(rows), len(added),
            len(invite),
        )  # fmt: skip
        self.write(
            json.dumps(
                {
                    "rows": len(rows),
                    "added": added,
                    "invited": invite,
                    "report": report,
                    "course": self.course_json(group, updated),
                }
            )
        )


class JoinAPIHandler(CourseAPIHandler):
    """``POST /courses/C/join``: the caller accepts their invitation to C."""

    def post(self, group_name: str) -> None:
        me = self.current_user
        if me is None or getattr(me, "kind", "") != "user":
            raise web.HTTPError(403, "Missing or invalid credentials.")
        group, course = self.course_for_invitee(group_name, me.name)
        role = course.invited_as(me.name)
        updated = groups.accept(self.db, group, course, me.name, self.make_user)
        self.write(json.dumps({"course": updated.name, "role": role}))

    def course_for_invitee(self, name: str, user: str) -> tuple[Any, Course]:
        found = groups.find(self.db, name)
        if found is None or user not in found[1].invited:
            raise CourseError(404, "course", f"no invitation to course {name!r} for {user}")
        return found


class DeclineAPIHandler(JoinAPIHandler):
    """``POST /courses/C/decline``: the caller declines their invitation to C."""

    def post(self, group_name: str) -> None:
        me = self.current_user
        if me is None or getattr(me, "kind", "") != "user":
            raise web.HTTPError(403, "Missing or invalid credentials.")
        group, course = self.course_for_invitee(group_name, me.name)
        groups.remove_member(self.db, group, course, me.name)
        self.write(json.dumps({"course": course.name, "role": None}))


class MemberAPIHandler(CourseAPIHandler):
    @needs_scope(COURSE_MANAGE_SCOPE)
    def delete(self, group_name: str, member: str) -> None:
        group, course = self.course(group_name)
        if member in course.teachers and not self.has_scope("admin:groups"):
            raise CourseError(403, "user", "only an admin (admin:groups) removes a teacher")
        groups.remove_member(self.db, group, course, member)
        self.set_status(204)


ROUTES = [
    (r"/api/gpulab/courses", CoursesAPIHandler),
    (r"/api/gpulab/courses/([^/]+)", CourseAPIItemHandler),
    (r"/api/gpulab/courses/([^/]+)/roster", RosterAPIHandler),
    (r"/api/gpulab/courses/([^/]+)/members/([^/]+)", MemberAPIHandler),
    (r"/api/gpulab/courses/([^/]+)/join", JoinAPIHandler),
    (r"/api/gpulab/courses/([^/]+)/decline", DeclineAPIHandler),
]
