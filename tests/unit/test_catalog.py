"""The catalog: the shipped default is valid, and every mistake names its key and the choices."""

from __future__ import annotations

import os
import tomllib
from decimal import Decimal

import pytest

from gpulab.catalog import DEFAULT_CATALOG, CatalogError, load_catalog, parse_catalog


def default_data() -> dict:
    return tomllib.loads(DEFAULT_CATALOG.read_text())


def test_default_catalog_has_the_documented_prices() -> None:
    c = load_catalog()
    assert c.currency == "CNY"
    assert c.trial_credit == Decimal("10.00")
    assert c.no_gpu.price_per_hour == Decimal("0.09")
    prices = {s: (g.on_demand_price, g.spot_floor_price) for s, g in c.gpu_types.items()}
    assert prices == {
        "rtx-4090": (Decimal("0.68"), Decimal("0.30")),
        "rtx-3090-ti": (Decimal("0.52"), Decimal("0.25")),
        "a100-80g": (Decimal("2.10"), Decimal("0.90")),
        "h100-80g": (Decimal("3.80"), Decimal("2.00")),
    }
    assert "base" in c.images


def test_education_prices_are_below_on_demand_and_optional() -> None:
    c = load_catalog()
    edu = {s: g.education_price for s, g in c.gpu_types.items()}
    assert edu == {
        "rtx-4090": Decimal("0.48"),
        "rtx-3090-ti": Decimal("0.36"),
        "a100-80g": Decimal("1.50"),
        "h100-80g": Decimal("2.80"),
    }
    assert all(g.course_price < g.on_demand_price for g in c.gpu_types.values())
    assert c.no_gpu.course_price == Decimal("0.05") < c.no_gpu.price_per_hour
    # Without them, a course pays the on-demand price.
    data = default_data()
    del data["gpu_types"]["a100-80g"]["education_price"]
    del data["no_gpu"]["education_price_per_hour"]
    plain = parse_catalog(data)
    assert plain.gpu_types["a100-80g"].course_price == Decimal("2.10")
    assert plain.no_gpu.course_price == Decimal("0.09")


def test_offline_dataset_resolves_to_real_files() -> None:
    ds = load_catalog().datasets["sklearn-toy"]
    src = ds.resolve_source()
    assert (src / "iris.csv").read_text().count("\n") >= 150
    assert ds.read_only


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["gpu_types"]["a100-80g"].update(colour="red"),
            "gpu_types.a100-80g.colour: unknown key; allowed keys: display_name, vram_gb, on_demand_price",
        ),
        (
            lambda d: d["gpu_types"]["a100-80g"].pop("on_demand_price"),
            "gpu_types.a100-80g.on_demand_price: required key is missing",
        ),
        (
            lambda d: d["gpu_types"]["a100-80g"].update(on_demand_price="-1"),
            "gpu_types.a100-80g.on_demand_price",
        ),
        (
            lambda d: d["gpu_types"]["a100-80g"].update(spot_floor_price="9"),
            "must not exceed on_demand_price",
        ),
        (
            lambda d: d["gpu_types"]["a100-80g"].update(education_price="9"),
            "gpu_types.a100-80g: education_price (9) must not exceed on_demand_price (2.10)",
        ),
        (
            lambda d: d["gpu_types"]["a100-80g"].update(education_price="-1"),
            "gpu_types.a100-80g.education_price",
        ),
        (
            lambda d: d["gpu_types"]["a100-80g"].update(monthly_price="2.50"),
            "gpu_types.a100-80g: monthly_price (2.50) must not exceed on_demand_price (2.10)",
        ),
        (
            lambda d: d["no_gpu"].update(education_price_per_hour="1"),
            "no_gpu: education_price_per_hour (1) must not exceed price_per_hour (0.09)",
        ),
        (
            lambda d: d["gpu_types"].update({"A100-80G": d["gpu_types"]["a100-80g"]}),
            "gpu_types.A100-80G: slugs are lowercase",
        ),
        (
            lambda d: d["images"]["base"].update(gpu_types=["tpu"]),
            "images.base.gpu_types: unknown GPU type 'tpu'; allowed: none, rtx-4090",
        ),
        (lambda d: d.update(currency="yuan"), "currency"),
        (lambda d: d["no_gpu"].update(mem="lots"), "no_gpu.mem: must look like '4G'"),
        (
            lambda d: d["datasets"]["sklearn-toy"].update(read_only=False),
            "always mounted read-only",
        ),
        (
            lambda d: d.update(extra_section={}),
            "extra_section: unknown key; allowed keys: currency, trial_credit",
        ),
    ],
)
def test_bad_catalog_names_the_key(mutate, expected: str) -> None:
    data = default_data()
    mutate(data)
    with pytest.raises(CatalogError) as e:
        parse_catalog(data, "catalog.toml")
    assert expected in str(e.value)
    assert str(e.value).startswith("catalog.toml: ")


def test_unreadable_catalog_files(tmp_path) -> None:
    with pytest.raises(CatalogError, match="not found"):
        load_catalog(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("currency = ")
    with pytest.raises(CatalogError, match="not valid TOML"):
        load_catalog(bad)


def test_public_catalog_hides_host_paths() -> None:
    public = load_catalog().public()
    assert "source" not in public["datasets"]["sklearn-toy"]
    assert public["gpu_types"]["a100-80g"]["on_demand_price"] == "2.10"


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is for root hubs")
def test_a_root_hub_refuses_a_local_app_on_a_tcp_port() -> None:
    """A local app on a loopback TCP port could be driven by every account on a root hub's node,
    without logging in: its ``local_command`` must listen on ``{unix_socket}``."""
    data = default_data()
    data["apps"]["tensorboard"]["local_command"] = [
        "tensorboard",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
    ]
    with pytest.raises(CatalogError) as e:
        parse_catalog(data, "catalog.toml")
    message = str(e.value)
    assert "apps.tensorboard.local_command: listens on a TCP port" in message
    assert "{unix_socket}" in message
    # On a Unix socket it is accepted.
    data["apps"]["tensorboard"]["local_command"] = ["tb-on-socket", "--socket", "{unix_socket}"]
    assert parse_catalog(data).apps["tensorboard"].local_command[-1] == "{unix_socket}"
