"""The one ledger (``billing_service/ledger.py``) for both kinds of account, on SQLite and a real
PostgreSQL: a user's balance and a course's pool are posted, credited and paid from by the same
code under the same rules (idempotent replay, a conflicting replay, never below the bound, no
lost update when two transactions post to one account at once)."""

from __future__ import annotations

import threading
import uuid

import pytest
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from sqlalchemy import select

from gpulab.billing_service import courses, ledger
from gpulab.billing_service.db import make_engine, upgrade
from gpulab.billing_service.models import MICRO, Account, Course

TRIAL = 10 * MICRO


def fresh(kind: str) -> ledger.AccountId:
    name = f"{kind[0]}{uuid.uuid4().hex[:10]}"
    return ledger.user(name) if kind == "user" else ledger.pool(name)


def audit(engine, account: ledger.AccountId) -> int:
    with engine.connect() as conn:
        bal = ledger.balance(conn, account)
        assert bal == ledger.recompute_balance(conn, account)
        return bal


KINDS = ["user", "course"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_credit_replayed_is_made_once_and_a_conflicting_one_is_refused(engine, kind) -> None:
    account, key = fresh(kind), uuid.uuid4().hex
    opening = TRIAL if kind == "user" else 0
    with engine.begin() as conn:
        entry, created = ledger.credit(conn, account, "topup", 5 * MICRO, key, 1, trial_micro=TRIAL)
    assert created and entry.account == account and entry.idempotency_key == f"credit:{key}"
    with engine.begin() as conn:
        again, created = ledger.credit(conn, account, "topup", 5 * MICRO, key, 2, trial_micro=TRIAL)
    assert not created and again == entry
    other = fresh(kind)
    for target, kind_, amount in [
        (account, "topup", 7 * MICRO),  # another amount
        (account, "adjustment", 5 * MICRO),  # another kind
        (other, "topup", 5 * MICRO),  # another account of the same kind
    ]:
        with pytest.raises(ledger.IdempotencyConflict), engine.begin() as conn:
            ledger.credit(conn, target, kind_, amount, key, 3, trial_micro=TRIAL)
    assert audit(engine, account) == opening + 5 * MICRO
    with engine.connect() as conn:
        assert ledger.balance(conn, other) is None  # the refused credit left nothing behind


@pytest.mark.parametrize("kind", KINDS)
def test_a_post_with_a_used_key_changes_nothing(engine, kind) -> None:
    account, key = fresh(kind), uuid.uuid4().hex
    with engine.begin() as conn:
        ledger.ensure(conn, account, 0)
        first = ledger.post(conn, account, "charge", -300, 0, session_id=None, key=key)
        assert first is not None
        assert ledger.post(conn, account, "charge", -300, 0, key=key) is None
        assert ledger.post(conn, account, "charge", -999, 0, key=key) is None
    assert audit(engine, account) == -300


@pytest.mark.parametrize("kind", KINDS)
def test_a_payment_never_takes_an_account_below_zero(engine, kind) -> None:
    account = fresh(kind)
    with engine.begin() as conn:
        ledger.ensure(conn, account, 0)
        ledger.credit(conn, account, "topup", 2 * MICRO, uuid.uuid4().hex, 0)
    with pytest.raises(ledger.InsufficientFunds) as refused, engine.begin() as conn:
        ledger.pay(conn, account, "reservation", 2 * MICRO + 1, 0, key=uuid.uuid4().hex)
    assert refused.value.balance_micro == 2 * MICRO and refused.value.account == account
    with engine.begin() as conn:
        ledger.pay(conn, account, "reservation", 2 * MICRO, 0, key=uuid.uuid4().hex)
        assert ledger.available(conn, account) == 0
    assert audit(engine, account) == 0


def test_opening_a_pool_gives_the_course_its_default_rules(engine) -> None:
    account = fresh("course")
    with engine.begin() as conn:
        assert ledger.ensure(conn, account, 5, trial_micro=TRIAL)  # no trial credit for a pool
        assert not ledger.ensure(conn, account, 6)
        assert courses.Settings.of(courses.get(conn, account.name)) == courses.Settings()
    assert audit(engine, account) == 0


def test_a_user_named_like_a_pool_is_a_user(engine) -> None:
    course = fresh("course")
    with engine.begin() as conn:
        ledger.credit(conn, course, "topup", 3 * MICRO, uuid.uuid4().hex, 0)
        # A plain name is a user's, whatever it looks like.
        ledger.credit(conn, str(course), "topup", MICRO, uuid.uuid4().hex, 0, trial_micro=TRIAL)
        assert ledger.account_of(str(course)) == ledger.user(str(course))
        assert conn.execute(select(Account.user).where(Account.user == str(course))).scalar()
        assert conn.execute(select(Course.name).where(Course.name == str(course))).first() is None
    assert audit(engine, course) == 3 * MICRO
    assert audit(engine, ledger.user(str(course))) == TRIAL + MICRO


@pytest.mark.parametrize("kind", KINDS)
def test_two_transactions_posting_to_one_account_lose_nothing_on_postgresql(
    pg_url,  # noqa: F811
    kind,
) -> None:
    """Two threads each post 40 charges and replay 20 credits (each key twice, concurrently) on
    one account, with ``lock`` held like ingestion holds it: every post counts once."""
    engine = make_engine(pg_url)
    upgrade(engine)
    account = fresh(kind)
    with engine.begin() as conn:
        ledger.ensure(conn, account, 0)
    keys = [uuid.uuid4().hex for _ in range(20)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker() -> None:
        try:
            barrier.wait()
            for i in range(40):
                with engine.begin() as conn:
                    ledger.lock(conn, [account])
                    ledger.post(conn, account, "charge", -1_000, i, note="usage")
                if i < len(keys):
                    with engine.begin() as conn:
                        ledger.credit(conn, account, "topup", 5_000, keys[i], i)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert audit(engine, account) == 20 * 5_000 - 2 * 40 * 1_000
    engine.dispose()


def test_locking_pools_and_users_together_keeps_one_order_on_postgresql(pg_url) -> None:  # noqa: F811
    """Two transactions locking the same pool and user named in opposite orders do not
    deadlock: ``lock`` takes pools before users, each by name."""
    engine = make_engine(pg_url)
    upgrade(engine)
    a, b = fresh("course"), fresh("user")
    with engine.begin() as conn:
        ledger.ensure(conn, a, 0)
        ledger.ensure(conn, b, 0)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def worker(order) -> None:
        try:
            barrier.wait()
            for i in range(30):
                with engine.begin() as conn:
                    ledger.lock(conn, order)
                    for account in order:
                        ledger.post(conn, account, "charge", -1, i)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(o,)) for o in ([a, b], [b, a])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert audit(engine, a) == audit(engine, b) == -60
    engine.dispose()
