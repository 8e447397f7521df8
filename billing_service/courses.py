"""Classroom money: a course's credit pool, its per-student cap per period, and who pays what.

A course is a JupyterHub group (e.g. ``ml101``). A server started with the spawn option
``course`` (reported by the hub with ``server_start``; a reporter can never name one) is a
*course session*: rated at the catalog's education price when on-demand (``rating``), and paid
as follows.

- **Pool first, up to the cap.** The charge for the seconds that fall in one period (a week:
  Monday 00:00 UTC to the next; the term: ``term_start`` 00:00 UTC to the end of ``term_end``,
  UTC) is paid from the course's pool as far as the student's cap for that period still reaches
  (the cap counts what the pool paid for that student's course sessions in that period), and as
  far as the pool's balance reaches (a pool never goes below zero by paying).
- **The rest is the student's own.** Whatever the pool does not pay (beyond the cap, beyond the
  pool's balance, seconds outside the term) is charged to the student's own balance, whatever
  ``overflow`` says: with ``overflow = "refuse"`` the hub refuses starts once the cap is used up
  and the enforcer stops the student's running course servers when what is left of the cap cannot
  pay ``switch_margin`` more seconds, so the student pays only the seconds between the cap being
  reached and the stop (normally none: the stop comes ``switch_margin`` before the cap). The
  pool never pays beyond the cap: its margin is zero.
- **Staff-started sessions are the pool's alone.** A session the hub reports with
  ``paid_by = "course"`` (its server was started by the course's staff, not by the student) never
  charges the student's own balance: what the pool does not pay within the cap is charged to the
  pool too (the enforcer stops such a session as under ``overflow = "refuse"``, so that is at
  most the seconds between the cap or pool running out and the stop).
- **A lower charge is refunded** to whoever paid last: the student's share first, then the pool.
- **Settings are read when a session is re-rated**: a changed cap applies to what is charged
  from then on (what the pool already paid stays paid); a changed period (or term) re-splits a
  session charged afterwards under the new periods: its old split is refunded as above and
  allocated again.

Money is never lost or counted twice: a session's charge is ``sum(amount_micro)`` of its
``course_charges`` rows, each split into ``course_micro + personal_micro``; the pool's ledger
holds ``-course_micro`` and the student's ledger ``-personal_micro`` for it, posted in the same
transaction. All splits of one course happen with the course's row locked (PostgreSQL ``FOR
UPDATE``; SQLite has one writer), so two servers of one student never pass the cap together.

The pool is the ledger's account ``course:C`` (``ledger``: one post and credit path, one set of
rules for users and pools; its rows stay in ``courses`` and ``course_ledger``). A user named e.g.
``course:ml101`` is the account ``user:course:ml101`` and has nothing of the pool.

A course's prepaid reservations (``reservations``, account ``course:C``) are paid from the pool
when made (its ledger's kind ``reservation``). A course session's seconds inside the paid
reservation it runs on are rated at 0, so they take nothing from the pool and count towards no
cap; only its other seconds are split here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import Connection, func, select, update

from gpulab.billing_service import ledger
from gpulab.billing_service.models import (
    MICRO,
    Course,
    CourseCharge,
    ServerSession,
)
from gpulab.billing_service.rating import (
    COURSE_RE,
    OUTSIDE,
    Charge,
    paid_by_course,
    to_micro,
)
from gpulab.billing_service.sql import insert_ignore

PERIODS = ("week", "term")
OVERFLOWS = ("personal", "refuse")
SETTINGS_FIELDS = ("cap", "period", "term_start", "term_end", "overflow")
DAY_US = 86_400 * MICRO
WEEK_US = 7 * DAY_US
# The Unix epoch was a Thursday: weeks start 3 days before a multiple of 7 days (1969-12-29).
MONDAY_OFFSET_US = -3 * DAY_US
MAX_CAP_MICRO = 10**15  # a billion currency units: beyond any budget, within BigInteger


class SettingsError(ValueError):
    """A bad course setting; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_name(course: Any) -> str:
    if not isinstance(course, str) or len(course) > 64 or not COURSE_RE.match(course):
        raise SettingsError(
            "course",
            f"{course!r} is not a course name (lowercase letters, digits and '-', e.g. 'ml101')",
        )
    return course


