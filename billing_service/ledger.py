"""The one ledger: every balance in billing, a user's or a course's pool, and its entries.

Design: an account is named by an ``AccountId``, ``user:NAME`` (a user's own balance) or
``course:C`` (course C's credit pool), the same names reservations use. Each kind of account keeps
its rows where it always has (a *book*: users in ``accounts`` + ``ledger``, pools in ``courses`` +
``course_ledger``; the schema is unchanged), and this module is the only code that writes either:
one ``post``, one ``credit``, one ``pay``, one ``IdempotencyConflict``, the same rules for both.

- **Append-only, atomic.** A balance changes only together with an entry, in one transaction, by
  an atomic ``balance = balance + amount`` (never read-modify-write in Python), so concurrent
  top-ups and charges on one account cannot lose an update; ``recompute_balance`` re-derives any
  balance from its entries (``balance`` must always equal it).
- **Idempotency.** An entry may carry an idempotency key, unique within its book: a post with a
  key used before changes nothing (``post`` answers None). ``credit`` stores the caller's key as
  ``credit:KEY``; a replay with the same account, kind and amount answers the first entry, any
  other use of the key raises ``IdempotencyConflict`` (the API's 409). Keys of the two books are
  apart on purpose: a course session's compensation posts to the student and to the pool under
  the one key, and a reservation is ``reservation:ID`` in whichever book pays it.
- **Locking.** ``lock`` takes the rows of several accounts ``FOR UPDATE`` (PostgreSQL; SQLite has
  one writer) in one order: pools before users, by name. Ingestion locks sessions first, then
  this; everything that touches more than one account keeps that order, so no two transactions
  deadlock.
- **The bound.** ``pay`` takes a payment only if the balance covers it whole (the account's row
  locked while it decides): a prepaid reservation never takes an account below zero, whichever
  kind pays. Usage is not a payment: a session's charge is posted whatever the balance (the
  enforcer stops servers at zero), and a pool pays a course session only as far as its balance
  reaches (``available``; ``courses.settle``).
- **Opening.** ``ensure`` opens an account on first sight: a user's with the trial credit (once:
  key ``trial:NAME``), a pool empty and with the course's default rules (``COURSE_DEFAULTS``).

A plain ``str`` where an account is expected is a *user's* name, never parsed: a user named
``course:ml101`` is ``user:course:ml101`` and reaches nothing of the pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, func, select, update

from gpulab.billing_service.models import (
    COURSE_DEFAULTS,
    Account,
    Course,
    CourseLedgerEntry,
    LedgerEntry,
)
from gpulab.billing_service.sql import insert_ignore

CREDIT_KINDS = ("topup", "adjustment")
KINDS = ("course", "user")  # the lock order of the kinds of account


class IdempotencyConflict(ValueError):
    """The idempotency key was used before for something else."""


class InsufficientFunds(ValueError):
    """A payment the account's balance cannot cover whole (nothing was posted)."""

    def __init__(self, account: AccountId, balance_micro: int, amount_micro: int) -> None:
        super().__init__(f"{account} has {balance_micro} micro-units, needs {amount_micro}")
        self.account = account
        self.balance_micro = balance_micro
        self.amount_micro = amount_micro


@dataclass(frozen=True, order=True)
class AccountId:
    """``user:NAME`` or ``course:C``."""

    kind: Literal["course", "user"]
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


def user(name: str) -> AccountId:
    return AccountId("user", name)


def pool(course: str) -> AccountId:
    return AccountId("course", course)


def account_of(account: AccountId | str) -> AccountId:
    """An ``AccountId``; a plain str is a user's name (never parsed, see the module's doc)."""
    return account if isinstance(account, AccountId) else user(account)


@dataclass(frozen=True)
class _Book:
    """Where one kind of account keeps its balance and its entries."""

    balances: Any  # the model holding balance_micro
    key: Any  # its account-name column
    entries: Any  # the append-only entry model
    owner: Any  # the entries' account-name column


_BOOKS = {
    "user": _Book(Account, Account.user, LedgerEntry, LedgerEntry.user),
    "course": _Book(Course, Course.name, CourseLedgerEntry, CourseLedgerEntry.course),
}


def _book(account: AccountId) -> _Book:
    return _BOOKS[account.kind]


@dataclass(frozen=True)
class Entry:
    id: int
    account: AccountId
    kind: str
    amount_micro: int
    created_us: int
    idempotency_key: str | None
    note: str
    actor: str
    session_id: int | None = None
    # A user's entry: the user; a pool's: the student it was for ("" for top-ups).
    user: str = ""

    @classmethod
    def of(cls, account_kind: str, row) -> Entry:
        name = row.user if account_kind == "user" else row.course
        return cls(
            row.id,
            AccountId(account_kind, name),  # type: ignore[arg-type]
            row.kind,
            row.amount_micro,
            row.created_us,
            row.idempotency_key,
            row.note,
            row.actor,
            row.session_id,
            row.user,
        )

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "user": self.user,
            "kind": self.kind,
            "amount_micro": self.amount_micro,
            "created_us": self.created_us,
            "idempotency_key": self.idempotency_key,
            "note": self.note,
            "actor": self.actor,
        }


