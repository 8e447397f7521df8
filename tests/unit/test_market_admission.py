"""The spot market's admission and the balance run once per spawn: the hub's pre-check hands its
spawn request (with their answers) over to the spawner, whose start then does not ask again; the
hub sets nothing on the spawner. Also: one lookup of a server's queued request."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from traitlets.config import Config

from gpulab.catalog import NO_GPU
from gpulab.hub_config.overrides.queue import queue_instead_of_spawn
from gpulab.spawners.market import views
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.mixin import GpuSpawnerMixin, SpawnError
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.request import SpawnRequest, take

SLUG = "rtx-4090"


class FakeSpawner(GpuSpawnerMixin):
    """Just enough of a JupyterHub spawner for gpulab_start: the launch is instant."""

    def __init__(self, config: Config, user: str, name: str = "") -> None:
        super().__init__()
        self.config = config
        self.user = SimpleNamespace(name=user)
        self.name = name
        self.user_options: dict[str, Any] = {}
        self.orm_spawner = SimpleNamespace(user_options={})
        self.log = SpotMarket.instance().log
        self.launched: list[SpawnRequest] = []

    def jupyterhub_spawn(self, raw: dict[str, Any]) -> None:
        # What JupyterHub does with the request's options before it calls start(): a new
        # spawn (clear_state), then gpulab's apply_user_options.
        self.gpulab_request = None
        self.user_options = raw
        self._apply_gpulab_options(raw)

    async def _launch(self, request: SpawnRequest) -> str:
        self.launched.append(request)
        return "http://127.0.0.1:1"


@pytest.fixture
def market(tmp_path):
    # A singleton left by another test on this worker would ignore this config (0 cards).
    SpotMarket.clear_instance()
    GpuPool.clear_instance()
    config = Config()
    config.GpuPool.data_dir = str(tmp_path)
    config.GpuInventory.simulate_gpus = "RTX-4090:1"
    pool = GpuPool.instance(config=config)
    market = SpotMarket.instance(config=config, pool=pool)
    market.pin(SLUG, Decimal("0.30"))
    calls: list[str] = []
    admit = market.admit

    def counting_admit(spawner: Any, options: Any) -> None:
        calls.append(spawner.owner)
        admit(spawner, options)

    market.admit = counting_admit
    market.admit_calls = calls
    yield market
    SpotMarket.clear_instance()
    GpuPool.clear_instance()


def spawner_for(market: SpotMarket, user: str) -> FakeSpawner:
    return FakeSpawner(market.config, user)


def spot(max_price: str, **extra: Any) -> dict[str, Any]:
    return {"gpu": SLUG, "pricing": "spot", "max_price": max_price, **extra}


def start(spawner: FakeSpawner, raw: dict[str, Any]) -> str:
    """The hub's spawn: the pre-check (as the REST API and spawn page do), then the start."""
    entry = asyncio.run(queue_instead_of_spawn(spawner, raw))
    assert entry is None, entry
    spawner.jupyterhub_spawn(raw)
    return asyncio.run(spawner.gpulab_start())


def test_a_spawn_that_starts_is_admitted_once(market: SpotMarket) -> None:
    alice = spawner_for(market, "alice")
    start(alice, spot("0.40"))
    assert market.admit_calls == ["alice/"]
    assert alice.allocation is not None and alice.allocation.pricing == "spot"
    assert market.bids["alice/"].max_price == Decimal("0.40")


def test_a_queued_request_then_its_start_by_the_market_are_admitted_once_each(
    market: SpotMarket,
) -> None:
    start(spawner_for(market, "alice"), spot("0.40"))
    bob = spawner_for(market, "bob")
    entry = asyncio.run(queue_instead_of_spawn(bob, spot("0.40", wait=True)))
    assert entry is not None and entry["user"] == "bob" and "message" in entry
    assert market.admit_calls == ["alice/", "bob/"]
    assert market.queued_entry("bob/")["id"] == entry["id"]

    # The card frees and the market matches bob's request: it reserves the card and starts the
    # server through the hub's REST API, whose pre-check admits the reserved start.
    market.pool.allocator.release("alice/")
    market.cancel_queued("bob/")
    market.pool.allocator.reserve("bob/", SLUG, 1, 60)
    start(bob, entry["options"])
    assert market.admit_calls == ["alice/", "bob/", "bob/"]
    assert bob.allocation is not None and market.queued_entry("bob/") is None


def test_a_refusal_from_the_pre_check_fails_the_start_without_asking_again(
    market: SpotMarket,
) -> None:
    carol = spawner_for(market, "carol")
    raw = spot("0.20")  # under the pinned price, and not waiting: refused
    assert asyncio.run(queue_instead_of_spawn(carol, raw)) is None
    carol.jupyterhub_spawn(raw)
    with pytest.raises(SpawnError) as e:
        asyncio.run(carol.gpulab_start())
    assert e.value.status_code == 409 and "above your max_price 0.20" in e.value.jupyterhub_message
    assert market.admit_calls == ["carol/"]
    assert carol.allocation is None and market.pool.allocator.get("carol/") is None


def test_a_start_without_the_pre_check_asks_the_market_itself(market: SpotMarket) -> None:
    dave = spawner_for(market, "dave")
    dave.jupyterhub_spawn(spot("0.40"))
    asyncio.run(dave.gpulab_start())
    assert market.admit_calls == ["dave/"]


