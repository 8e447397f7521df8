"""``GET users/NAME/balance``: the balance; with ``?course=C`` also where the user stands in
course C (``course``). The user themself or an admin; ``?course=C`` for the user only when they
have run a server under C (a course's pool and rules are not anyone's to read), for its staff and
admins always."""

from __future__ import annotations

from gpulab.billing_service.api.base import (
    COURSE_MANAGE_SCOPE,
    COURSE_READ_SCOPE,
    BaseHandler,
    checked_course,
)


class BalanceHandler(BaseHandler):
    async def get(self, name: str) -> None:
        self.require_user(name)
        course = self.get_argument("course", None)
        staff = False
        if course is not None:
            course = checked_course(course)
            staff = self.is_admin() or self.is_course_staff(
                course, COURSE_READ_SCOPE, COURSE_MANAGE_SCOPE
            )
        self.write_json(await self.billing.balance(name, course, participant_only=not staff))
