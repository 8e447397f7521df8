"""Cards held for an account: monthly reservations and lab-session bookings.

A hold keeps ``cards`` cards of one GPU type for one account (``user:NAME`` or ``course:NAME``)
from the moment it is made until its ``end``. Holds count cards, not particular cards: any free
card of the type will do, which keeps every node's best-fit placement working.

- Everyone else sees held cards as taken, on-demand and spot alike (so a booking made now can be
  honoured later: an on-demand server has no end time, and would still be running at class time).
- The account's own servers take the held cards from ``use_from`` (a booking: a few minutes
  before the class, when its servers are started; a reservation: its start).
- A spot server already running on cards a hold needs gets the market's usual warning: at once
  for a reservation, ``warning`` seconds before the window for a booking (see ``reclaim_from``).
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass

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
