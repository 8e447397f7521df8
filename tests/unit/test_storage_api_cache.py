"""The storage API's measurements (hub_config/api/storage.py: StorageAPI) on a real home store.

Issue 23, "visible", attack: a user (or many pages at once) refreshes the storage figure of a big
home again and again, so that the hub walks it continuously. Callers asking while a measurement
runs share it, and a figure is reused for ``cache_seconds`` (it says when it was measured). Before
this, there was no storage API; checked by reverting each in ``StorageAPI``: without the sharing
the storm below measures 20 times, without the reuse the next ask measures again.

Also the quota parser's refusals (each names what is allowed) and the storage price.
"""

from __future__ import annotations

import asyncio
import threading
from decimal import Decimal

import pytest

from gpulab.catalog.models import Storage
from gpulab.catalog.pricing import storage_quote
from gpulab.hub_config.api.storage import StorageAPI, notice, parse_quota_gb
from gpulab.spawners.storage.homes import HomeStore


class CountingStore(HomeStore):
    """A real directory-backed store that counts its measurements and can hold them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, mode="directory", **kwargs)
        self.measured = 0
        self.release = threading.Event()
        self.release.set()

    def usage(self, name, quotas=None):
        self.measured += 1
        assert self.release.wait(30)
        return super().usage(name)


def test_a_refresh_storm_measures_a_home_once(tmp_path) -> None:
    store = CountingStore(tmp_path, Storage())
    (store.ensure("alice") / "data.bin").write_bytes(b"x" * 100_000)
    api = StorageAPI(cache_seconds=60)

    async def storm() -> list:
        store.release.clear()  # the first measurement is held until every caller has asked
        tasks = [asyncio.ensure_future(api.usage(store, "alice")) for _ in range(20)]
        await asyncio.sleep(0)  # every task has started and found the measurement running
        store.release.set()
        return await asyncio.gather(*tasks)

    answers = asyncio.run(storm())
    assert store.measured == 1
    assert len({a.measured_at for a in answers}) == 1 and answers[0].used_bytes >= 100_000

    # Within cache_seconds the same figure comes back, with the time it was measured.
    again = asyncio.run(api.usage(store, "alice"))
    assert store.measured == 1 and again.measured_at == answers[0].measured_at
    # A quota change measures afresh (fresh=True), whatever the cache holds.
    asyncio.run(api.usage(store, "alice", fresh=True))
    assert store.measured == 2


def test_without_a_cache_every_ask_measures(tmp_path) -> None:
    store = CountingStore(tmp_path, Storage())
    store.ensure("bob")
    api = StorageAPI(cache_seconds=0)
    for _ in range(3):
        asyncio.run(api.usage(store, "bob"))
    assert store.measured == 3


@pytest.mark.parametrize(
    "value",
    ["1", True, None, [1], float("nan"), float("inf"), 0, -1, 0.1234567, 1e-7],
)
def test_quota_gb_must_be_a_plain_number_of_gb(value) -> None:
    with pytest.raises(ValueError, match="must be"):
        parse_quota_gb(value)


def test_quota_gb_accepts_whole_and_decimal_gb() -> None:
    assert parse_quota_gb(100) == Decimal(100)
    assert parse_quota_gb(62.5) == Decimal("62.5")
    assert parse_quota_gb(0.0625) == Decimal("0.0625")
    assert parse_quota_gb(1.100000) == Decimal("1.1")


def test_notices_and_prices() -> None:
    assert notice(79.9, True) is None
    assert notice(80, True)["level"] == "warn"
    critical = notice(95, True)
    assert critical["level"] == "critical" and "No space left on device" in critical["text"]
    assert "No space" not in notice(96, False)["text"]  # not enforced: no such promise
    s = Storage()  # 50 GB free, 0.01 per GB-day
    assert storage_quote(s, 50 * 2**30).per_day == 0
    assert storage_quote(s, 60 * 2**30).per_day == Decimal("0.10")
    # A home holding more than its quota (not enforced) is billed for what it holds.
    assert storage_quote(s, 50 * 2**30, 70 * 2**30).billable_bytes == 20 * 2**30
