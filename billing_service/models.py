"""The billing database: raw events, kernel spans, server sessions, accounts and the ledger.

Times are integer microseconds since the Unix epoch (``*_us``); money is integer micro-units of the
catalog currency (``*_micro``, 1 CNY = 1,000,000). Nothing here is ever a float.

Every change to these tables goes through Alembic migrations (``billing_service/migrations``).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

MICRO = 1_000_000  # micro-units per currency unit, and microseconds per second


class Base(DeclarativeBase):
    pass


class Event(Base):
    """Every accepted event, once: the primary key is the sender's event id (idempotency)."""

    __tablename__ = "events"

    event_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    user: Mapped[str] = mapped_column(String(255))
    server: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))
    t_us: Mapped[int] = mapped_column(BigInteger)
    kernel_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # The event as received (JSON), for audits; never read by the metering.
    body: Mapped[str] = mapped_column(Text)
    received_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_events_user_server_kind_t", "user", "server", "kind", "t_us"),)


class ServerSession(Base):
    """One run of one server, as reported by the hub (start with its mode, stop)."""

    __tablename__ = "server_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # The hub's server_start event id: a session is created once, whatever the retries.
    start_event: Mapped[str] = mapped_column(String(128), unique=True)
    user: Mapped[str] = mapped_column(String(255))
    server: Mapped[str] = mapped_column(String(255))
    gpu_type: Mapped[str] = mapped_column(String(64))  # a catalog slug, or NO_GPU
    gpus: Mapped[int] = mapped_column(Integer)
    pricing: Mapped[str] = mapped_column(String(16))
    options: Mapped[str] = mapped_column(Text, default="{}")  # spawn options (JSON)
    started_us: Mapped[int] = mapped_column(BigInteger)
    # Derived from events: the first server_stop at/after the start, or the next session's start.
    stopped_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    billed_us: Mapped[int] = mapped_column(BigInteger, default=0)
    charged_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    last_busy_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_heartbeat_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The course the session runs under (the hub-reported options' ``course``), or None.
    course: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    # The reservation the hub says the server's cards came from (options' ``reservation``), or
    # None; believed only as far as ``reservations.check`` finds it paid and matching.
    reservation: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)

    __table_args__ = (
        Index("ix_sessions_user_server_started", "user", "server", "started_us"),
        # Open sessions (stopped_us NULL): the enforcer and the metrics' lag look for them.
        Index("ix_sessions_stopped", "stopped_us"),
    )


class KernelSpan(Base):
    """When one kernel (or app) was seen alive: the earliest and latest report of it."""

    __tablename__ = "kernel_spans"

    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    server: Mapped[str] = mapped_column(String(255), primary_key=True)
    kernel_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    first_us: Mapped[int] = mapped_column(BigInteger)
    last_us: Mapped[int] = mapped_column(BigInteger)
    session_id: Mapped[int | None] = mapped_column(
        ForeignKey("server_sessions.id"), nullable=True, index=True
    )


class Account(Base):
    """A user's balance: always equal to the sum of their ledger entries."""

    __tablename__ = "accounts"

    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    balance_micro: Mapped[int] = mapped_column(BigInteger)
    created_us: Mapped[int] = mapped_column(BigInteger)


class LedgerEntry(Base):
    """Append-only: credits are positive, charges negative. Never updated, never deleted."""

    __tablename__ = "ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(ForeignKey("accounts.user"))
    # trial, topup, adjustment, charge, compensation, reservation
    kind: Mapped[str] = mapped_column(String(16))
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    created_us: Mapped[int] = mapped_column(BigInteger)
    session_id: Mapped[int | None] = mapped_column(ForeignKey("server_sessions.id"), nullable=True)
    # Credits carry the caller's idempotency key: a retried top-up is applied once.
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(255), default="")

    __table_args__ = (
        UniqueConstraint("idempotency_key", name="uq_ledger_idempotency_key"),
        Index("ix_ledger_user_created", "user", "created_us"),
        Index("ix_ledger_kind_created", "kind", "created_us"),
    )


# The rules a course starts with (``courses.Settings()``): no cap, weekly, overflow personal.
COURSE_DEFAULTS = {
    "cap_micro": 0,
    "period": "week",
    "term_start": None,
    "term_end": None,
    "overflow": "personal",
}


class Course(Base):
    """A course's credit pool (the ledger's account ``course:C``) and its rules. No user name
    reaches it (``accounts`` and ``ledger`` never hold it); its balance always equals the sum of
    its ``course_ledger`` entries and moves only through ``ledger.post``."""

    __tablename__ = "courses"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    balance_micro: Mapped[int] = mapped_column(BigInteger)
    cap_micro: Mapped[int] = mapped_column(BigInteger)  # per student per period
    period: Mapped[str] = mapped_column(String(8))  # week, term
    term_start: Mapped[str | None] = mapped_column(String(10), nullable=True)  # YYYY-MM-DD
    term_end: Mapped[str | None] = mapped_column(String(10), nullable=True)  # inclusive
    overflow: Mapped[str] = mapped_column(String(16))  # personal, refuse
    created_us: Mapped[int] = mapped_column(BigInteger)
    updated_us: Mapped[int] = mapped_column(BigInteger)
    updated_by: Mapped[str] = mapped_column(String(255), default="")


