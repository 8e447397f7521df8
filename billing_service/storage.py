"""Storage billing: each user's home above the free size, charged per GB-day from what the hub
measured (never from what a user or a server says).

Why here: a home is paid for by the same balance as GPU time, so its charges go through the one
ledger (kind ``storage``) under the same rules, and the enforcer's money rules apply to them.

- **Source.** A loop (``StorageMetering``, every ``BillingService.storage_interval`` seconds,
  jittered) reads the hub's ``GET /hub/api/storage`` with billing's own hub token (scope
  ``custom:gpulab:read-storage``): each home's ``used_bytes``, ``quota_bytes``,
  ``datasets_bytes`` (the user's published private datasets), ``uploads_bytes`` (what their
  unfinished uploads hold on the node's disk; 0 from a hub that does not say) and ``measured_at``. Nothing a user's
  token or server can send reaches this: billing has no endpoint that takes storage figures.
- **Billable bytes** = max(quota, used + datasets + uploads) - the catalog's ``storage.free_gb``, floored
  at 0. A quota is space held for the user, so a raised quota is paid for whether filled or not.
- **Sample and hold.** Each measurement's level holds until the next one: the time between two
  measurements of a home is charged at the level the first found (``StorageMeter`` keeps the
  latest one). The first measurement of a home charges nothing before it. A home the hub no
  longer lists (released) is held at its level until the scan that missed it, then at 0.
- **Never twice, never skipped.** A piece of time [from, to) is charged once: its row in
  ``storage_charges`` has the primary key (user, from), the meter moves to ``to`` in the same
  transaction, and the ledger entry carries the key ``storage:USER:FROM``. Billing stopped (even
  SIGKILLed) mid-interval charges the whole elapsed time at its next pull, once.
- **Per day, rounded once.** Pieces are cut at UTC midnight; a day's amount is the sum of its
  pieces' exact amounts (``rating.storage_exact``: bytes x microseconds x price per GB-day)
  rounded once (``rating.storage_micro``), each piece posting the difference, as a session's
  charges do. No request fees: nothing but bytes and time is charged.
- **Debt** is like any debt (``enforce``): the balance may go below zero (usage is not a
  payment), servers are then stopped or moved as for GPU time, starts and quota raises are
  refused with 402; nothing is deleted for debt (only the retention schedule releases homes).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, insert, select, update

from gpulab.billing_service import ledger
from gpulab.billing_service.daily import DAY_US, cut_at_midnight, day_name, day_start
from gpulab.billing_service.models import MICRO, StorageCharge, StorageMeter
from gpulab.billing_service.rating import (
    GIB,
    US_PER_DAY,
    format_money,
    from_micro,
    storage_exact,
    storage_micro,
    to_micro,
)
from gpulab.catalog.models import Storage
from gpulab.catalog.pricing import storage_quote

if TYPE_CHECKING:
    from gpulab.billing_service.app import BillingService

log = logging.getLogger("gpulab.billing")
KIND = "storage"  # the ledger kind of storage charges
MAX_BYTES = 2**62


class ScanError(ValueError):
    """The hub's answer is not a storage scan."""


@dataclass(frozen=True)
class Measurement:
    """One home as the hub measured it."""

    user: str
    measured_us: int
    used_bytes: int
    quota_bytes: int
    datasets_bytes: int
    uploads_bytes: int = 0  # unfinished uploads' pending files (outside the home)

    def billable(self, storage: Storage) -> int:
        """max(quota, used + datasets + uploads) - free, floored at 0: the one price function's
        bytes (``catalog.pricing.storage_quote``, which the hub's storage API quotes by too)."""
        held = self.used_bytes + self.datasets_bytes + self.uploads_bytes
        return storage_quote(storage, self.quota_bytes, held).billable_bytes


def _size(row: dict, key: str) -> int:
    optional = key in ("datasets_bytes", "uploads_bytes")  # 0 from an older hub
    value = row.get(key, 0) if optional else row.get(key)
    if value is None and optional:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_BYTES:
        raise ScanError(f"homes[].{key}: {value!r} is not a byte count")
    return value