def midnight_us(d: date) -> int:
    return int(datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()) * MICRO


def week_start(t_us: int) -> int:
    """Monday 00:00 UTC at or before ``t_us``."""
    return (t_us - MONDAY_OFFSET_US) // WEEK_US * WEEK_US + MONDAY_OFFSET_US


@dataclass(frozen=True)
class Settings:
    cap_micro: int = 0
    period: str = "week"
    term_start: date | None = None
    term_end: date | None = None  # inclusive
    overflow: str = "personal"

    @classmethod
    def of(cls, row) -> Settings:
        if row is None:
            return cls()
        return cls(
            row.cap_micro,
            row.period,
            date.fromisoformat(row.term_start) if row.term_start else None,
            date.fromisoformat(row.term_end) if row.term_end else None,
            row.overflow,
        )

    def term_us(self) -> tuple[int, int]:
        assert self.term_start is not None and self.term_end is not None
        return midnight_us(self.term_start), midnight_us(self.term_end + timedelta(days=1))

    def period_at(self, t_us: int) -> tuple[int, int] | None:
        """The period [start, end) that ``t_us`` falls in; None outside every period."""
        if self.period == "week":
            start = week_start(t_us)
            return start, start + WEEK_US
        lo, hi = self.term_us()
        return (lo, hi) if lo <= t_us < hi else None

    def cut(self, intervals: Iterable[tuple[int, int]]) -> dict[int, tuple[int, list]]:
        """Intervals cut at period boundaries: {period start (or OUTSIDE): (period end, pieces)}."""
        out: dict[int, tuple[int, list]] = {}
        for a, b in intervals:
            while a < b:
                period = self.period_at(a)
                if period is None:
                    if self.period == "term":
                        lo = self.term_us()[0]
                        end = min(b, lo) if a < lo else b
                    else:  # pragma: no cover - weeks cover all time
                        end = b
                    key, period_end = OUTSIDE, 0
                else:
                    key, period_end = period
                    end = min(b, period_end)
                out.setdefault(key, (period_end, []))[1].append((a, end))
                a = end
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "term_start": self.term_start.isoformat() if self.term_start else None,
            "term_end": self.term_end.isoformat() if self.term_end else None,
            "overflow": self.overflow,
        }


def _date(field: str, value: Any) -> date | None:
    if value is None:
        return None
    if isinstance(value, str) and len(value) == 10:
        try:
            return date.fromisoformat(value)
        except ValueError:
            pass
    raise SettingsError(field, f"{value!r} is not a date YYYY-MM-DD (or null)")


