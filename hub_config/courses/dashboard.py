"""The teacher dashboard: ``/hub/gpulab/courses`` (the courses one staffs; every course, and a
form to create one, for admins) and ``/hub/gpulab/courses/C`` (one course), HTML pages in the
hub's own look, so that nobody administers courses with curl.

A course page shows the roster (teachers, TAs, students) with a roster CSV upload for teachers,
each student's server (state, mode, GPU type and cards, course) with Open, Stop and Restart, the
credit used and left per student this period and the course's pool balance (from billing, through
:attr:`CourseDashboard.money_hook`), and the course's lab-session bookings.

The handlers are thin: they check the caller with JupyterHub's RBAC (``needs_scope`` on
``custom:gpulab:course-read!group=C``), build the page's context (:func:`page_context`, plain data)
and render ``templates/gpulab-course-dashboard.html`` (Jinja2, autoescaped) through the hub's own
template environment, so ``page.html`` (navbar, Bootstrap, ``window.jhdata`` with the XSRF
token) is JupyterHub's. Everything that changes after the page loads comes from the JSON API in
the browser (``static/dashboard.js``, inlined like the spawn form's script): the course
(``GET /hub/api/gpulab/courses/C``, every few seconds), the roster upload
(``POST .../roster``, whose per-row report the page lists), JupyterHub's own server API for Stop
and Restart, and the bookings (``GET``/``POST .../bookings``, ``DELETE .../bookings/ID`` after a
confirmation). The list page's form posts to ``POST /hub/api/gpulab/courses`` (``static/
courses.js``); the teacher is picked from the hub's users and an unknown name is the API's 400.
Who sees which form is decided in :func:`gpulab.hub_config.courses.staff.page_rights`; the APIs
check the same scopes again.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import needs_scope
from markupsafe import Markup
from tornado import web
from traitlets import Any as AnyTrait
from traitlets import Float
from traitlets.config import LoggingConfigurable

from gpulab.catalog import NO_GPU
from gpulab.hub_config.courses import groups
from gpulab.hub_config.courses.handlers import pickable_people, student_server
from gpulab.hub_config.courses.staff import page_rights
from gpulab.hub_config.scopes import COURSE_READ_SCOPE
from gpulab.spawners.courses import Course
from gpulab.spawners.node.pool import GpuPool

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")
DASHBOARD_TEMPLATE = "gpulab-course-dashboard.html"
LIST_TEMPLATE = "gpulab-course-list.html"

# What the page calls a server's state (the course API's ``state``: ready, starting, or
# JupyterHub's pending action), and the Bootstrap badge it wears.
STATE_LABELS = {
    "ready": ("running", "text-bg-success"),
    "starting": ("starting", "text-bg-warning"),
    "spawn": ("starting", "text-bg-warning"),
    "stop": ("stopping", "text-bg-secondary"),
    "stopped": ("stopped", "text-bg-light border"),
}
BILLING_OFF = "not available (billing off)"
# Billing's ``overflow`` rule, in words.
OVERFLOW_TEXT = {
    "personal": "beyond the cap, students pay from their own balance",
    "refuse": "beyond the cap, students' servers are refused",
}
BILLING_FAILED = "not available (billing did not answer)"
NO_VALUE = "—"


class CourseDashboard(LoggingConfigurable):
    """What the teacher dashboard shows besides the hub's own state."""

    money_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""A callable(course_name), possibly async, returning billing's record for the course
        (``pool.balance``, ``cap``, ``period``, ``period_start``, ``period_end``, ``overflow``,
        ``students: {name: {used, left}}``, money as ``{micro, exact, display}``), or None. None
        (the default, or a hook answering None) shows "credit: not available (billing off)".""",
    )

    money_timeout = Float(
        5.0,
        config=True,
        help="""How long the page waits for an async money_hook (seconds) before it shows the
        credit as not available.""",
    )

    refresh_seconds = Float(
        3.0,
        config=True,
        help="How often the dashboard asks the course API for its servers' state (seconds).",
    )

    async def money(self, course: str) -> tuple[dict[str, Any] | None, str]:
        """Billing's record for ``course`` and why there is none ('' when there is one)."""
        hook = self.money_hook
        if hook is None:
            return None, BILLING_OFF
        try:
            record = hook(course)
            if inspect.isawaitable(record):
                record = await asyncio.wait_for(record, self.money_timeout)
        except TimeoutError:
            self.log.warning(
                "money_hook for course %s: no answer in %ss", course, self.money_timeout
            )
            return None, BILLING_FAILED
        except Exception:
            self.log.exception("money_hook failed for course %s", course)
            return None, BILLING_FAILED
        if record is None:
            return None, BILLING_OFF
        if not isinstance(record, Mapping):
            self.log.warning("money_hook for course %s returned %r", course, type(record))
            return None, BILLING_FAILED
        return dict(record), ""


