"""Apps in the catalog, the ``app`` spawn option and the launch plan: which server a one-click
launch starts, and what a refusal tells the user to pick instead."""

from __future__ import annotations

import tomllib
from decimal import Decimal

import pytest

from gpulab.catalog import DEFAULT_CATALOG, CatalogError, load_catalog, parse_catalog
from gpulab.hub_config.launch_plan import LaunchRefused, plan_launch
from gpulab.spawners.apps import server_proxy_entry
from gpulab.spawners.options import OptionsError, app_gpu_types, parse_options

CATALOG = load_catalog()
SD = CATALOG.apps["sd-webui"]


def counts(**free: int) -> dict[str, dict[str, int]]:
    return {slug.replace("_", "-"): {"free": n, "total": max(n, 2)} for slug, n in free.items()}


def test_shipped_apps_and_model_store() -> None:
    assert list(CATALOG.apps) == ["jupyterlab", "sd-webui", "comfyui", "tensorboard", "vscode"]
    assert SD.ready_path == "/sdapi/v1/options" and SD.image == "sd-webui" and SD.uses_models
    assert CATALOG.apps["jupyterlab"].is_server and not SD.is_server
    assert SD.url_path("/user/ann/") == "/user/ann/sd-webui/"
    assert SD.ready_url_path("/user/ann/") == "/user/ann/sd-webui/sdapi/v1/options"
    assert CATALOG.models["tiny-sd"].source == "data:models/tiny-sd"
    # Commands are the operator's business, not every user's: the public catalog leaves them out.
    public = CATALOG.public()["apps"]["sd-webui"]
    assert "command" not in public and "local_command" not in public


def test_a_catalog_without_apps_still_launches_jupyterlab() -> None:
    data = tomllib.loads(DEFAULT_CATALOG.read_text())
    del data["apps"]
    assert list(parse_catalog(data).apps) == ["jupyterlab"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["apps"]["sd-webui"].update(image="nope"),
            "apps.sd-webui.image: unknown image",
        ),
        (lambda d: d["apps"]["sd-webui"].update(gpu_types=["x"]), "apps.sd-webui.gpu_types"),
        (lambda d: d["apps"]["sd-webui"].update(command=["a", "{bogus}"]), "{bogus}"),
        (lambda d: d["apps"]["sd-webui"].update(ready_path="sdapi"), "must start with '/'"),
        (lambda d: d["apps"].pop("jupyterlab"), "the default app 'jupyterlab'"),
        (lambda d: d["models"]["tiny-sd"].update(kind="onnx"), "allowed: diffusers, checkpoint"),
        (lambda d: d["apps"]["sd-webui"].update(colour="red"), "apps.sd-webui.colour: unknown key"),
    ],
)
def test_bad_app_entries_name_the_key(mutate, expected: str) -> None:
    data = tomllib.loads(DEFAULT_CATALOG.read_text())
    mutate(data)
    with pytest.raises(CatalogError, match="catalog") as e:
        parse_catalog(data)
    assert expected in str(e.value)


def test_app_option_defaults_its_image_and_checks_the_gpu() -> None:
    opts = parse_options({"app": "sd-webui", "gpu": "rtx-4090"}, CATALOG)
    assert (opts.app, opts.image) == ("sd-webui", "sd-webui")
    assert parse_options({}, CATALOG).app == "jupyterlab"
    with pytest.raises(OptionsError) as e:
        parse_options({"app": "sd-webui"}, CATALOG)
    assert e.value.field == "gpu" and "rtx-4090" in str(e.value)
    with pytest.raises(OptionsError) as e:
        parse_options({"app": "sd-webui", "gpu": "rtx-4090", "image": "base"}, CATALOG)
    assert e.value.field == "image" and "'sd-webui'" in str(e.value)
    with pytest.raises(OptionsError) as e:
        parse_options({"app": "paint"}, CATALOG)
    assert e.value.field == "app" and "jupyterlab, sd-webui" in str(e.value)


def test_vram_decides_which_types_an_app_fits() -> None:
    data = tomllib.loads(DEFAULT_CATALOG.read_text())
    data["gpu_types"]["t4"] = {
        "display_name": "T4",
        "vram_gb": 8,
        "on_demand_price": "0.10",
        "spot_floor_price": "0.05",
        "cpus_per_card": 4,
        "mem_per_card": "16G",
    }
    catalog = parse_catalog(data)
    sd = catalog.apps["sd-webui"]
    assert "t4" not in app_gpu_types(sd, catalog)
    with pytest.raises(OptionsError) as e:
        parse_options({"app": "sd-webui", "gpu": "t4"}, catalog)
    assert "at least 12 GB" in str(e.value)
    # The cheap small card is free and the fitting ones are busy: refused, naming both.
    with pytest.raises(LaunchRefused) as r:
        plan_launch(sd, catalog, counts(t4=1, rtx_4090=0, rtx_3090_ti=0), {}, {})
    assert r.value.status == 409
    assert "RTX 4090 0/2 free" in str(r.value) and "T4 (8 GB)" in str(r.value)


def test_launch_picks_the_cheapest_free_card_that_fits() -> None:
    options, choice = plan_launch(
        SD, CATALOG, counts(rtx_4090=1, rtx_3090_ti=1, a100_80g=1), {}, {}
    )
    assert options == {"app": "sd-webui", "pricing": "on-demand", "gpu": "rtx-3090-ti"}
    assert choice.price == Decimal("0.52")
    _, choice = plan_launch(SD, CATALOG, counts(rtx_4090=2, rtx_3090_ti=0, a100_80g=1), {}, {})
    assert choice.gpu == "rtx-4090"
    # JupyterLab and TensorBoard run without a GPU: the cheapest is no-GPU mode.
    _, choice = plan_launch(CATALOG.apps["jupyterlab"], CATALOG, counts(rtx_4090=2), {}, {})
    assert choice.gpu == "none"


def test_spot_launch_uses_spot_prices_within_the_bid() -> None:
    spot = {"rtx-4090": Decimal("0.31"), "rtx-3090-ti": Decimal("0.45")}
    body = {"pricing": "spot", "max_price": "0.40"}
    options, choice = plan_launch(SD, CATALOG, counts(rtx_4090=1, rtx_3090_ti=1), spot, body)
    assert (choice.gpu, choice.price) == ("rtx-4090", Decimal("0.31"))
    assert options["pricing"] == "spot" and options["max_price"] == "0.40"
    with pytest.raises(LaunchRefused) as r:
        plan_launch(SD, CATALOG, counts(rtx_4090=1), spot, {"pricing": "spot", "max_price": "0.2"})
    assert "max_price" in str(r.value) and "RTX 4090 at 0.31" in str(r.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"pricing": "free"}, "pricing"),
        ({"colour": 1}, "colour"),
        ({"pricing": "spot", "max_price": "x"}, "max_price"),
    ],
)
def test_bad_launch_bodies_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(LaunchRefused) as r:
        plan_launch(SD, CATALOG, counts(rtx_4090=1), {}, body)
    assert r.value.status == 400 and str(r.value).startswith(field)


def test_proxy_entry_fills_gpulab_placeholders_only() -> None:
    entry = server_proxy_entry(SD, SD.local_command, "/home/jupyter-ann")
    cmd = entry["command"]
    assert "{unix_socket}" in cmd and "{base_url}sd-webui" in cmd and entry["unix_socket"] is True
    assert "/home/jupyter-ann/models" in cmd and "/home/jupyter-ann/sd-webui" in cmd
    assert entry["absolute_url"] is True and entry["launcher_entry"]["title"] == SD.display_name
