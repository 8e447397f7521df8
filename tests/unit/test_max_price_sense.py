"""Issue 22 (bad input is never silently "fixed"): the one reader of a spot max price refuses
what it cannot read and asks for a confirmation above ten times on-demand; every refusal carries
the API's text (field names) and a plain one for people.

Points covered: a max price of ``abc``, a negative one, NaN/inf, an absurd exponent (``1e999999``,
which Decimal reads as a finite number) are refused naming ``max_price``; 1e20 is refused
outright; 9 for an RTX 4090 (0.68/h) needs ``confirm_max_price``; the plain texts speak no API
(``gpu: "none"``, ``"wait": true``, ``max_price``).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.market.admission import refused, spot_problems
from gpulab.spawners.node.allocator import GpuAllocator, NoCapacity
from gpulab.spawners.node.inventory import parse_simulate_spec, simulated_devices
from gpulab.spawners.options import OptionsError, parse_options

CATALOG = load_catalog()
SPOT = {"gpu": "rtx-4090", "pricing": "spot"}


@pytest.mark.parametrize(
    "value",
    # The last five were read by Decimal() as 1, 3, 100, 10 and 1 (attack wave F8).
    [
        *("abc", "-1", "0", "NaN", "Infinity", "1e999999", "1e-9", " ", [], True),
        *("\uff11", "\u0663", "\U0001d7cf\U0001d7ce\U0001d7ce", "1_0", "+1"),
    ],
)
def test_unreadable_max_price_is_refused_naming_the_field(value) -> None:
    with pytest.raises(OptionsError) as e:
        parse_options({**SPOT, "max_price": value}, CATALOG)
    assert e.value.field == "max_price" and str(e.value).startswith("max_price:")
    assert "max_price" not in e.value.human and "max price" in e.value.human.lower()


def test_absurd_max_price_is_refused_even_confirmed() -> None:
    for value in ("9999", 1e8, "100000000"):
        with pytest.raises(OptionsError) as e:
            parse_options({**SPOT, "max_price": value, "confirm_max_price": True}, CATALOG)
        assert e.value.field == "max_price" and e.value.confirm is None
        assert "at most" in str(e.value) and "Enter at most CNY 680.00" in e.value.human
    for value in ("1e20", 1e9, "1e999999"):
        with pytest.raises(OptionsError) as e:
            parse_options({**SPOT, "max_price": value, "confirm_max_price": True}, CATALOG)
        assert e.value.field == "max_price" and e.value.confirm is None
        assert "digits" in str(e.value) and "sensible amount" in e.value.human
        assert len(e.value.human) < 200  # never the number written out


def test_max_price_above_ten_times_on_demand_needs_a_confirmation() -> None:
    with pytest.raises(OptionsError) as e:
        parse_options({**SPOT, "max_price": "9"}, CATALOG)
    assert e.value.details() == {"field": "max_price", "confirm": "confirm_max_price"}
    assert '"confirm_max_price": true' in str(e.value)
    assert "more than ten times" in e.value.human and "Confirm it" in e.value.human
    o = parse_options({**SPOT, "max_price": "9", "confirm_max_price": True}, CATALOG)
    assert o.max_price == Decimal("9") and o.confirm_max_price is True
    # Saved and restored (a hub restart, JupyterHub's respawn with the last options) as made.
    assert parse_options(o.to_json(), CATALOG) == o
    # Ten times exactly is a bid like any other.
    assert parse_options({**SPOT, "max_price": "6.80"}, CATALOG).max_price == Decimal("6.80")
    with pytest.raises(OptionsError) as e:
        parse_options({"gpu": "rtx-4090", "confirm_max_price": True}, CATALOG)
    assert e.value.field == "confirm_max_price"


def test_refusals_speak_plainly_to_people(tmp_path: Path) -> None:
    problems = spot_problems(
        "rtx-4090",
        Decimal("0.5"),
        Decimal("0.01"),
        1,
        {"free": 2, "total": 2},
        False,
        False,
        "",
        False,
        "CNY",
    )
    answer = refused(problems, Decimal("0.5"), "CNY")
    assert '"wait": true in the API' in answer.message and "max_price" in answer.message
    assert "max_price" not in answer.human and '"wait"' not in answer.human
    assert "Your spot server did not start" in answer.human

    devices = simulated_devices(parse_simulate_spec("A100-80G:1,RTX-4090:1", CATALOG), CATALOG, 0)
    allocator = GpuAllocator(devices, tmp_path / "ledger.json")
    allocator.allocate("a/", "a100-80g", 1)
    with pytest.raises(NoCapacity) as full:
        allocator.allocate("b/", "a100-80g", 1)
    assert 'no-GPU mode (gpu: "none") is always available' in str(full.value)
    assert '(gpu: "none")' not in full.value.human
    assert "rtx-4090 x1" in full.value.human and "without a GPU" in full.value.human

    with pytest.raises(OptionsError) as e:
        parse_options({"app": "sd-webui", "gpu": "none"}, CATALOG)
    assert "gpu" in str(e.value) and "'none'" in str(e.value)
    assert "'none'" not in e.value.human and "No GPU" in e.value.human
