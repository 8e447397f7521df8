"""Monthly reservations: an account reserves N cards of a type for a calendar month, prepaid.

``POST /hub/api/gpulab/reservations`` with
``{"account": "user:alice" | "course:ml101", "gpu_type": "a100-80g", "cards": 2,
"month": "2026-12", "idempotency_key": "..."}``:

- who: a user for their own account (``user:NAME``), a course's teachers for the course
  (``custom:gpulab:course-manage!group=C``; the course's credit pool pays), admins for anyone;
- the cards must be promisable for the whole month (409 naming what stands in the way);
- billing charges the month at the catalog's ``monthly_price`` up front (402 when the account
  cannot pay: then nothing is held);
- from then on the cards are the account's alone (:mod:`gpulab.spawners.node.holds`): others'
  spot servers on them get the usual warning, nobody else's server takes them, and the account's
  servers run on them without further charge; servers beyond the reserved cards are billed on
  demand as usual.

The same ``idempotency_key`` again returns the same reservation (and billing charges it once).
A month already begun is reserved from now to its end (billing charges what is left of it).
``GET /hub/api/gpulab/reservations`` lists the reservations the caller may see.
"""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime
from typing import Any

from jupyterhub.scopes import needs_scope
from traitlets import Any as AnyTrait
from traitlets import Int
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.scopes import (
    COURSE_MANAGE_SCOPE,
    COURSE_READ_SCOPE,
    PREPAY_SCOPE,
    READ_POOL_SCOPE,
)
from gpulab.spawners.node.allocator import NoCapacity
from gpulab.spawners.node.holds import Hold, HoldLimits

FIELDS = ("account", "gpu_type", "cards", "month", "idempotency_key")


