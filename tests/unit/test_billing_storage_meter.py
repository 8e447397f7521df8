"""Storage metering (``billing_service/storage.py``) on SQLite and a real PostgreSQL: the hub's
measurements charged per GB-day above the free size, each piece of time once, days rounded once,
through the one ledger (issue 23, "Free tier and paid storage": billing meters GB-days from what
the hub measures, its own line, never counted twice nor skipped)."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from billing.fixtures import (  # noqa: F401 (fixtures)
    billing_engine,
    billing_sqlite_engine,
    pg_cluster,
    pg_url,
)
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from gpulab.billing_service import ledger, storage
from gpulab.billing_service.models import MICRO, LedgerEntry, StorageCharge
from gpulab.billing_service.rating import GIB, US_PER_DAY, round_div
from gpulab.catalog.models import Storage

TRIAL = 10 * MICRO
# A tiny free tier, so a test home is above it: 64 MiB free, 0.5 per GB-day.
STORAGE = Storage(free_gb=Decimal("0.0625"), max_gb=Decimal(2), price_per_gb_day=Decimal("0.5"))
PRICE = 500_000  # 0.5 in micro-units
DAY0 = 1_767_225_600 * MICRO  # 2026-01-01 00:00 UTC


def who() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


def m(user: str, t_us: int, quota_gb: str = "0.0625", used: int = 0, datasets: int = 0):
    return storage.Measurement(user, t_us, used, STORAGE.bytes_of(Decimal(quota_gb)), datasets)


def take(engine, meas, now_us: int | None = None) -> int:
    with engine.begin() as conn:
        return storage.record(conn, STORAGE, meas, now_us or meas.measured_us + 1, TRIAL)


def expected(pieces: list[tuple[int, int]]) -> int:
    """The amount of one day's (bytes, microseconds) pieces, computed here independently."""
    return round_div(sum(b * us for b, us in pieces) * PRICE, GIB * US_PER_DAY)


def balance(engine, user: str) -> int | None:
    with engine.connect() as conn:
        bal = ledger.balance(conn, ledger.user(user))
        if bal is not None:
            assert bal == ledger.recompute_balance(conn, ledger.user(user))
        return bal


def test_time_between_measurements_is_charged_at_the_level_first_seen(engine) -> None:
    """Sample and hold: [t0, t1) at t0's level, [t1, t2) at t1's; the first measurement charges
    nothing before it; billable = max(quota, used + datasets) - free."""
    u = who()
    t0, t1, t2 = DAY0 + 3600 * MICRO, DAY0 + 5 * 3600 * MICRO, DAY0 + 9 * 3600 * MICRO
    assert take(engine, m(u, t0, quota_gb="1")) == 0
    assert balance(engine, u) is None  # nothing charged yet: no account opened for it
    first = take(engine, m(u, t1, quota_gb="0.0625", used=10 * 2**20, datasets=100 * 2**20))
    level0 = GIB - STORAGE.free_bytes
    assert first == expected([(level0, t1 - t0)]) > 0
    second = take(engine, m(u, t2))
    level1 = 110 * 2**20 - STORAGE.free_bytes  # used + datasets above the quota
    # The day is rounded once: its two charges add up to the rounded sum of both pieces.
    assert first + second == expected([(level0, t1 - t0), (level1, t2 - t1)])
    assert balance(engine, u) == TRIAL - first - second
    with engine.connect() as conn:
        kinds = conn.execute(select(LedgerEntry.kind).where(LedgerEntry.user == u)).scalars()
        assert sorted(kinds) == ["storage", "storage", "trial"]


def test_a_repeated_or_older_scan_charges_nothing_and_a_replayed_piece_rolls_back(engine) -> None:
    u = who()
    t0, t1 = DAY0, DAY0 + 7200 * MICRO
    take(engine, m(u, t0, quota_gb="1"))
    charged = take(engine, m(u, t1, quota_gb="1"))
    assert charged > 0
    assert take(engine, m(u, t1, quota_gb="1")) == 0  # the same scan again
    assert take(engine, m(u, t0 + MICRO, quota_gb="1")) == 0  # an older one
    # Charging the same piece of time again (a second pull racing the first) is refused whole.
    with pytest.raises(IntegrityError), engine.begin() as conn:
        storage.charge(conn, u, t0, t1, GIB, PRICE, t1, TRIAL)
    assert balance(engine, u) == TRIAL - charged


