"""Prepaid reservations (hybrid billing): cards of a GPU type held for one account for a window.

The hub reserves ``cards`` cards of ``gpu_type`` for [start, end) for an account: ``user:NAME``
(the user's own balance pays) or ``course:C`` (course C's credit pool pays). Billing prices it
itself, ``cards x monthly_price x (end - start) / 3600`` (the catalog's ``monthly_price`` per
card-hour; exact integers of micro-units and microseconds, rounded half-to-even once), and
charges it at once, in the transaction that records the reservation:

- ``user:NAME``: a ``reservation`` entry in the user's ledger (key ``reservation:ID``);
- ``course:C``: a ``reservation`` entry in the pool's ledger (key ``reservation:ID``).

An account that cannot pay the whole amount is refused (``PaymentRequired``) and nothing is
recorded. A reservation is idempotent by its id: the same id with the same terms is the same
reservation (charged once, however often and however concurrently it is posted); the same id with
other terms is a ``Conflict``. Reservations are never changed or refunded in this version.

Usage inside a reservation: the hub's ``server_start`` options carry ``"reservation": ID`` when
the server's cards came from that reservation (the hub's allocator guarantees it); the session
stores the tag (``server_sessions.reservation``). ``check`` believes the tag only if billing knows
that reservation (it was paid), its account is the session's (``user:NAME`` = the session's user,
``course:C`` = the session's course), its GPU type is the session's and it holds at least the
session's cards; then the session's seconds inside [start, end) are rated at 0 (``rating``), and
the rest as usual. Otherwise the tag is ignored (and logged): the session is rated normally.

The tag is looked up whenever a session is rated, so a session's charge is a function of its
events and the reservations paid, whatever their order: a reservation recorded after a session
tagged with it re-rates that session (``tagged``; the caller re-rates in the same transaction).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, select

from gpulab.billing_service import ledger
from gpulab.billing_service.models import MICRO, Reservation, ServerSession
from gpulab.billing_service.rating import (
    COURSE_RE,
    US_PER_HOUR,
    PriceBook,
    Window,
    format_money,
    from_micro,
    round_div,
    to_micro,
)
from gpulab.billing_service.sql import insert_ignore

log = logging.getLogger("gpulab.billing")

KIND = "reservation"  # the ledger kind of a prepaid charge (users' and pools' ledgers)
FIELDS = ("id", "account", "gpu_type", "cards", "start", "end")
ACCOUNT_KINDS = ("user", "course")
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_CARDS = 4096
MAX_SECONDS = 366 * 86_400  # a reservation is at most a year


class ReservationError(ValueError):
    """A bad reservation request; ``field`` names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class PaymentRequired(ReservationError):
    """The account cannot pay the whole prepaid amount (nothing was recorded)."""

    def __init__(self, message: str) -> None:
        super().__init__("balance", message)
        self.message = message


class Conflict(ValueError):
    """The reservation id was used before with other terms."""


@dataclass(frozen=True)
class Request:
    id: str
    account: str  # user:NAME or course:C
    gpu_type: str
    cards: int
    start_us: int
    end_us: int

    @property
    def kind(self) -> str:
        return self.account.split(":", 1)[0]

    @property
    def name(self) -> str:
        return self.account.split(":", 1)[1]


def parse_account(value: Any) -> tuple[str, str]:
    """``user:NAME`` or ``course:C`` as (kind, name); ReservationError naming ``account``."""
    if isinstance(value, str) and ":" in value and len(value) <= 300:
        kind, name = value.split(":", 1)
        if kind == "user" and 1 <= len(name) <= 255 and name == name.strip() and name.isprintable():
            return kind, name
        if kind == "course" and len(name) <= 64 and COURSE_RE.match(name):
            return kind, name
    raise ReservationError(
        "account",
        f"{value!r}; expected 'user:NAME' (the user's balance pays) or 'course:NAME' (the "
        "course's credit pool pays; course names are lowercase letters, digits and '-')",
    )