# ---- the page's context: plain data, no HTML --------------------------------------------------


def money_text(value: Any) -> str:
    """A money record (``{micro, exact, display}``) as the page shows it."""
    if value is None:
        return NO_VALUE
    if isinstance(value, Mapping):
        for key in ("display", "exact"):
            if value.get(key) not in (None, ""):
                return str(value[key])
        return NO_VALUE
    return str(value)


def credit_view(record: Mapping[str, Any] | None, reason: str = BILLING_OFF) -> dict[str, Any]:
    """Billing's course record (``GET /api/v1/courses/C``: ``pool_balance``, ``cap``,
    ``period``, ``period_start``/``period_end``, ``overflow``, ``students`` as a list of
    ``{user, used, left, personal}``) as the page shows it: texts only, every field optional."""
    if record is None:
        return {"available": False, "reason": reason or BILLING_OFF, "students": {}}
    overflow = record.get("overflow")
    students = record.get("students") if isinstance(record.get("students"), list) else []
    return {
        "available": True,
        "reason": "",
        "balance": money_text(record.get("pool_balance")),
        "cap": money_text(record["cap"]) if record.get("cap") is not None else "no cap",
        "period": str(record.get("period") or ""),
        "period_start": str(record.get("period_start") or ""),
        "period_end": str(record.get("period_end") or ""),
        "overflow": OVERFLOW_TEXT.get(str(overflow), str(overflow or "")),
        "students": {
            str(v["user"]): {
                "used": money_text(v.get("used")),
                "left": money_text(v.get("left")),
            }
            for v in students
            if isinstance(v, Mapping) and v.get("user")
        },
    }


def server_view(server: Mapping[str, Any]) -> dict[str, Any]:
    """One student's server (the course API's entry) as the page shows it."""
    state = str(server.get("state") or "stopped")
    label, badge = STATE_LABELS.get(state, (state, "text-bg-light border"))
    cards = server.get("cards") or 0
    gpu_type = server.get("gpu_type")
    return {
        "state": state,
        "label": label,
        "badge": badge,
        "url": server.get("url") or "",
        "mode": server.get("mode") or (NO_VALUE if state == "stopped" else ""),
        "gpu": f"{gpu_type} \u00d7 {cards}" if gpu_type not in (None, NO_GPU) else NO_VALUE,
        "course": server.get("course") or NO_VALUE,
    }


def page_context(
    *,
    course: Course,
    students: list[str],
    servers: Mapping[str, Mapping[str, Any]],
    credit: dict[str, Any],
    viewer: str,
    can_manage: bool,
    refresh_seconds: float = 3.0,
    bookable: list[str] = (),
    admin: bool = False,
) -> dict[str, Any]:
    """Everything ``gpulab-course-dashboard.html`` shows, from the course and billing's record."""
    missing = {"used": NO_VALUE, "left": NO_VALUE}
    rows = [
        {
            "name": name,
            "server": server_view(servers.get(name) or {"state": "stopped"}),
            "credit": credit["students"].get(name, missing),
        }
        for name in students
    ]
    return {
        "course": {
            "name": course.name,
            "title": course.title,
            "teachers": list(course.teachers),
            "tas": list(course.tas),
            "students": list(students),
        },
        "role": course.staff_role(viewer) or ("admin" if admin else "staff"),
        "can_manage": can_manage,
        "rows": rows,
        # What a row the script adds (a student the roster upload brought) starts from.
        "blank": {"server": server_view({"state": "stopped"}), "credit": missing},
        "credit": credit,
        "refresh_ms": int(refresh_seconds * 1000),
        # The GPU types the bookings form offers (the course's, without no-GPU mode).
        "bookable": [g for g in bookable if g != NO_GPU],
    }