def parse_settings(body: Any, current: Settings) -> Settings:
    """``current`` with the fields of a PUT body applied; raises SettingsError naming the first
    bad field (nothing is applied then)."""
    if not isinstance(body, dict) or not body:
        raise SettingsError(
            "body", f"must be a JSON object with any of: {', '.join(SETTINGS_FIELDS)}"
        )
    extra = sorted(set(body) - set(SETTINGS_FIELDS))
    if extra:
        raise SettingsError(extra[0], f"unknown field; allowed: {', '.join(SETTINGS_FIELDS)}")
    new = current
    if "cap" in body:
        raw = body["cap"]
        try:
            if isinstance(raw, bool) or not isinstance(raw, str | int):
                raise InvalidOperation
            cap = to_micro(Decimal(str(raw)))
        except (InvalidOperation, ValueError):
            raise SettingsError(
                "cap",
                f'{raw!r} is not an amount: a decimal string >= 0 with at most 6 decimals, e.g. "5.00"',
            ) from None
        if cap < 0 or cap > MAX_CAP_MICRO:
            raise SettingsError("cap", f'{raw!r}: the cap per student must be >= 0 (e.g. "5.00")')
        new = replace(new, cap_micro=cap)
    if "period" in body:
        if body["period"] not in PERIODS:
            raise SettingsError("period", f"{body['period']!r}; allowed: {', '.join(PERIODS)}")
        new = replace(new, period=body["period"])
    if "term_start" in body:
        new = replace(new, term_start=_date("term_start", body["term_start"]))
    if "term_end" in body:
        new = replace(new, term_end=_date("term_end", body["term_end"]))
    if "overflow" in body:
        if body["overflow"] not in OVERFLOWS:
            raise SettingsError(
                "overflow", f"{body['overflow']!r}; allowed: {', '.join(OVERFLOWS)}"
            )
        new = replace(new, overflow=body["overflow"])
    if new.period == "term":
        for field in ("term_start", "term_end"):
            if getattr(new, field) is None:
                raise SettingsError(field, 'required with "period": "term" (a date YYYY-MM-DD)')
        assert new.term_start is not None and new.term_end is not None
        if new.term_end < new.term_start:
            raise SettingsError("term_end", f"{new.term_end} is before term_start {new.term_start}")
    return new


# ---- the store ---------------------------------------------------------------------------------


def get(conn: Connection, course: str):
    return conn.execute(select(Course).where(Course.name == course)).first()


def settings(conn: Connection, course: str) -> Settings:
    """The course's rules now (the defaults for a course billing has not seen)."""
    return Settings.of(get(conn, course))


def put_settings(conn: Connection, course: str, settings: Settings, now_us: int, actor: str):
    ledger.ensure(conn, ledger.pool(course), now_us)
    conn.execute(
        update(Course)
        .where(Course.name == course)
        .values(
            cap_micro=settings.cap_micro,
            period=settings.period,
            term_start=settings.term_start.isoformat() if settings.term_start else None,
            term_end=settings.term_end.isoformat() if settings.term_end else None,
            overflow=settings.overflow,
            updated_us=now_us,
            updated_by=actor,
        )
    )


def used(conn: Connection, course: str, user: str, period_start_us: int) -> int:
    """What the pool paid for ``user`` in the period starting at ``period_start_us``."""
    return int(
        conn.execute(
            select(func.coalesce(func.sum(CourseCharge.course_micro), 0)).where(
                CourseCharge.course == course,
                CourseCharge.user == user,
                CourseCharge.period_start_us == period_start_us,
            )
        ).scalar()
    )


def settle(conn: Connection, sess, settings: Settings, charge: Charge, now_us: int) -> int:
    """Split a course session's (re-rated) charge, already cut by ``settings``' periods
    (``rating.rate_charge``), between the pool and the student: post the pool's part to the pool
    (``ledger``) and return the change of the student's part (the caller posts it to the
    student). The course's row must be locked by the caller."""
    course = sess.course
    pool_left = ledger.available(conn, ledger.pool(course))
    target = charge.periods
    existing = {
        r.period_start_us: r
        for r in conn.execute(select(CourseCharge).where(CourseCharge.session_id == sess.id)).all()
    }
    course_delta = personal_delta = 0
    staff_started = paid_by_course(sess.options)
    for key in sorted(set(target) | set(existing)):
        end, new = target.get(key, (None, 0))
        old = existing.get(key)
        old_amount = old.amount_micro if old is not None else 0
        diff = new - old_amount
        if diff == 0:
            continue
        c = old.course_micro if old is not None else 0
        p = old.personal_micro if old is not None else 0
        if diff > 0:
            share = 0
            if key != OUTSIDE:
                cap_left = max(0, settings.cap_micro - used(conn, course, sess.user, key))
                share = max(0, min(diff, cap_left, pool_left))
            if staff_started:
                share = diff  # never the student's own money (see the module's docstring)
            pool_left -= share
            c, p = c + share, p + diff - share
            course_delta += share
            personal_delta += diff - share
        else:
            back = -diff
            from_personal = min(back, p)
            from_course = back - from_personal
            c, p = c - from_course, p - from_personal
            pool_left += from_course
            course_delta -= from_course
            personal_delta -= from_personal
        values = {
            "period_end_us": end if end is not None else old.period_end_us,
            "amount_micro": new,
            "course_micro": c,
            "personal_micro": p,
        }
        _store_split(conn, sess, key, old is None, values)
    if course_delta:
        ledger.post(
            conn,
            ledger.pool(course),
            "charge",
            -course_delta,
            now_us,
            session_id=sess.id,
            user=sess.user,
            note=f"session {sess.id} of {sess.user}",
        )
    return personal_delta