def ensure(
    conn: Connection, account: AccountId | str, now_us: int, *, trial_micro: int = 0
) -> bool:
    """Open the account on first sight (a user's with ``trial_micro``, a pool empty with the
    course's default rules); True when it was opened now."""
    account = account_of(account)
    book = _book(account)
    values: dict[str, Any] = {"balance_micro": 0, "created_us": now_us}
    if account.kind == "course":
        values.update(COURSE_DEFAULTS, updated_us=now_us, updated_by="")
    opened = conn.execute(
        insert_ignore(conn, book.balances, [book.key.key])
        .values({book.key.key: account.name, **values})
        .returning(book.key)
    ).first()
    if opened is None:
        return False
    if trial_micro and account.kind == "user":
        key = f"trial:{account.name}"
        post(conn, account, "trial", trial_micro, now_us, key=key, note="Trial credit")
    return True


def lock(conn: Connection, accounts: Iterable[AccountId | str]) -> None:
    """Lock these accounts' rows, pools before users, each by name (PostgreSQL; SQLite has a
    single writer). Open them first (``ensure``): a row that does not exist locks nothing."""
    if conn.dialect.name != "postgresql":
        return
    wanted = sorted({account_of(a) for a in accounts})
    for kind in KINDS:
        names = [a.name for a in wanted if a.kind == kind]
        if names:
            book = _BOOKS[kind]
            conn.execute(
                select(book.key).where(book.key.in_(names)).order_by(book.key).with_for_update()
            ).all()


def post(
    conn: Connection,
    account: AccountId | str,
    kind: str,
    amount_micro: int,
    now_us: int,
    *,
    session_id: int | None = None,
    user: str = "",
    key: str | None = None,
    note: str = "",
    actor: str = "",
) -> int | None:
    """Append one entry and move the balance by the same amount, atomically: the entry's id, or
    None if ``key`` was used before in this book (nothing changed then). ``user``: for a pool's
    entry, the student it is for (a user's entries are the user's own)."""
    account = account_of(account)
    book = _book(account)
    values: dict[str, Any] = {
        book.owner.key: account.name,
        "kind": kind,
        "amount_micro": amount_micro,
        "created_us": now_us,
        "session_id": session_id,
        "idempotency_key": key,
        "note": note,
        "actor": actor,
    }
    if account.kind == "course":
        values["user"] = user
    entry_id = conn.execute(
        insert_ignore(conn, book.entries, ["idempotency_key"])
        .values(values)
        .returning(book.entries.id)
    ).scalar()
    if entry_id is None:
        return None
    conn.execute(
        update(book.balances)
        .where(book.key == account.name)
        .values(balance_micro=book.balances.balance_micro + amount_micro)
    )
    return entry_id


def entry(conn: Connection, account_kind: str, key: str) -> Entry | None:
    """The entry of this kind of account's book that holds idempotency ``key``, or None."""
    book = _BOOKS[account_kind]
    row = conn.execute(select(book.entries).where(book.entries.idempotency_key == key)).first()
    return None if row is None else Entry.of(account_kind, row)


def credit(
    conn: Connection,
    account: AccountId | str,
    kind: str,
    amount_micro: int,
    key: str,
    now_us: int,
    *,
    trial_micro: int = 0,
    note: str = "",
    actor: str = "",
) -> tuple[Entry, bool]:
    """A top-up or adjustment, applied once per idempotency key: (entry, created now). Raises
    ``IdempotencyConflict`` when the key was used for another account, kind or amount."""
    account = account_of(account)
    ensure(conn, account, now_us, trial_micro=trial_micro)
    stored = f"credit:{key}"
    created = post(conn, account, kind, amount_micro, now_us, key=stored, note=note, actor=actor)
    found = entry(conn, account.kind, stored)
    assert found is not None
    if created is None and (found.account, found.kind, found.amount_micro) != (
        account,
        kind,
        amount_micro,
    ):
        raise IdempotencyConflict(
            f"idempotency_key {key!r} was already used for {found.kind} of "
            f"{found.amount_micro} micro-units to {found.account}"
        )
    return found, created is not None


def pay(
    conn: Connection,
    account: AccountId | str,
    kind: str,
    amount_micro: int,
    now_us: int,
    *,
    key: str,
    note: str = "",
    actor: str = "",
) -> int:
    """Take a payment of ``amount_micro`` (>= 0) only if the balance covers it whole: the entry's
    id. Raises ``InsufficientFunds`` (nothing posted) otherwise. The account must be open; its
    row is locked while this decides. A key used before posts nothing: None is not an answer
    here, so callers make the key unique to what they pay for (and check replays first)."""
    account = account_of(account)
    lock(conn, [account])
    bal = balance(conn, account) or 0
    if bal < amount_micro:
        raise InsufficientFunds(account, bal, amount_micro)
    entry_id = post(conn, account, kind, -amount_micro, now_us, key=key, note=note, actor=actor)
    if entry_id is None:
        raise IdempotencyConflict(f"idempotency_key {key!r} was already used in {account}'s book")
    return entry_id


def balance(conn: Connection, account: AccountId | str) -> int | None:
    """The account's balance; None when it was never opened."""
    account = account_of(account)
    book = _book(account)
    return conn.execute(
        select(book.balances.balance_micro).where(book.key == account.name)
    ).scalar()


def available(conn: Connection, account: AccountId | str) -> int:
    """What the account can pay now without going below zero: max(0, balance)."""
    return max(0, balance(conn, account) or 0)


def recompute_balance(conn: Connection, account: AccountId | str) -> int:
    """The balance as the entries say it is (for audits; must equal ``balance``)."""
    account = account_of(account)
    book = _book(account)
    return int(
        conn.execute(
            select(func.coalesce(func.sum(book.entries.amount_micro), 0)).where(
                book.owner == account.name
            )
        ).scalar()
    )