class ReservationsConfig(SingletonConfigurable):
    prepay_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""Async callable(body) -> (status, answer) that charges a reservation up front
        (billing's ``POST /api/v1/reservations``, idempotent by the reservation's id). None (no
        billing): reservations are held without a charge.""",
    )
    max_months_ahead = Int(
        1,
        config=True,
        help="""How many months after the current one may be reserved (1: the current or the
        next month). A reservation holds its cards only within its month.""",
    )


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def month_window(month: Any, now: float, ahead: int) -> tuple[float, float]:
    """[start, end) of ``month`` ("YYYY-MM"), from ``now`` when it has begun; ValueError names
    what is wrong."""
    try:
        year, mon = (int(x) for x in str(month).split("-"))
        first = datetime(year, mon, 1, tzinfo=UTC)
    except (TypeError, ValueError):
        raise ValueError(f"must be a month like 2026-12, not {month!r}") from None
    nxt = datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=UTC)
    today = datetime.fromtimestamp(now, UTC)
    months_ahead = (year - today.year) * 12 + (mon - today.month)
    if nxt.timestamp() <= now:
        raise ValueError(f"{month} is over")
    if months_ahead > ahead:
        raise ValueError(
            f"at most {ahead} months ahead may be reserved (ReservationsConfig.max_months_ahead: "
            f"the current month and {ahead} after it)"
        )
    # Whole seconds: billing charges from exactly the second the reservation says.
    return max(first.timestamp(), float(int(now))), nxt.timestamp()


def reservation_json(hold: Hold, used: int, charge: dict[str, Any] | None = None) -> dict:
    out = {
        "id": hold.hold_id,
        "account": hold.account,
        "gpu_type": hold.gpu_type,
        "cards": hold.cards,
        "cards_in_use": used,
        "start": _iso(hold.start),
        "end": _iso(hold.end),
        "label": hold.label,
    }
    if charge is not None:
        out["charge"] = charge
    return out


class ReservationsAPIHandler(GpulabAPIHandler):
    @property
    def reservations_config(self) -> ReservationsConfig:
        return ReservationsConfig.instance(config=self.settings["config"])

    def fail(self, status: int, field: str, message: str) -> None:
        self.set_status(status)
        self.finish(
            json.dumps({"status": status, "field": field, "message": f"{field}: {message}"})
        )

    def may_use(self, account: str, *, manage: bool) -> bool:
        kind, _, name = account.partition(":")
        if kind == "user":
            me = self.current_user
            mine = getattr(me, "kind", "") == "user" and me.name == name
            return mine or self.has_scope("admin:users")
        scope = COURSE_MANAGE_SCOPE if manage else COURSE_READ_SCOPE
        return self.has_scope(f"{scope}!group={name}")

    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        alloc = self.pool.allocator
        out = [
            reservation_json(h, alloc.hold_used(h.hold_id))
            for h in sorted(alloc.holds, key=lambda h: h.start)
            if h.kind == "reservation" and self.may_use(h.account, manage=False)
        ]
        self.write(json.dumps({"reservations": out}))

    # Held as !user (or unfiltered by operators): which accounts is may_use's to decide.
    @needs_scope(PREPAY_SCOPE, post_filter=True)
    async def post(self) -> None:
        body = self.json_object_body()
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            return self.fail(400, unknown[0], f"unknown field; allowed: {', '.join(FIELDS)}")
        account = body.get("account")
        kind, _, name = str(account or "").partition(":")
        if kind not in ("user", "course") or not name:
            return self.fail(400, "account", f"must be user:NAME or course:NAME, not {account!r}")
        if not self.may_use(account, manage=True):
            return self.fail(
                403,
                "account",
                "you may reserve for yourself (user:YOUR-NAME) or for a course you teach",
            )
        catalog = self.pool.catalog
        sold = [s for s, g in catalog.gpu_types.items() if g.monthly_price is not None]
        gpu_type = body.get("gpu_type")
        if gpu_type not in sold:
            return self.fail(
                400,
                "gpu_type",
                f"{gpu_type!r} is not reserved by the month; allowed: {', '.join(sold)}",
            )
        cards = body.get("cards")
        if isinstance(cards, bool) or not isinstance(cards, int) or cards < 1:
            return self.fail(400, "cards", f"must be a whole number of at least 1, not {cards!r}")
        key = body.get("idempotency_key")
        if not isinstance(key, str) or not 8 <= len(key) <= 200:
            return self.fail(400, "idempotency_key", "a string of 8 to 200 characters is required")
        now = time.time()
        try:
            start, end = month_window(
                body.get("month"), now, self.reservations_config.max_months_ahead
            )
        except ValueError as e:
            return self.fail(400, "month", str(e))
        hold_id = "res-" + hashlib.sha256(f"{account}\n{key}".encode()).hexdigest()[:16]
        alloc = self.pool.allocator
        hold = next((h for h in alloc.holds if h.hold_id == hold_id), None)
        created = hold is None
        if hold is None:
            hold = Hold(
                hold_id=hold_id,
                kind="reservation",
                account=account,
                gpu_type=gpu_type,
                cards=cards,
                start=start,
                end=end,
                use_from=start,
                reclaim_from=start,
                created=now,
                label=f"{account}'s reservation of {cards} {gpu_type} for {body['month']}",
            )
            limits = HoldLimits.instance(config=self.settings["config"])
            try:
                # Held before it is charged: a hub that dies in between finds the hold at start
                # and has billing confirm it (the same id is charged once) or drops it.
                alloc.add_hold(hold, lambda holds, h: limits.problem(holds, h, now))
            except NoCapacity as e:
                return self.fail(409, "cards", str(e))
        charge = None
        hook = self.reservations_config.prepay_hook
        if hook is not None:
            status, charge = await hook(prepay_body(hold))
            if status >= 300:
                if created:
                    alloc.drop_hold(hold_id)
                self.set_status(status)
                return self.finish(json.dumps({"status": status, **charge}))
        self.log.info("Reserved %s: %s", hold_id, hold.label)
        self.set_status(201 if created else 200)
        self.write(json.dumps(reservation_json(hold, alloc.hold_used(hold_id), charge)))


def prepay_body(hold: Hold) -> dict[str, Any]:
    return {
        "id": hold.hold_id,
        "account": hold.account,
        "gpu_type": hold.gpu_type,
        "cards": hold.cards,
        "start": hold.start,
        "end": hold.end,
    }


async def confirm_reservations(pool: Any, hook: Any, log: Any) -> None:
    """At hub start: have billing confirm every reservation held (idempotent by id), dropping a
    hold billing will not charge (the hub died between holding and charging, and the account
    can no longer pay)."""
    if hook is None:
        return
    for hold in [h for h in pool.allocator.holds if h.kind == "reservation"]:
        if not hold.active(time.time()):
            pool.allocator.drop_hold(hold.hold_id)
            continue
        status, answer = await hook(prepay_body(hold))
        if status in (400, 402, 409):
            log.warning(
                "Reservation %s not charged (%s): dropped. %s", hold.hold_id, status, answer
            )
            pool.allocator.drop_hold(hold.hold_id)
        elif status >= 300:
            log.warning("Reservation %s: billing not asked yet (%s)", hold.hold_id, status)


ROUTES = [(r"/api/gpulab/reservations", ReservationsAPIHandler)]
