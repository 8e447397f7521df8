"""Issue 22, "one price everywhere": every place that prices a server agrees with billing.

Filed: a course student's home page and status bar said CNY 0.68/h while billing charged the
education price 0.48; the spot tooltip showed the on-demand price while spot was 0.51. The cause
was prices computed in several places; now one function (``catalog/pricing.py``, ``quote``)
prices a server, and this test asks every place for the same three servers and compares with
what billing charges for an hour of each:

- an ordinary user on demand (RTX 4090: 0.68),
- a course student on demand (the education price: 0.48),
- a spot server (the spot price in force: 0.51).

The places: billing's rating (``rate_charge``), the hub's balance check and home page
(``hourly_price``), the launch plan and the home tiles' table (``plan_launch``, ``plan_table``),
``ServerOptions.price_per_hour`` (the price the hub writes into a server for its status bar),
the spot status a spot server's status bar reads (``status_json``), and the spawn form.
Fails on the old code: ``catalog.pricing`` did not exist; a course server's own price and the
launch plan and form of a student said 0.68.
"""

from __future__ import annotations

import asyncio
import json
import time
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpulab.billing_service.rating import MICRO, PriceBook, rate_charge
from gpulab.catalog.pricing import quote
from gpulab.hub_config.billing.hooks import hourly_price
from gpulab.hub_config.launch_plan import plan_launch, plan_table
from gpulab.spawners.form import render_form
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.market.views import status_json
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.options import parse_options

GPU = "rtx-4090"
SPOT_NOW = Decimal("0.51")
HOUR_US = 3600 * MICRO
# (name, raw spawn options, is the user a course's student, what billing charges for an hour)
CASES = [
    ("ordinary on-demand", {"gpu": GPU}, False, Decimal("0.68")),
    ("course student", {"gpu": GPU, "course": "ml101"}, True, Decimal("0.48")),
    ("spot", {"gpu": GPU, "pricing": "spot"}, False, SPOT_NOW),
]


@pytest.fixture
def market(tmp_path: Path):
    """The node's pool (two simulated RTX 4090s) and its spot market, the price pinned at 0.51."""
    SpotMarket.clear_instance()
    GpuPool.clear_instance()
    c = Config()
    c.GpuPool.data_dir = str(tmp_path / "data")
    c.GpuInventory.simulate_gpus = "RTX-4090:2"
    GpuPool.instance(config=c)
    market = SpotMarket.instance(config=c)
    market.pin(GPU, SPOT_NOW)
    yield market, c
    SpotMarket.clear_instance()
    GpuPool.clear_instance()


def billed_for_an_hour(catalog, data_dir: str, opts) -> Decimal:
    """What billing's rating charges for one hour of a server with these options."""
    sess = SimpleNamespace(
        gpu_type=opts.gpu, gpus=opts.gpus, pricing=opts.pricing, options=json.dumps(opts.to_json())
    )
    # An hour that starts now (the pinned price is in force from now on in the history).
    t0 = int(time.time() * MICRO) + MICRO
    charge = rate_charge(PriceBook(catalog, data_dir), sess, [(t0, t0 + HOUR_US)])
    return Decimal(charge.amount_micro) / MICRO


@pytest.mark.parametrize(("name", "raw", "student", "billed"), CASES, ids=[c[0] for c in CASES])
def test_every_place_prices_a_server_as_billing_charges_it(
    market, name: str, raw: dict, student: bool, billed: Decimal
) -> None:
    market, config = market
    catalog = market.pool.catalog
    data_dir = config.GpuPool.data_dir
    opts = parse_options(raw, catalog)

    # Billing: what an hour of it costs.
    assert billed_for_an_hour(catalog, data_dir, opts) == billed, name

    # The one function, and what the hub's balance check and home page ask.
    spot_now = SPOT_NOW if opts.pricing == "spot" else None
    assert (
        quote(catalog, GPU, 1, opts.pricing, spot_price=spot_now, education=student).per_hour
        == billed
    )
    per_hour, label = hourly_price(opts, catalog)
    assert per_hour == billed, name
    assert label == {"ordinary on-demand": "", "course student": "education price "}.get(
        name, "spot price "
    )

    # The price the hub writes into the server (its status bar's, on demand) and, on spot, the
    # spot status the status bar reads instead.
    if opts.pricing == "spot":
        assert opts.price_per_hour(catalog, market.current_price(GPU)) == billed
    else:
        assert opts.price_per_hour(catalog) == billed, name

    # The launch plan (a home tile's click) and the tiles' table, for this user.
    app = catalog.apps["jupyterlab"]
    counts = market.pool.allocator.counts()
    prices = {GPU: market.current_price(GPU)}
    body = {"gpu": GPU, "pricing": opts.pricing}
    _, choice = plan_launch(app, catalog, counts, prices, body, education=student)
    assert choice.price == billed, name
    table = plan_table(app, catalog, counts, prices, [GPU, "none"], education=student)
    assert Decimal(table[GPU][opts.pricing]["price_per_hour"]) == billed, name
    assert table[GPU][opts.pricing]["gpu"] == GPU
    # The cheapest-that-fits plan on spot is a GPU at the spot price too.
    if opts.pricing == "spot":
        assert Decimal(table[""]["spot"]["price_per_hour"]) == billed


def test_a_spot_servers_status_says_its_price_now(market) -> None:
    """The spot status the JupyterLab status bar shows: this server's price per hour now (the
    spot price in force times its cards), which billing charges; was absent (the status bar fell
    back to the on-demand price)."""
    market, config = market
    catalog = market.pool.catalog
    opts = parse_options({"gpu": GPU, "gpus": 2, "pricing": "spot"}, catalog)
    alloc = market.pool.allocator.allocate("stud/", GPU, 2, pricing="spot")
    market.bids["stud/"] = SimpleNamespace(max_price=opts.max_price, windows_only=False)
    try:
        status = status_json(market, "stud/")
    finally:
        market.bids.pop("stud/", None)
        market.pool.allocator.release("stud/", alloc.alloc_id)
    assert Decimal(status["price_per_hour"]) == 2 * SPOT_NOW
    assert billed_for_an_hour(catalog, config.GpuPool.data_dir, opts) == 2 * SPOT_NOW


def test_a_students_spawn_form_shows_the_education_price(market) -> None:
    """The form said 0.68 per card to a student billed 0.48."""
    market, config = market
    group = SimpleNamespace(
        name="ml101",
        properties={"gpulab_course": {"display_name": "ML 101", "limits": {"gpu_types": [GPU]}}},
    )
    spawner = SimpleNamespace(
        pool=market.pool,
        config=config,
        user=SimpleNamespace(name="stud", groups=[group]),
        name="",
        user_options={},
    )
    html = asyncio.run(render_form(spawner))
    assert "CNY 0.48/h per card (education price)" in html
    assert "0.68/h" not in html
    spawner.user = SimpleNamespace(name="ada", groups=[])
    html = asyncio.run(render_form(spawner))
    assert "CNY 0.68/h per card" in html and "education" not in html