def _seconds(field: str, value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ReservationError(field, f"{value!r} is not a time in seconds since the Unix epoch")
    return round(Decimal(str(value)) * MICRO)


def parse(body: Any, prices: PriceBook) -> Request:
    """A POSTed reservation; ReservationError naming the first bad field (nothing is done)."""
    if not isinstance(body, dict):
        raise ReservationError("body", f"must be a JSON object with {', '.join(FIELDS)}")
    extra = sorted(set(body) - set(FIELDS))
    if extra:
        raise ReservationError(extra[0], f"unknown field; allowed: {', '.join(FIELDS)}")
    rid = body.get("id")
    if not isinstance(rid, str) or not ID_RE.match(rid):
        raise ReservationError(
            "id", f"{rid!r}; 1-128 characters: letters, digits, '.', '_', ':', '-' (e.g. 'res-1')"
        )
    parse_account(body.get("account"))
    gpu_type = body.get("gpu_type")
    allowed = reservable(prices)
    if gpu_type not in allowed:
        raise ReservationError(
            "gpu_type",
            f"{gpu_type!r} cannot be reserved; allowed (GPU types with a monthly_price): "
            f"{', '.join(allowed) or 'none'}",
        )
    cards = body.get("cards")
    if isinstance(cards, bool) or not isinstance(cards, int) or not 1 <= cards <= MAX_CARDS:
        raise ReservationError("cards", f"{cards!r}; a whole number of cards, 1 to {MAX_CARDS}")
    start_us = _seconds("start", body.get("start"))
    end_us = _seconds("end", body.get("end"))
    if end_us <= start_us:
        raise ReservationError("end", f"{body.get('end')!r} is not after start {body['start']!r}")
    if end_us - start_us > MAX_SECONDS * MICRO:
        raise ReservationError("end", f"a reservation lasts at most {MAX_SECONDS // 86_400} days")
    return Request(rid, body["account"], gpu_type, cards, start_us, end_us)


def reservable(prices: PriceBook) -> list[str]:
    """The GPU types that can be reserved: those with a catalog ``monthly_price``."""
    return sorted(
        slug for slug, gpu in prices.catalog.gpu_types.items() if gpu.monthly_price is not None
    )


def price_micro(prices: PriceBook, gpu_type: str) -> int:
    price = prices.catalog.gpu_types[gpu_type].monthly_price
    assert price is not None
    return to_micro(price)


def amount_micro(price_per_card_hour_micro: int, cards: int, start_us: int, end_us: int) -> int:
    """cards x price per card-hour x hours, exact, rounded half-to-even once to a micro-unit."""
    return round_div(price_per_card_hour_micro * cards * (end_us - start_us), US_PER_HOUR)


def shown(micro: int) -> str:
    """Money in a message: cents, unless that would hide a difference (then exact)."""
    return format_money(micro) if micro % 10_000 == 0 else str(from_micro(micro))


def same_terms(row, req: Request) -> bool:
    return (row.account, row.gpu_type, row.cards, row.start_us, row.end_us) == (
        req.account,
        req.gpu_type,
        req.cards,
        req.start_us,
        req.end_us,
    )


def get(conn: Connection, rid: str):
    return conn.execute(select(Reservation).where(Reservation.id == rid)).first()


def create(
    conn: Connection,
    prices: PriceBook,
    req: Request,
    now_us: int,
    *,
    actor: str,
    trial_micro: int,
) -> tuple[Any, bool, list[int]]:
    """Record and charge a reservation once: (its row, whether made now, the ids of sessions
    already tagged with it, which the caller re-rates in this transaction, their rows locked).

    Raises ``Conflict`` (the id has other terms) or ``PaymentRequired`` (the caller's transaction
    must then roll back: nothing stays)."""
    price = price_micro(prices, req.gpu_type)
    amount = amount_micro(price, req.cards, req.start_us, req.end_us)
    # Write first: SQLite's write lock, and on PostgreSQL a concurrent duplicate waits here
    # for this transaction and then finds the row.
    made = conn.execute(
        insert_ignore(conn, Reservation, ["id"])
        .values(
            id=req.id,
            account=req.account,
            gpu_type=req.gpu_type,
            cards=req.cards,
            start_us=req.start_us,
            end_us=req.end_us,
            price_micro=price,
            amount_micro=amount,
            created_us=now_us,
            actor=actor,
        )
        .returning(Reservation.id)
    ).scalar()
    row = get(conn, req.id)
    if made is None:
        if not same_terms(row, req):
            raise Conflict(
                f"reservation {req.id} exists with other terms: {row.cards} x {row.gpu_type} "
                f"for {row.account}, {row.start_us / MICRO:g} to {row.end_us / MICRO:g}"
            )
        return row, False, []
    # Lock what the charge and any re-rating touch, in the order ingestion does: sessions,
    # then courses, then accounts.
    q = select(ServerSession.id, ServerSession.course).where(ServerSession.reservation == req.id)
    if conn.dialect.name == "postgresql":
        q = q.order_by(ServerSession.id).with_for_update()
    tagged = conn.execute(q).all()
    names = {c for _, c in tagged if c is not None}
    if req.kind == "course":
        names.add(req.name)
    pools = [ledger.pool(name) for name in sorted(names)]
    for pool in pools:
        ledger.ensure(conn, pool, now_us)
    ledger.lock(conn, pools)
    currency = prices.catalog.currency
    what = (
        f"reservation {req.id}: {req.cards} x {req.gpu_type} for "
        f"{(req.end_us - req.start_us) / US_PER_HOUR:g} h at {currency} "
        f"{from_micro(price)}/card-hour = {currency} {shown(amount)}"
    )
    note = f"{what} ({window_text(req.start_us, req.end_us)})"
    account = ledger.AccountId(req.kind, req.name)  # type: ignore[arg-type]
    ledger.ensure(conn, account, now_us, trial_micro=trial_micro)
    try:
        # The whole amount or nothing (the account's row locked while it decides).
        ledger.pay(
            conn, account, KIND, amount, now_us, key=f"{KIND}:{req.id}", note=note, actor=actor
        )
    except ledger.InsufficientFunds as e:
        have, short = shown(e.balance_micro), shown(amount - e.balance_micro)
        if req.kind == "user":
            message = (
                f"Your balance ({currency} {have}) cannot prepay {what}; "
                f"top up {currency} {short} or reserve less."
            )
        else:
            message = (
                f"The credit pool of course {req.name} ({currency} {have}) cannot prepay "
                f"{what}; top up the pool by {currency} {short} or reserve less."
            )
        raise PaymentRequired(message) from None
    return row, True, [sid for sid, _ in tagged]


def window_text(start_us: int, end_us: int) -> str:
    def iso(t: int) -> str:
        return datetime.fromtimestamp(t / MICRO, UTC).isoformat().replace("+00:00", "Z")

    return f"{iso(start_us)} to {iso(end_us)}"


def listed(conn: Connection, account: str | None = None) -> list:
    """Reservations of ``account`` (all of them for None), oldest first."""
    q = select(Reservation).order_by(Reservation.start_us, Reservation.id)
    if account is not None:
        q = q.where(Reservation.account == account)
    return list(conn.execute(q).all())


# ---- usage inside a reservation ------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """What billing makes of a session's reservation tag."""

    id: str
    applied: bool
    reason: str  # why the tag was ignored ("" when applied)
    account: str | None = None
    window: Window | None = None  # [start, end) of the reservation, when applied

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "applied": self.applied,
            "account": self.account,
            "reason": self.reason or None,
        }