def test_an_answer_serves_one_start_with_the_same_options_only(market: SpotMarket) -> None:
    erin = spawner_for(market, "erin")
    assert asyncio.run(queue_instead_of_spawn(erin, spot("0.40"))) is None
    # The spawn that followed asked for something else: the market is asked about that.
    erin.jupyterhub_spawn(spot("0.50"))
    asyncio.run(erin.gpulab_start())
    assert market.admit_calls == ["erin/", "erin/"]
    assert take("erin/", spot("0.40")) is None  # the request handed over is gone
    assert market.bids["erin/"].max_price == Decimal("0.50")


def test_one_lookup_of_a_queued_request_for_views_and_the_pre_check(market: SpotMarket) -> None:
    start(spawner_for(market, "alice"), spot("0.40"))
    for user, bid in [("bob", "0.35"), ("carol", "0.45")]:
        assert asyncio.run(queue_instead_of_spawn(spawner_for(market, user), spot(bid, wait=True)))
    listed = {q["user"]: q for q in views.queue_json(market)}
    assert market.queued_entry("bob/") == listed["bob"]
    assert market.queued_entry("alice/") is None
    # Highest bid first: carol is served before bob.
    assert (listed["carol"]["position"], listed["bob"]["position"]) == (1, 2)
    assert listed["bob"]["queue_length"] == 2
    assert views.status_json(market, "carol/")["queued"] == listed["carol"]


class Billing:
    """The balance check and start report of gpulab's billing, counted."""

    def __init__(self, refuse: bool = False, hold: str | None = None) -> None:
        self.refuse = refuse
        self.hold = hold
        self.asked: list[SpawnRequest] = []
        self.reported: list[SpawnRequest] = []

    async def afford(self, spawner: Any, request: SpawnRequest) -> str | None:
        self.asked.append(request)
        if self.refuse:
            raise SpawnError(402, "Your balance cannot pay for 10 minutes of it.")
        return self.hold

    async def report(self, spawner: Any, request: SpawnRequest) -> None:
        self.reported.append(request)


def billed(market: SpotMarket, user: str, billing: Billing) -> FakeSpawner:
    spawner = spawner_for(market, user)
    spawner.afford_hook = billing.afford
    spawner.pre_allocate_hook = billing.report
    return spawner


def test_the_balance_is_asked_once_per_spawn_and_the_request_reaches_the_launch(
    market: SpotMarket,
) -> None:
    billing = Billing()
    frank = billed(market, "frank", billing)
    start(frank, spot("0.40"))
    assert len(billing.asked) == 1 and len(billing.reported) == 1
    assert billing.reported[0].afforded and billing.reported[0].admission is not None
    (launched,) = frank.launched
    assert launched.options.gpu == SLUG and launched.options is billing.asked[0].options
    assert launched.env["GPULAB_GPU_TYPE"] == SLUG and launched.env["GPULAB_PRICING"] == "spot"
    assert frank.gpulab_request is launched and frank.gpulab_options is launched.options


def test_a_start_without_the_pre_check_asks_the_balance_itself_once(market: SpotMarket) -> None:
    billing = Billing()
    gina = billed(market, "gina", billing)
    gina.jupyterhub_spawn({"gpu": "none"})
    asyncio.run(gina.gpulab_start())
    assert len(billing.asked) == 1 and len(billing.reported) == 1
    assert gina.launched[0].options.gpu == NO_GPU
    assert gina.launched[0].env["GPULAB_GPU_TYPE"] == NO_GPU


def test_a_refusal_of_the_balance_fails_the_start_without_asking_again(
    market: SpotMarket,
) -> None:
    billing = Billing(refuse=True)
    hank = billed(market, "hank", billing)
    raw = spot("0.40")
    assert asyncio.run(queue_instead_of_spawn(hank, raw)) is None
    hank.jupyterhub_spawn(raw)
    with pytest.raises(SpawnError) as e:
        asyncio.run(hank.gpulab_start())
    assert e.value.status_code == 402 and "cannot pay" in e.value.jupyterhub_message
    assert len(billing.asked) == 1 and billing.reported == []
    assert market.admit_calls == []  # money first: the market never saw it
    assert hank.allocation is None and market.pool.allocator.get("hank/") is None


def test_the_reservation_billing_picks_travels_in_the_request(market: SpotMarket) -> None:
    billing = Billing(hold="res-1")
    ivy = billed(market, "ivy", billing)
    request = asyncio.run(ivy.check_affordable(ivy.spawn_request({"gpu": SLUG})))
    assert (request.afforded, request.hold_id) == (True, "res-1")
    # Asked once: a paid request is not asked again.
    assert asyncio.run(ivy.check_affordable(request)) is request and len(billing.asked) == 1


def test_the_hub_sets_nothing_on_the_spawner(market: SpotMarket) -> None:
    billing = Billing()
    jane = billed(market, "jane", billing)
    before = {k: v for k, v in vars(jane).items() if k != "_trait_values"}
    traits = dict(jane._trait_values)
    assert asyncio.run(queue_instead_of_spawn(jane, spot("0.40"))) is None
    assert {k: v for k, v in vars(jane).items() if k != "_trait_values"} == before
    assert jane._trait_values == traits
    assert jane.gpulab_request is None