class CourseLedgerEntry(Base):
    """Append-only, like ``ledger``: top-ups and adjustments of a pool, and what it paid."""

    __tablename__ = "course_ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    course: Mapped[str] = mapped_column(ForeignKey("courses.name"))
    kind: Mapped[str] = mapped_column(String(16))  # topup, adjustment, charge, reservation
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    created_us: Mapped[int] = mapped_column(BigInteger)
    session_id: Mapped[int | None] = mapped_column(ForeignKey("server_sessions.id"), nullable=True)
    user: Mapped[str] = mapped_column(String(255), default="")  # the student, for charges
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(255), default="")

    __table_args__ = (
        UniqueConstraint("idempotency_key", name="uq_course_ledger_idempotency_key"),
        Index("ix_course_ledger_course_created", "course", "created_us"),
        Index("ix_course_ledger_kind_created", "kind", "created_us"),
    )


class CourseCharge(Base):
    """Who paid one course session's charge for the seconds in one period: ``course_micro``
    from the pool, ``personal_micro`` from the student's account (their sum is ``amount``).
    ``period_start_us`` is -1 for time outside every period (outside the term)."""

    __tablename__ = "course_charges"

    session_id: Mapped[int] = mapped_column(ForeignKey("server_sessions.id"), primary_key=True)
    period_start_us: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    period_end_us: Mapped[int] = mapped_column(BigInteger)
    course: Mapped[str] = mapped_column(String(64))
    user: Mapped[str] = mapped_column(String(255))
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    course_micro: Mapped[int] = mapped_column(BigInteger)
    personal_micro: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_course_charges_course_user_period", "course", "user", "period_start_us"),
    )


class Reservation(Base):
    """A prepaid reservation of ``cards`` cards of ``gpu_type`` for [start, end): paid at once
    (``amount_micro``, at ``price_micro`` per card-hour, the catalog's monthly price then) by an
    account: ``user:NAME`` (the user's balance, ledger kind ``reservation``) or ``course:C`` (the
    course's pool, its ledger's kind ``reservation``). Never updated, never deleted."""

    __tablename__ = "reservations"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    account: Mapped[str] = mapped_column(String(300), index=True)  # user:NAME, course:C
    gpu_type: Mapped[str] = mapped_column(String(64))
    cards: Mapped[int] = mapped_column(Integer)
    start_us: Mapped[int] = mapped_column(BigInteger)
    end_us: Mapped[int] = mapped_column(BigInteger)
    price_micro: Mapped[int] = mapped_column(BigInteger)  # per card-hour
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    created_us: Mapped[int] = mapped_column(BigInteger)
    actor: Mapped[str] = mapped_column(String(255), default="")


class StorageMeter(Base):
    """Where the metering of one user's home stands (``storage``): charged up to ``measured_us``,
    the time of the hub's latest measurement of it, and the level that measurement found, which
    holds until the next one. One row per home the hub has measured."""

    __tablename__ = "storage_meters"

    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    measured_us: Mapped[int] = mapped_column(BigInteger)
    used_bytes: Mapped[int] = mapped_column(BigInteger)
    quota_bytes: Mapped[int] = mapped_column(BigInteger)
    datasets_bytes: Mapped[int] = mapped_column(BigInteger)
    # max(quota, used + datasets) - the free size then, floored at 0: what is charged per day.
    billable_bytes: Mapped[int] = mapped_column(BigInteger)
    received_us: Mapped[int] = mapped_column(BigInteger)


class StorageCharge(Base):
    """One charged piece of a user's storage time: [from, to) within one UTC day (``day_us``)
    at ``billable_bytes`` (the level the hub measured at ``from``) and ``price_micro`` per GB-day
    (the catalog's then). The primary key (user, from) is the charge's unique key: a piece of
    time is charged once. ``charged_micro`` is what this piece posted to the ledger (kind
    ``storage``): a day's pieces add up to that day's amount rounded once. Never updated."""

    __tablename__ = "storage_charges"

    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    from_us: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    to_us: Mapped[int] = mapped_column(BigInteger)
    day_us: Mapped[int] = mapped_column(BigInteger)
    billable_bytes: Mapped[int] = mapped_column(BigInteger)
    price_micro: Mapped[int] = mapped_column(BigInteger)  # per GB-day (GB = 2**30 bytes)
    charged_micro: Mapped[int] = mapped_column(BigInteger)
    created_us: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_storage_charges_user_day", "user", "day_us"),)