def test_a_measurement_is_never_charged_ahead_of_billings_clock(engine) -> None:
    u = who()
    take(engine, m(u, DAY0, quota_gb="1"))
    future = DAY0 + 10 * 3600 * MICRO
    now = DAY0 + 3600 * MICRO
    charged = take(engine, m(u, future, quota_gb="1"), now_us=now)
    assert charged == expected([(GIB - STORAGE.free_bytes, now - DAY0)])


def test_time_across_midnight_is_one_line_per_day(engine) -> None:
    u = who()
    t0, t1 = DAY0 - 2 * 3600 * MICRO, DAY0 + 3 * 3600 * MICRO
    take(engine, m(u, t0, quota_gb="2"))
    take(engine, m(u, t1, quota_gb="2"))
    level = 2 * GIB - STORAGE.free_bytes
    with engine.connect() as conn:
        rows = conn.execute(
            select(StorageCharge).where(StorageCharge.user == u).order_by(StorageCharge.from_us)
        ).all()
        assert [(r.from_us, r.to_us) for r in rows] == [(t0, DAY0), (DAY0, t1)]
        assert [r.charged_micro for r in rows] == [
            expected([(level, DAY0 - t0)]),
            expected([(level, t1 - DAY0)]),
        ]
        st = storage.usage(conn, STORAGE, "CNY", u, t0 - US_PER_DAY, t1)
    assert [d["date"] for d in st["days"]] == ["2025-12-31", "2026-01-01"]
    assert st["days"][0]["gb_days"] == str(
        (Decimal(level) / GIB * 2 / 24).quantize(Decimal("0.000001"))
    )
    assert st["total"]["micro"] == sum(r.charged_micro for r in rows)
    assert st["home"]["billable_bytes"] == level


def test_a_free_tier_home_pays_nothing_and_opens_no_account(engine) -> None:
    u = who()
    for h in range(5):
        take(engine, m(u, DAY0 + h * 3600 * MICRO, used=60 * 2**20))  # below 64 MiB free
    assert balance(engine, u) is None
    with engine.connect() as conn:
        assert conn.execute(select(StorageCharge).where(StorageCharge.user == u)).all() == []


def test_a_home_the_hub_no_longer_lists_is_charged_until_that_scan_then_nothing(engine) -> None:
    u, other = who(), who()
    t0, t1, t2 = DAY0, DAY0 + 3600 * MICRO, DAY0 + 7200 * MICRO
    storage.apply_scan(engine, STORAGE, t0, [m(u, t0, quota_gb="1")], t0 + 1, TRIAL)
    # (The module's store holds other tests' homes too: each is "released" here alike.)
    out = storage.apply_scan(engine, STORAGE, t1, [m(other, t1)], t1 + 1, TRIAL)
    assert out.released >= 1 and out.failed == 0
    charged = expected([(GIB - STORAGE.free_bytes, t1 - t0)])
    assert balance(engine, u) == TRIAL - charged
    storage.apply_scan(engine, STORAGE, t2, [m(other, t2)], t2 + 1, TRIAL)
    assert balance(engine, u) == TRIAL - charged
    with engine.connect() as conn:
        assert storage.usage(conn, STORAGE, "CNY", u, t0, t2)["home"]["billable_bytes"] == 0


@pytest.mark.parametrize(
    "row",
    [
        {"user": "a", "measured_at": 1.0, "used_bytes": -1, "quota_bytes": 0},
        {"user": "a", "measured_at": 1.0, "used_bytes": True, "quota_bytes": 0},
        {"user": "a", "measured_at": 1.0, "used_bytes": "9", "quota_bytes": 0},
        {"user": "a", "measured_at": 1.0, "used_bytes": 1.5, "quota_bytes": 0},
        {"user": "a", "measured_at": "now", "used_bytes": 0, "quota_bytes": 0},
        {"user": "", "measured_at": 1.0, "used_bytes": 0, "quota_bytes": 0},
        {"user": "a", "measured_at": float("nan"), "used_bytes": 0, "quota_bytes": 0},
    ],
)
def test_a_home_the_scan_cannot_say_is_left_out(row) -> None:
    good = {"user": "b", "measured_at": 2.0, "used_bytes": 5, "quota_bytes": 7}
    at, homes = storage.parse_scan({"measured_at": 3.0, "homes": [row, good]})
    assert at == 3 * MICRO and homes == [storage.Measurement("b", 2 * MICRO, 5, 7, 0)]


def test_a_body_that_is_no_scan_is_refused() -> None:
    for body in (None, [], {"homes": {}}, "homes"):
        with pytest.raises(storage.ScanError):
            storage.parse_scan(body)