def _store_split(conn: Connection, sess, key: int, new: bool, values: dict[str, int]) -> None:
    """Write who paid a course session's charge for one period (``course_charges``)."""
    if new:
        conn.execute(
            insert_ignore(conn, CourseCharge, ["session_id", "period_start_us"]).values(
                session_id=sess.id,
                period_start_us=key,
                course=sess.course,
                user=sess.user,
                **values,
            )
        )
    else:
        conn.execute(
            update(CourseCharge)
            .where(CourseCharge.session_id == sess.id, CourseCharge.period_start_us == key)
            .values(**values)
        )


def paid_by(conn: Connection, session_ids: list[int]) -> dict[int, tuple[int, int]]:
    """{session id: (paid by the pool, paid by the student)} for course sessions."""
    out: dict[int, tuple[int, int]] = {}
    if not session_ids:
        return out
    for sid, c, p in conn.execute(
        select(
            CourseCharge.session_id,
            func.sum(CourseCharge.course_micro),
            func.sum(CourseCharge.personal_micro),
        )
        .where(CourseCharge.session_id.in_(session_ids))
        .group_by(CourseCharge.session_id)
    ).all():
        out[sid] = (int(c or 0), int(p or 0))
    return out


@dataclass(frozen=True)
class StudentStatus:
    """Where one student stands in one course now."""

    course: str
    settings: Settings
    pool_micro: int
    period: tuple[int, int] | None  # the current period, None outside the term
    used_micro: int  # what the pool paid for the student in this period

    @property
    def cap_left_micro(self) -> int:
        if self.period is None:
            return 0
        return max(0, self.settings.cap_micro - self.used_micro)

    @property
    def available_micro(self) -> int:
        """What the pool can still pay for this student now: min(cap left, pool balance)."""
        return max(0, min(self.cap_left_micro, self.pool_micro))


def student_status(conn: Connection, course: str, user: str, now_us: int) -> StudentStatus:
    row = get(conn, course)
    settings = Settings.of(row)
    period = settings.period_at(now_us)
    return StudentStatus(
        course,
        settings,
        row.balance_micro if row is not None else 0,
        period,
        used(conn, course, user, period[0]) if period is not None else 0,
    )


def students(conn: Connection, course: str) -> list[str]:
    """Everyone who ran a session in the course."""
    return list(
        conn.execute(
            select(ServerSession.user)
            .where(ServerSession.course == course)
            .distinct()
            .order_by(ServerSession.user)
        ).scalars()
    )


def period_usage(conn: Connection, course: str, period_start_us: int) -> dict[str, tuple[int, int]]:
    """{student: (paid by the pool, paid by the student)} in one period of the course."""
    return {
        u: (int(c or 0), int(p or 0))
        for u, c, p in conn.execute(
            select(
                CourseCharge.user,
                func.sum(CourseCharge.course_micro),
                func.sum(CourseCharge.personal_micro),
            )
            .where(CourseCharge.course == course, CourseCharge.period_start_us == period_start_us)
            .group_by(CourseCharge.user)
        ).all()
    }
