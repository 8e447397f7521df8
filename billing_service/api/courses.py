"""``courses/C``: a course's settings, pool and students (GET: admins and the course's staff);
its cap and rules (PUT: admins and its teachers)."""

from __future__ import annotations

from gpulab.billing_service import courses
from gpulab.billing_service.api.base import (
    COURSE_MANAGE_SCOPE,
    COURSE_READ_SCOPE,
    BaseHandler,
    FieldError,
    checked_course,
)


class CourseHandler(BaseHandler):
    async def get(self, course: str) -> None:
        course = checked_course(course)
        # Teachers (course-manage) may read what they manage.
        self.require_course(course, COURSE_MANAGE_SCOPE, COURSE_READ_SCOPE)
        self.write_json(await self.billing.read(self.billing.course_info, course))

    async def put(self, course: str) -> None:
        course = checked_course(course)
        self.require_course(course, COURSE_MANAGE_SCOPE)
        body = self.json_body()
        try:
            await self.billing.run_db(self.billing.set_course, course, body, self.model["name"])
        except courses.SettingsError as e:
            raise FieldError.of(e) from None
        self.write_json(await self.billing.read(self.billing.course_info, course))
