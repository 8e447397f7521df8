"""``GET users/NAME/balance``: the balance; with ``?course=C`` also where the user stands in
course C (``course``). The user themself or an admin."""

from __future__ import annotations

from gpulab.billing_service.api.base import BaseHandler, checked_course


class BalanceHandler(BaseHandler):
    async def get(self, name: str) -> None:
        self.require_user(name)
        course = self.get_argument("course", None)
        if course is not None:
            course = checked_course(course)
        self.write_json(await self.billing.balance(name, course))
