"""Cards held for an account: monthly reservations and lab-session bookings.

A hold keeps ``cards`` cards of one GPU type for one account (``user:NAME`` or ``course:NAME``)
from its ``reclaim_from`` until its ``end``: a booking from the booking keeper's prestart plus a
margin before its window, a reservation from its month's start. Before then it holds nothing, so
a hold made far ahead denies nobody service now (it is only promised: another hold for the same
time is refused). How far ahead one may book or reserve and how many cards an account may hold
at once (:class:`HoldLimits`) are operator settings. Holds count cards, not particular cards:
any free card of the type will do, which keeps every node's best-fit placement working.

- From ``reclaim_from`` everyone else sees held cards as taken, on-demand and spot alike. An
  on-demand server started before then keeps its card (it has no end time): the hold's servers
  then get the cards that are free, and the rest as they free up.
- The account's own servers take the held cards from ``use_from`` (a booking: a few minutes
  before the class, when its servers are started; a reservation: its start).
- A spot server running on cards a hold needs gets the market's usual warning from
  ``reclaim_from``: at its month's start for a reservation, the margin before a booking's
  servers start.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from traitlets import Int
from traitlets.config import SingletonConfigurable

KINDS = ("reservation", "booking")


@dataclass
class Hold:
    hold_id: str
    kind: str  # "reservation" | "booking"
    account: str  # "user:alice" | "course:ml101"
    gpu_type: str
    cards: int
    start: float  # the window (a booking's class hours, a reservation's month)
    end: float
    use_from: float  # from when the account's servers take the held cards
    reclaim_from: float  # from when spot servers on the held cards are reclaimed
    created: float
    label: str = ""  # for people: "course ml101's lab session 14:00-14:10 UTC"

    def to_json(self) -> dict:
        return asdict(self)

    def active(self, now: float) -> bool:
        return now < self.end

    def usable(self, now: float) -> bool:
        return self.use_from <= now < self.end


def new_hold_id(kind: str) -> str:
    return f"{kind[:3]}-{uuid.uuid4().hex[:12]}"


def account_for_user(user: str) -> str:
    return f"user:{user}"


def account_for_course(course: str) -> str:
    return f"course:{course}"


def accounts_for(user: str, course: str | None) -> list[str]:
    """The accounts whose holds a server of ``user`` (under ``course``) may take cards from: the
    course's first (a lab session's cards are for its students), then the user's own."""
    return [*([account_for_course(course)] if course else []), account_for_user(user)]


class HoldLimits(SingletonConfigurable):
    """How many cards one account may hold at once (reservations and bookings together): an
    operator's setting, so that one user or one course cannot hold the whole pool."""

    max_cards_per_user = Int(
        4,
        config=True,
        help="""The most cards one user may hold at once through reservations (summed over GPU
        types, at the busiest moment of the new hold's window). 0: no limit.""",
    )
    max_cards_per_course = Int(
        32,
        config=True,
        help="""The most cards one course may hold at once through lab-session bookings and
        reservations (summed over GPU types, at the busiest moment of the new hold's window).
        0: no limit.""",
    )

    def limit_for(self, account: str) -> tuple[int, str]:
        """(the limit, the setting's name) for ``account``."""
        if account.startswith("course:"):
            return self.max_cards_per_course, "HoldLimits.max_cards_per_course"
        return self.max_cards_per_user, "HoldLimits.max_cards_per_user"

    def problem(
        self,
        holds: Iterable[Hold],
        new: Hold,
        now: float,
        use_limit: tuple[int, str] | None = None,
    ) -> str | None:
        """Why ``new`` would take its account past its limit (None: it would not).

        ``use_limit`` is (cards, why) the account can use at all, e.g. a course's number of
        students (a lab session serves one card per student): a tighter bound than the
        operator's setting, where 0 means no card at all."""
        limit, setting = self.limit_for(new.account)
        if use_limit is not None and (limit <= 0 or use_limit[0] < limit):
            limit, setting = max(use_limit[0], 0), use_limit[1]
        elif limit <= 0:
            return None
        mine = [
            (max(h.start, now), h.end, h.cards)
            for h in holds
            if h.account == new.account and h.active(now) and h.hold_id != new.hold_id
        ]
        lo = max(new.start, now)
        points = {lo, *(f for f, _, _ in mine if lo <= f < new.end)}
        peak = max((sum(n for f, e, n in mine if f <= t < e) for t in points), default=0)
        if peak + new.cards <= limit:
            return None
        return (
            f"{new.account} may hold at most {limit} card(s) at once ({setting}); it already "
            f"holds {peak} during that time, so at most {max(limit - peak, 0)} more"
        )
