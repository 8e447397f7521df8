"""The market's pure core and its durable price history, without a hub."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from gpulab.catalog import load_catalog
from gpulab.catalog.price_history import PriceHistory, price_at
from gpulab.spawners.local.checkpoint import run_checkpoint
from gpulab.spawners.market.core import (
    REASON_HOLD,
    REASON_ON_DEMAND,
    REASON_PRICE,
    REASON_WINDOW,
    Order,
    Schedule,
    TypeBook,
    decide,
    spot_price,
    utilization,
)
from gpulab.spawners.market.preemption import catches, sign
from gpulab.spawners.options import OptionsError, options_from_form, parse_options

CATALOG = load_catalog()
A100 = CATALOG.gpu_types["a100-80g"]


# ---- prices ------------------------------------------------------------------------------------


@pytest.mark.parametrize("u", [0.0, 0.1, 0.5, 0.9, 1.0, -3.0, 7.0])
@pytest.mark.parametrize("low", [False, True])
def test_price_stays_between_floor_and_on_demand(u: float, low: bool) -> None:
    for gt in CATALOG.gpu_types.values():
        p = spot_price(gt.spot_floor_price, gt.on_demand_price, u, low)
        assert isinstance(p, Decimal)
        assert gt.spot_floor_price <= p <= gt.on_demand_price
        assert p == p.quantize(Decimal("0.01"))


def test_price_rises_with_utilization_and_falls_in_windows() -> None:
    floor, od = A100.spot_floor_price, A100.on_demand_price
    assert spot_price(floor, od, 0.0, False) == floor  # idle pool: the floor (0.90)
    assert spot_price(floor, od, 1.0, False) == od  # full pool: on-demand (2.10)
    assert spot_price(floor, od, 0.5, False) == Decimal("1.20")  # 0.90 + 1.20 * 0.25
    assert spot_price(floor, od, 1.0, True) == Decimal("1.50")  # premium halved in a window
    prices = [spot_price(floor, od, u / 10, False) for u in range(11)]
    assert prices == sorted(prices)


def test_utilization_counts_queued_demand() -> None:
    assert utilization(4, 4, 0) == 0.0
    assert utilization(4, 2, 0) == 0.5
    assert utilization(4, 2, 1) == 0.75
    assert utilization(4, 0, 10) == 1.0
    assert utilization(0, 0, 0) == 1.0


def test_schedule_windows_cross_midnight_and_weekends() -> None:
    s = Schedule.parse(["18:00-09:00"], weekends=True)
    tz = ZoneInfo("Asia/Shanghai")
    monday = datetime(2026, 11, 30, tzinfo=tz)
    assert s.is_low(monday.replace(hour=8, minute=59))
    assert not s.is_low(monday.replace(hour=9))
    assert not s.is_low(monday.replace(hour=17, minute=59))
    assert s.is_low(monday.replace(hour=18))
    assert s.is_low(monday.replace(hour=23, minute=30))
    saturday_noon = datetime(2026, 12, 5, 12, tzinfo=tz)
    assert s.is_low(saturday_noon)
    assert not Schedule.parse(["18:00-09:00"], weekends=False).is_low(saturday_noon)
    assert Schedule.parse(["12:00-13:00"]).is_low(monday.replace(hour=12, minute=30))
    # The same instant is in or out of the window depending on the operator's zone.
    instant = datetime(2026, 11, 30, 12, tzinfo=ZoneInfo("UTC"))  # 20:00 in Shanghai
    assert s.is_low(instant.astimezone(tz)) and not s.is_low(instant)
    # Seconds are optional: a window may end between whole minutes.
    short = Schedule.parse(["12:00:00-12:00:30"], weekends=False)
    assert short.is_low(monday.replace(hour=12, second=29))
    assert not short.is_low(monday.replace(hour=12, second=30))


@pytest.mark.parametrize(
    "bad", ["18-09", "25:00-09:00", "18:00-9:00", "18:00 09:00", "18:00:60-09:00", "18:00:5-09:00"]
)
def test_schedule_rejects_bad_windows(bad: str) -> None:
    with pytest.raises(ValueError, match="HH:MM-HH:MM"):
        Schedule.parse([bad])


# ---- matching ----------------------------------------------------------------------------------


def spot_order(owner: str, bid: str, created: float = 0.0, cards: int = 1, windows=False) -> Order:
    return Order(owner, "a100-80g", cards, "spot", Decimal(bid), windows, created)


def test_price_above_bid_preempts_and_falling_back_cancels() -> None:
    book = TypeBook()
    for owner, bid in [("a/", "1.00"), ("b/", "1.50"), ("c/", "2.00")]:
        book.add_running(spot_order(owner, bid))
    d = decide(book, free=0, price=Decimal("1.50"), low_window=False)
    assert d.preempt == [("a/", REASON_PRICE)]  # a bid equal to the price keeps running
    book.preempting["a/"] = REASON_PRICE
    assert decide(book, 0, Decimal("1.50"), False).preempt == []
    d = decide(book, 0, Decimal("0.95"), False)
    assert d.cancel == ["a/"] and d.preempt == []


def test_on_demand_reclaims_lowest_bid_and_counts_cards_already_leaving() -> None:
    book = TypeBook()
    for i, (owner, bid) in enumerate([("hi/", "1.90"), ("lo/", "1.10"), ("mid/", "1.50")]):
        book.add_running(spot_order(owner, bid, created=i))
    book.add_queued(Order("od/", "a100-80g", 1, "on-demand", None, False, 10))
    d = decide(book, free=0, price=Decimal("0.90"), low_window=False)
    assert d.preempt == [("lo/", REASON_ON_DEMAND)] and d.starts == []
    book.preempting["lo/"] = REASON_ON_DEMAND
    d = decide(book, free=0, price=Decimal("0.90"), low_window=False)
    assert d.preempt == [] and d.cancel == []  # not cancelled by a low price: it was reclaimed
    book.remove("lo/")
    d = decide(book, free=1, price=Decimal("0.90"), low_window=False)
    assert [o.owner for o in d.starts] == ["od/"]


def test_a_reclaim_no_longer_needed_is_called_off() -> None:
    book = TypeBook()
    book.add_running(spot_order("lo/", "1.10"))
    book.add_running(spot_order("hi/", "1.90"))
    book.add_queued(Order("od/", "a100-80g", 1, "on-demand", None, False, 10))
    book.preempting["lo/"] = REASON_ON_DEMAND
    assert decide(book, 0, Decimal("0.90"), False).cancel == []
    book.remove("od/")  # the on-demand user cancelled
    assert decide(book, 0, Decimal("0.90"), False).cancel == ["lo/"]
    # ... unless the price has meanwhile risen above the bid: then it keeps leaving.
    assert decide(book, 0, Decimal("1.20"), False).cancel == []


def test_queued_spot_starts_by_highest_bid_within_price_and_windows() -> None:
    book = TypeBook()
    book.add_queued(spot_order("cheap/", "1.00", 1))
    book.add_queued(spot_order("rich/", "2.00", 2))
    book.add_queued(spot_order("night/", "1.80", 0, windows=True))
    book.add_queued(spot_order("big/", "1.90", 3, cards=4))
    d = decide(book, free=2, price=Decimal("1.20"), low_window=False)
    assert [o.owner for o in d.starts] == ["rich/"]  # big/ does not fit, night/ waits
    d = decide(book, free=2, price=Decimal("1.20"), low_window=True)
    assert [o.owner for o in d.starts] == ["rich/", "night/"]
    d = decide(book, free=8, price=Decimal("2.10"), low_window=True)
    assert d.starts == []
    # While an on-demand request waits for this type, no spot request jumps ahead of it.
    book.add_queued(Order("od/", "a100-80g", 4, "on-demand", None, False, 5))
    d = decide(book, free=2, price=Decimal("1.20"), low_window=True)
    assert d.starts == []


def test_window_end_preempts_window_only_servers() -> None:
    book = TypeBook()
    book.add_running(spot_order("night/", "2.00", windows=True))
    book.add_running(spot_order("any/", "2.00"))
    assert decide(book, 0, Decimal("1.00"), low_window=True).preempt == []
    d = decide(book, 0, Decimal("1.00"), low_window=False)
    assert d.preempt == [("night/", REASON_WINDOW)]
    book.preempting["night/"] = REASON_WINDOW
    assert decide(book, 0, Decimal("1.00"), low_window=True).cancel == ["night/"]


def test_book_removal_keeps_aggregates() -> None:
    book = TypeBook()
    book.add_running(spot_order("r/", "1.00", cards=2))
    book.add_queued(spot_order("q/", "1.00", cards=3))
    book.add_queued(Order("od/", "a100-80g", 1, "on-demand", None, False, 0))
    assert (book.running_cards, book.queued_cards) == (2, 4)
    assert book.is_running("r/") and not book.is_running("q/")
    for owner in ("r/", "q/", "od/"):
        assert book.remove(owner) is not None
    assert (book.running_cards, book.queued_cards) == (0, 0)
    assert not (book.running or book.queued or book.queued_on_demand or book.orders)
    assert book.remove("r/") is None


# ---- history -----------------------------------------------------------------------------------


def test_history_records_changes_only_and_survives_a_torn_line(tmp_path) -> None:
    path = tmp_path / "spot" / "spot-prices.jsonl"
    h = PriceHistory(path)
    assert h.record("a100-80g", 100.0, Decimal("0.90"))
    assert not h.record("a100-80g", 110.0, Decimal("0.90"))
    assert h.record("a100-80g", 120.0, Decimal("1.25"))
    with open(path, "a") as f:
        f.write('{"t": 130.0, "gpu_type": "a100-80g", "pri')  # a crash mid-write
    again = PriceHistory(path)
    assert again.price_at("a100-80g", 99.9) is None
    assert again.price_at("a100-80g", 100.0) == Decimal("0.90")
    assert again.price_at("a100-80g", 119.999) == Decimal("0.90")
    assert again.price_at("a100-80g", 500.0) == Decimal("1.25")
    assert again.changes("a100-80g", 110.0) == [
        {"t": 100.0, "price": "0.90"},
        {"t": 120.0, "price": "1.25"},
    ]
    assert price_at("a100-80g", 121.0, tmp_path) == Decimal("1.25")
    with pytest.raises(LookupError):
        price_at("a100-80g", 50.0, tmp_path)
    with pytest.raises(LookupError):
        price_at("rtx-4090", 150.0, tmp_path)


def test_price_change_is_on_disk_before_record_returns(tmp_path) -> None:
    """A writer SIGKILLed right after recording: the price is in the file."""
    code = (
        "import os, signal, sys; from decimal import Decimal;"
        "from gpulab.catalog.price_history import PriceHistory;"
        f"h = PriceHistory({str(tmp_path / 'p.jsonl')!r});"
        "h.record('rtx-4090', 1000.0, Decimal('0.42'));"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run([sys.executable, "-c", code])
    assert proc.returncode == -signal.SIGKILL
    rec = json.loads((tmp_path / "p.jsonl").read_text())
    assert rec == {"t": 1000.0, "gpu_type": "rtx-4090", "price": "0.42"}


# ---- options and helpers -----------------------------------------------------------------------


def test_spot_wait_options() -> None:
    o = parse_options(
        {"gpu": "a100-80g", "pricing": "spot", "max_price": "1.2", "wait": "true"}, CATALOG
    )
    assert o.wait is True and o.windows_only is False and o.max_price == Decimal("1.2")
    assert o.to_json()["wait"] is True
    with pytest.raises(OptionsError) as e:
        parse_options({"gpu": "a100-80g", "windows_only": True}, CATALOG)
    assert e.value.field == "windows_only"
    form = options_from_form(
        {"gpu": ["a100-80g"], "pricing": ["spot"], "max_price": ["1"], "windows_only": ["true"]}
    )
    assert form["windows_only"] == "true"
    assert "wait" not in options_from_form({"gpu": ["a100-80g"], "wait": ["true"]})


def test_signature_and_sigcgt() -> None:
    assert sign(b"{}", "k") == "sha256=" + (
        __import__("hmac").new(b"k", b"{}", "sha256").hexdigest()
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import gpulab_spot, sys, time; gpulab_spot.on_preempt(lambda i: None); "
            "print('ready', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "JUPYTERHUB_API_URL": ""},
    )
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc.stdout.readline().strip() == b"ready"
        assert catches(proc.pid)
        assert not catches(plain.pid)
    finally:
        proc.kill()
        plain.kill()
        proc.wait()
        plain.wait()


def test_local_checkpoint_is_killed_with_its_children_at_the_limit(tmp_path) -> None:
    """A checkpoint command that outlives its limit is stopped, children included, and says so."""
    pid_file = tmp_path / "child.pid"
    started: list[dict] = []
    result = asyncio.run(
        run_checkpoint(
            f"sleep 60 & echo $! > {pid_file}; echo saving; wait",
            str(tmp_path),
            {"PATH": os.environ["PATH"]},
            limit=1,
            on_start=started.append,
        )
    )
    assert started and started[0]["state"] == "running" and started[0]["pid"] > 0
    assert result["exit_code"] is None and result["error"] == "timed out after 1s"
    assert result["state"] == "failed"
    assert "saving" in open(result["log"]).read()
    child = int(pid_file.read_text())
    try:
        os.kill(child, 0)
        alive = open(f"/proc/{child}/stat").read().split()[2] != "Z"
    except ProcessLookupError:
        alive = False
    assert not alive, "the command's child outlived the checkpoint's limit"


def test_cards_a_hold_needs_reclaim_the_lowest_bids_until_no_longer_needed() -> None:
    book = TypeBook()
    for i, (owner, bid) in enumerate([("hi/", "1.90"), ("lo/", "1.10"), ("mid/", "1.50")]):
        book.add_running(spot_order(owner, bid, created=i))
    d = decide(book, free=0, price=Decimal("0.90"), low_window=False, held_need=2)
    assert d.preempt == [("lo/", REASON_HOLD), ("mid/", REASON_HOLD)]
    book.preempting["lo/"] = REASON_HOLD
    book.preempting["mid/"] = REASON_HOLD
    assert decide(book, 0, Decimal("0.90"), False, held_need=2).preempt == []
    # The lab session was cancelled: the warnings are called off.
    assert sorted(decide(book, 0, Decimal("0.90"), False, held_need=0).cancel) == ["lo/", "mid/"]