def _time_us(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScanError(f"{field}: {value!r} is not a Unix time")
    return round(value * MICRO)


def parse_scan(body: Any) -> tuple[int, list[Measurement]]:
    """(the scan's time, each home's measurement) from ``GET /hub/api/storage``; a home that does
    not parse is left out (logged), a body that is no scan raises ``ScanError``."""
    if not isinstance(body, dict) or not isinstance(body.get("homes"), list):
        raise ScanError("not a storage scan: no 'homes' list")
    homes: list[Measurement] = []
    for row in body["homes"]:
        try:
            if not isinstance(row, dict):
                raise ScanError("homes[]: not an object")
            user = row.get("user")
            if user is None:
                continue  # a home no hub user owns (any more): nobody to charge
            if not isinstance(user, str) or not 1 <= len(user) <= 255:
                raise ScanError(f"homes[].user: {user!r}")
            homes.append(
                Measurement(
                    user,
                    _time_us(row.get("measured_at"), "homes[].measured_at"),
                    _size(row, "used_bytes"),
                    _size(row, "quota_bytes"),
                    _size(row, "datasets_bytes"),
                    _size(row, "uploads_bytes"),
                )
            )
        except ScanError as e:
            log.warning("storage scan: a home left out: %s", e)
    at = body.get("measured_at")
    scan_us = (
        _time_us(at, "measured_at")
        if at is not None
        else max((m.measured_us for m in homes), default=time.time_ns() // 1000)
    )
    return scan_us, homes


def ledger_key(user: str, from_us: int) -> str:
    key = f"storage:{user}:{from_us}"
    if len(key) <= 255:
        return key
    return f"storage:#{hashlib.sha256(user.encode()).hexdigest()}:{from_us}"


def price_micro(storage: Storage) -> int:
    return to_micro(Decimal(storage.price_per_gb_day))


def charge(
    conn: Connection,
    user: str,
    from_us: int,
    to_us: int,
    billable: int,
    price: int,
    now_us: int,
    trial_micro: int = 0,
) -> int:
    """Charge ``billable`` bytes over [from, to) at ``price`` micro-units per GB-day: one piece
    per UTC day, each posting its day's rounded amount less what the day posted before. Returns
    the micro-units posted. Raises (the caller's transaction rolls back) if a piece was charged
    before."""
    if billable <= 0 or price <= 0 or to_us <= from_us:
        return 0
    account = ledger.user(user)
    ledger.ensure(conn, account, now_us, trial_micro=trial_micro)
    ledger.lock(conn, [account])
    posted = 0
    for day, pieces in sorted(cut_at_midnight([(from_us, to_us)]).items()):
        ((a, b),) = pieces
        before = conn.execute(
            select(StorageCharge).where(StorageCharge.user == user, StorageCharge.day_us == day)
        ).all()
        exact = sum(
            storage_exact(r.billable_bytes, r.to_us - r.from_us, r.price_micro) for r in before
        )
        exact += storage_exact(billable, b - a, price)
        amount = storage_micro(exact) - sum(r.charged_micro for r in before)
        # The primary key (user, from) refuses a piece charged before: the whole pull rolls back.
        conn.execute(
            insert(StorageCharge).values(
                user=user,
                from_us=a,
                to_us=b,
                day_us=day,
                billable_bytes=billable,
                price_micro=price,
                charged_micro=amount,
                created_us=now_us,
            )
        )
        if amount:
            note = f"Storage {day_name(day)}: {billable / GIB:.3f} GB above the free size"
            entry = ledger.post(
                conn, account, KIND, -amount, now_us, key=ledger_key(user, a), note=note
            )
            if entry is None:
                raise ledger.IdempotencyConflict(f"storage of {user} from {a} was charged before")
        posted += amount
    return posted


def record(
    conn: Connection, storage: Storage, m: Measurement, now_us: int, trial_micro: int = 0
) -> int:
    """Take one measurement: charge the time since the home's previous one at the level that one
    found, and hold this one's level from now on. Returns what was posted (micro-units). A
    measurement not newer than the last one taken changes nothing (a repeated scan)."""
    at = min(m.measured_us, now_us)  # never charged ahead of billing's own clock
    meter = conn.execute(select(StorageMeter).where(StorageMeter.user == m.user)).first()
    level = m.billable(storage)
    values = {
        "measured_us": at,
        "used_bytes": m.used_bytes,
        "quota_bytes": m.quota_bytes,
        "datasets_bytes": m.datasets_bytes,
        "billable_bytes": level,
        "received_us": now_us,
    }
    if meter is None:
        conn.execute(insert(StorageMeter).values(user=m.user, **values))
        return 0
    if at <= meter.measured_us:
        return 0
    posted = charge(
        conn,
        m.user,
        meter.measured_us,
        at,
        meter.billable_bytes,
        price_micro(storage),
        now_us,
        trial_micro,
    )
    moved = conn.execute(
        update(StorageMeter)
        .where(StorageMeter.user == m.user, StorageMeter.measured_us == meter.measured_us)
        .values(**values)
    ).rowcount
    if moved != 1:  # another pull took this home meanwhile: this one's charge rolls back
        raise ledger.IdempotencyConflict(f"the storage meter of {m.user} moved meanwhile")
    return posted


@dataclass
class PullResult:
    homes: int = 0
    released: int = 0
    posted_micro: int = 0
    failed: int = 0


def apply_scan(
    engine: Engine,
    storage: Storage,
    scan_us: int,
    homes: list[Measurement],
    now_us: int,
    trial_micro: int = 0,
) -> PullResult:
    """Take a scan: each home in its own transaction (one user's failure charges nobody twice
    and holds up nobody else); homes metered before that the scan no longer lists are held at
    their level until the scan, then at 0."""
    out = PullResult()
    seen = set()
    for m in homes:
        seen.add(m.user)
        try:
            with engine.begin() as conn:
                out.posted_micro += record(conn, storage, m, now_us, trial_micro)
            out.homes += 1
        except Exception:
            out.failed += 1
            log.exception("storage of %s not charged this time", m.user)
    with engine.connect() as conn:
        gone = conn.execute(
            select(StorageMeter.user).where(
                StorageMeter.billable_bytes > 0, StorageMeter.measured_us < scan_us
            )
        ).scalars()
        gone = [u for u in gone if u not in seen]
    for user in gone:
        try:
            with engine.begin() as conn:
                out.posted_micro += record(
                    conn, storage, Measurement(user, scan_us, 0, 0, 0), now_us, trial_micro
                )
            out.released += 1
        except Exception:
            out.failed += 1
            log.exception("storage of %s (no longer listed) not charged this time", user)
    return out


# ---- what statements show -------------------------------------------------------------------


def _gb_days(byte_us: int) -> Decimal:
    return Decimal(byte_us) / (GIB * US_PER_DAY)


def usage(
    conn: Connection, storage: Storage, currency: str, user: str, from_us: int, to_us: int
) -> dict[str, Any]:
    """The usage API's ``storage``: one entry per UTC day of [from, to) with storage charged
    (GB-days above the free size and the amount, as posted), their total, and the home's latest
    measurement."""
    rows = conn.execute(
        select(StorageCharge)
        .where(
            StorageCharge.user == user,
            StorageCharge.day_us >= day_start(from_us),
            StorageCharge.day_us < to_us,
        )
        .order_by(StorageCharge.from_us)
    ).all()
    per_day: dict[int, list] = {}
    for r in rows:
        per_day.setdefault(r.day_us, []).append(r)
    days = []
    for day, pieces in sorted(per_day.items()):
        byte_us = sum(p.billable_bytes * (p.to_us - p.from_us) for p in pieces)
        days.append(
            {
                "date": day_name(day),
                "from": _iso(day),
                "to": _iso(day + DAY_US),
                "gb_days": str(_gb_days(byte_us).quantize(Decimal("0.000001"))),
                "seconds": sum(p.to_us - p.from_us for p in pieces) / MICRO,
                "amount": money_json(sum(p.charged_micro for p in pieces)),
            }
        )
    meter = conn.execute(select(StorageMeter).where(StorageMeter.user == user)).first()
    total = sum(r.charged_micro for r in rows)
    return {
        "currency": currency,
        "free_gb": str(storage.free_gb),
        "price_per_gb_day": str(storage.price_per_gb_day),
        "days": days,
        "gb_days": str(
            _gb_days(sum(r.billable_bytes * (r.to_us - r.from_us) for r in rows)).quantize(
                Decimal("0.000001")
            )
        ),
        "total": money_json(total),
        "home": None
        if meter is None
        else {
            "measured_at": _iso(meter.measured_us),
            "used_bytes": meter.used_bytes,
            "quota_bytes": meter.quota_bytes,
            "datasets_bytes": meter.datasets_bytes,
            "billable_bytes": meter.billable_bytes,
            "per_day": money_json(
                storage_micro(storage_exact(meter.billable_bytes, US_PER_DAY, price_micro(storage)))
            ),
        },
    }


def balance_json(
    conn: Connection, storage: Storage, currency: str, user: str, balance_micro: int
) -> tuple[dict[str, Any] | None, list[str]]:
    """The balance API's ``storage`` (what the home costs a day now, by its latest measurement;
    None before any) and its warning when the balance is used up while the home still costs."""
    meter = conn.execute(select(StorageMeter).where(StorageMeter.user == user)).first()
    if meter is None:
        return None, []
    per_day = storage_micro(storage_exact(meter.billable_bytes, US_PER_DAY, price_micro(storage)))
    out = {"billable_bytes": meter.billable_bytes, "per_day": money_json(per_day)}
    warnings = []
    if per_day and balance_micro <= 0:
        warnings.append(
            f"Your storage above the free {_gb(str(storage.free_gb))} GB costs {currency} "
            f"{format_money(per_day)} a day and your balance is used up: top up or lower your "
            "quota (nothing is deleted)."
        )
    return out, warnings


def pieces(conn: Connection, user: str, from_us: int, to_us: int) -> list[dict[str, Any]]:
    """Every charged piece of ``user``'s storage time overlapping [from, to), oldest first."""
    rows = conn.execute(
        select(StorageCharge)
        .where(
            StorageCharge.user == user,
            StorageCharge.to_us > from_us,
            StorageCharge.from_us < to_us,
        )
        .order_by(StorageCharge.from_us)
    ).all()
    return [
        {
            "from": r.from_us / MICRO,
            "to": r.to_us / MICRO,
            "date": day_name(r.day_us),
            "billable_bytes": r.billable_bytes,
            "price_per_gb_day": str(from_micro(r.price_micro)),
            "charged": money_json(r.charged_micro),
        }
        for r in rows
    ]


def with_storage(daily_json: list[dict[str, Any]], st: dict[str, Any]) -> list[dict[str, Any]]:
    """The usage API's ``daily`` (sessions' spend per day) with each day's storage added: what
    the statement page's chart draws, so that it shows all that was spent."""
    extra = {d["date"]: d["amount"]["micro"] for d in st.get("days", [])}
    out = []
    for d in daily_json:
        micro = d["micro"] + extra.pop(d["date"], 0)
        out.append({**d, "micro": micro, "amount": str(from_micro(micro))})
    for date, micro in extra.items():  # a storage day the list lacks (a trimmed long period)
        out.append({"date": date, "micro": micro, "amount": str(from_micro(micro)), "seconds": 0})
    return sorted(out, key=lambda d: d["date"])


def page_rows(usage_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The statement page's Storage rows, one per day: "Storage above 50 GB free: 12.0 GB-days"
    and the amount (``statements.page_rows`` sorts them in with the sessions)."""
    st = usage_json.get("storage") or {}
    out = []
    for d in st.get("days", []):
        gb_days = Decimal(d["gb_days"])
        out.append(
            {
                "kind": "storage",
                "date": d["date"],
                "label": f"Storage above {_gb(st['free_gb'])} GB free",
                "detail": f"{_gb_days_text(gb_days)} GB-days at {st['currency']} "
                f"{st['price_per_gb_day']}/GB-day",
                "amount": d["amount"],
            }
        )
    return out


def _gb(value: str) -> str:
    d = Decimal(value)
    return str(d.quantize(Decimal(1))) if d == d.to_integral_value() else str(d.normalize())


def _gb_days_text(gb_days: Decimal) -> str:
    """12.0, 0.250, 0.000043: a tenth where that says enough, else three significant digits."""
    if gb_days >= 1 or gb_days == 0:
        return f"{gb_days:.1f}"
    digits = max(3, 2 - gb_days.adjusted())
    return f"{gb_days:.{min(digits, 6)}f}"


def _iso(t_us: int) -> str:
    return datetime.fromtimestamp(t_us / MICRO, UTC).isoformat().replace("+00:00", "Z")


def money_json(micro: int) -> dict[str, Any]:
    return {"micro": micro, "exact": str(from_micro(micro)), "display": format_money(micro)}


# ---- the loop -------------------------------------------------------------------------------


class StorageMetering:
    """Pulls the hub's storage scan every ``storage_interval`` (jittered) and charges it."""

    def __init__(self, app: BillingService) -> None:
        self.app = app
        self._lock = asyncio.Lock()

    async def run(self) -> None:
        if self.app.storage_interval <= 0:
            return
        delay = random.uniform(0, 0.2) * self.app.storage_interval  # soon after a (re)start
        while True:
            await asyncio.sleep(delay)
            try:
                await self.pull()
            except Exception:
                log.exception("storage metering failed")
            delay = self.app.storage_interval * random.uniform(0.8, 1.2)

    async def pull(self) -> PullResult | None:
        """Read the hub's scan and charge it; None when the hub gave none."""
        async with self._lock:  # one pull at a time in this process (the loop, the API's nudge)
            try:
                code, body = await self.app.hub.request("GET", "/storage")
            except OSError as e:
                log.warning("storage metering: the hub is unreachable (%s)", e)
                return None
            if code != 200:
                log.warning("storage metering: the hub answered %s to GET /storage", code)
                return None
            scan_us, homes = parse_scan(body)
            app = self.app
            result = await app.run_db(
                apply_scan,
                app.engine,
                app.catalog.storage,
                scan_us,
                homes,
                time.time_ns() // 1000,
                app.trial_micro,
            )
            app.metrics.ingest.labels("storage").inc(result.homes + result.released)
            return result