# ---- rendering ---------------------------------------------------------------------------------


@cache
def _static(name: str) -> Markup:
    """A file of ``static/``, trusted as it is (it ships with gpulab, nobody else writes it)."""
    return Markup((STATIC / name).read_text(encoding="utf-8"))


def statics() -> dict[str, Markup]:
    return {
        "dashboard_css": _static("dashboard.css"),
        "dashboard_js": _static("dashboard.js"),
        "courses_js": _static("courses.js"),
    }


# How many user names the create form offers to pick a teacher from (a longer list is typed).
MAX_PICK_USERS = 2000


@cache
def overlay(env: Environment) -> Environment:
    """The hub's template environment with this folder's templates ahead of its own (they extend
    JupyterHub's ``page.html``), always autoescaped."""
    return env.overlay(
        loader=ChoiceLoader([FileSystemLoader(str(TEMPLATES)), env.loader]), autoescape=True
    )


class CoursePageHandler(BaseHandler):
    """What the dashboard's pages share: the templates of this folder."""

    def get_template(self, name: str, sync: bool = False) -> Any:
        env = self.settings["jinja2_env_sync" if sync else "jinja2_env"]
        return overlay(env).get_template(name)

    @property
    def dashboard(self) -> CourseDashboard:
        return CourseDashboard(config=self.settings["config"], log=self.log)


class CourseListPage(CoursePageHandler):
    """``/hub/gpulab/courses``: the courses the caller teaches or assists, linked; for admins
    every course (a course they do not staff shows "admin") and the form to create one."""

    @web.authenticated
    async def get(self) -> None:
        me = self.current_user
        rights = page_rights(self)
        mine = {c.name: (g, c, role) for g, c, role in groups.staff_courses(self.db, me.name)}
        if rights["create"]:
            for g, c in groups.all_courses(self.db):
                mine.setdefault(c.name, (g, c, "admin"))
        courses = [
            {"name": c.name, "title": c.title, "role": role, "students": len(g.users)}
            for g, c, role in (mine[k] for k in sorted(mine))
        ]
        users: list[str] = []
        if rights["create"]:
            users = pickable_people(self.db, self.authenticator, MAX_PICK_USERS)
        html = await self.render_template(
            LIST_TEMPLATE,
            courses=courses,
            can_create=rights["create"],
            users=users,
            gpu_types=list(GpuPool.instance(config=self.settings["config"]).catalog.gpu_types),
            **statics(),
        )
        self.finish(html)


class CourseDashboardPage(CoursePageHandler):
    """``/hub/gpulab/courses/C``: the course's dashboard, for its TAs and teachers."""

    @web.authenticated
    @needs_scope(COURSE_READ_SCOPE)
    async def get(self, group_name: str) -> None:
        found = groups.find(self.db, group_name)
        if found is None:
            raise web.HTTPError(404, f"No course named {group_name}")
        group, course = found
        students = groups.students(group)
        # The same per-student entry as GET /hub/api/gpulab/courses/C (it reads only self.users).
        servers = {name: student_server(self.users, name) for name in students}
        catalog = GpuPool.instance(config=self.settings["config"]).catalog
        dashboard = self.dashboard
        record, reason = await dashboard.money(course.name)
        context = page_context(
            course=course,
            students=students,
            servers=servers,
            credit=credit_view(record, reason),
            viewer=self.current_user.name,
            can_manage=page_rights(self, course.name)["manage"],
            refresh_seconds=dashboard.refresh_seconds,
            bookable=course.limits.allowed("gpu_types", catalog),
            admin=page_rights(self)["create"],
        )
        html = await self.render_template(DASHBOARD_TEMPLATE, **context, **statics())
        self.finish(html)


ROUTES = [
    (r"/gpulab/courses/?", CourseListPage),
    (r"/gpulab/courses/([^/]+)/?", CourseDashboardPage),
]