def judge(sess, row) -> Check:
    """Whether the reservation ``row`` (None: unknown) covers session ``sess``'s tag."""
    tag = sess.reservation
    if row is None:
        return Check(tag, False, f"reservation {tag} is unknown to billing (not paid)")
    kind, name = row.account.split(":", 1)
    if kind == "user" and name != sess.user:
        reason = f"reservation {tag} belongs to {row.account}, not to user {sess.user}"
    elif kind == "course" and name != sess.course:
        reason = (
            f"reservation {tag} belongs to {row.account}; the session runs under "
            f"{'course ' + sess.course if sess.course else 'no course'}"
        )
    elif row.gpu_type != sess.gpu_type:
        reason = f"reservation {tag} is for {row.gpu_type}, the session runs on {sess.gpu_type}"
    elif sess.gpus > row.cards:
        reason = f"reservation {tag} holds {row.cards} cards, the session has {sess.gpus}"
    else:
        return Check(tag, True, "", row.account, (row.start_us, row.end_us))
    return Check(tag, False, reason, row.account)


def checks(conn: Connection, sessions: Iterable) -> dict[int, Check]:
    """{session id: Check} for the sessions that carry a reservation tag."""
    tagged = [s for s in sessions if getattr(s, "reservation", None)]
    if not tagged:
        return {}
    rows = {
        r.id: r
        for r in conn.execute(
            select(Reservation).where(Reservation.id.in_(sorted({s.reservation for s in tagged})))
        ).all()
    }
    return {s.id: judge(s, rows.get(s.reservation)) for s in tagged}


def check(conn: Connection, sess) -> Check | None:
    return checks(conn, [sess]).get(sess.id)


_warned: set[tuple[int, str]] = set()


def prepaid_window(conn: Connection, sess) -> Window | None:
    """The [start, end) whose seconds of ``sess`` are prepaid, or None; a tag that is not
    believed is logged (once per session and reason in this process)."""
    found = check(conn, sess)
    if found is None:
        return None
    if not found.applied:
        key = (sess.id, found.reason)
        if key not in _warned:
            if len(_warned) > 10_000:
                _warned.clear()
            _warned.add(key)
            log.warning(
                "session %s of %s/%s: reservation tag ignored, rated normally: %s",
                sess.id,
                sess.user,
                sess.server,
                found.reason,
            )
    return found.window
