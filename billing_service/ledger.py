"""Accounts and the append-only ledger.

A balance only ever changes together with a ledger entry, in one transaction, by an atomic
``balance = balance + amount`` (never read-modify-write in Python), so concurrent top-ups and
charges on one account cannot lose an update. ``recompute_balance`` re-derives it from the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, func, select, update

from gpulab.billing_service.models import Account, LedgerEntry
from gpulab.billing_service.sql import insert_ignore

CREDIT_KINDS = ("topup", "adjustment")


class IdempotencyConflict(ValueError):
    """The idempotency key was used before for a different credit."""


@dataclass(frozen=True)
class Entry:
    id: int
    user: str
    kind: str
    amount_micro: int
    created_us: int
    idempotency_key: str | None
    note: str
    actor: str

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


def ensure_account(conn: Connection, user: str, trial_micro: int, now_us: int) -> bool:
    """Open ``user``'s account with the trial credit on first sight; True when it was opened now."""
    opened = conn.execute(
        insert_ignore(conn, Account, ["user"])
        .values(user=user, balance_micro=0, created_us=now_us)
        .returning(Account.user)
    ).first()
    if opened is None:
        return False
    if trial_micro:
        post(conn, user, "trial", trial_micro, now_us, key=f"trial:{user}", note="Trial credit")
    return True


def post(
    conn: Connection,
    user: str,
    kind: str,
    amount_micro: int,
    now_us: int,
    *,
    session_id: int | None = None,
    key: str | None = None,
    note: str = "",
    actor: str = "",
) -> int | None:
    """Append one entry and move the balance by the same amount; None if ``key`` was used before."""
    entry_id = conn.execute(
        insert_ignore(conn, LedgerEntry, ["idempotency_key"])
        .values(
            user=user,
            kind=kind,
            amount_micro=amount_micro,
            created_us=now_us,
            session_id=session_id,
            idempotency_key=key,
            note=note,
            actor=actor,
        )
        .returning(LedgerEntry.id)
    ).scalar()
    if entry_id is None:
        return None
    conn.execute(
        update(Account)
        .where(Account.user == user)
        .values(balance_micro=Account.balance_micro + amount_micro)
    )
    return entry_id


def credit(
    conn: Connection,
    user: str,
    kind: str,
    amount_micro: int,
    key: str,
    now_us: int,
    *,
    trial_micro: int,
    note: str = "",
    actor: str = "",
) -> tuple[Entry, bool]:
    """An admin top-up or adjustment, applied once per idempotency key: (entry, created now)."""
    ensure_account(conn, user, trial_micro, now_us)
    entry_id = post(conn, user, kind, amount_micro, now_us, key=key, note=note, actor=actor)
    created = entry_id is not None
    row = conn.execute(select(LedgerEntry).where(LedgerEntry.idempotency_key == key)).one()
    entry = Entry(
        row.id,
        row.user,
        row.kind,
        row.amount_micro,
        row.created_us,
        row.idempotency_key,
        row.note,
        row.actor,
    )
    if not created and (entry.user, entry.kind, entry.amount_micro) != (user, kind, amount_micro):
        raise IdempotencyConflict(
            f"idempotency_key {key!r} was already used for {entry.kind} of "
            f"{entry.amount_micro} micro-units to {entry.user}"
        )
    return entry, created


def balance(conn: Connection, user: str) -> int | None:
    return conn.execute(select(Account.balance_micro).where(Account.user == user)).scalar()


def recompute_balance(conn: Connection, user: str) -> int:
    """The balance as the ledger says it is (for audits; must equal ``balance``)."""
    return int(
        conn.execute(
            select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
                LedgerEntry.user == user
            )
        ).scalar()
    )
