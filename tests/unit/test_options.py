"""The spawn contract, field by field, without a hub."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.options import OptionsError, options_from_form, parse_options

CATALOG = load_catalog()


def test_defaults_are_no_gpu_on_demand_base() -> None:
    o = parse_options({}, CATALOG)
    assert (o.image, o.gpu, o.gpus, o.datasets, o.pricing, o.max_price) == (
        "base",
        "none",
        0,
        (),
        "on-demand",
        None,
    )
    assert o.price_per_hour(CATALOG) == Decimal("0.09")
    assert o.label(CATALOG) == "No GPU"


def test_gpu_options_price_per_card() -> None:
    o = parse_options({"gpu": "a100-80g", "gpus": 2, "datasets": ["sklearn-toy"]}, CATALOG)
    assert o.gpu == "a100-80g" and o.gpus == 2
    assert o.price_per_hour(CATALOG) == Decimal("4.20")
    assert o.label(CATALOG) == "A100-80G x2"


def test_spot_bid_defaults_to_on_demand_price_and_accepts_numbers() -> None:
    assert parse_options({"gpu": "rtx-4090", "pricing": "spot"}, CATALOG).max_price == Decimal(
        "0.68"
    )
    assert parse_options(
        {"gpu": "rtx-4090", "pricing": "spot", "max_price": 0.4}, CATALOG
    ).max_price == Decimal("0.4")
    assert parse_options(
        {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.35"}, CATALOG
    ).max_price == Decimal("0.35")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ([], "user_options"),
        ({"gpu": 3}, "gpu"),
        ({"gpu": "a100-80g", "gpus": True}, "gpus"),
        ({"gpu": "a100-80g", "gpus": 1.5}, "gpus"),
        ({"gpu": "none", "gpus": 2}, "gpus"),
        ({"datasets": [1]}, "datasets"),
        ({"datasets": {"a": 1}}, "datasets"),
        ({"gpu": "a100-80g", "pricing": "spot", "max_price": float("nan")}, "max_price"),
        ({"gpu": "a100-80g", "pricing": "spot", "max_price": float("inf")}, "max_price"),
        ({"gpu": "a100-80g", "pricing": "spot", "max_price": True}, "max_price"),
        ({"gpu": "a100-80g", "pricing": "spot", "max_price": [1]}, "max_price"),
    ],
)
def test_bad_values_name_their_field(raw, field: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse_options(raw, CATALOG)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ")


def test_form_fields_become_the_json_contract() -> None:
    form = {
        "gpu": ["a100-80g"],
        "gpus": ["2"],
        "image": ["base"],
        "datasets": ["sklearn-toy"],
        "pricing": ["on-demand"],
        "max_price": ["1.5"],
    }
    raw = options_from_form(form)
    assert raw == {
        "gpu": "a100-80g",
        "gpus": "2",
        "image": "base",
        "pricing": "on-demand",
        "datasets": ["sklearn-toy"],
    }
    assert parse_options(raw, CATALOG).gpus == 2
    spot = options_from_form({**form, "pricing": ["spot"]})
    assert parse_options(spot, CATALOG).max_price == Decimal("1.5")


def test_form_with_no_gpu_ignores_the_card_count_field() -> None:
    raw = options_from_form({"gpu": ["none"], "gpus": ["1"], "image": ["base"]})
    assert parse_options(raw, CATALOG).gpu == "none"
