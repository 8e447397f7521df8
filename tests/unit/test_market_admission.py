"""The spot market's admission runs once per spawn: the hub's pre-check hands its answer to the
spawner, whose start then does not ask again. Also: one lookup of a server's queued request."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from traitlets.config import Config

from gpulab.hub_config.overrides.queue import queue_instead_of_spawn
from gpulab.spawners.market import views
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.mixin import GpuSpawnerMixin, SpawnError
from gpulab.spawners.node.pool import GpuPool

SLUG = "rtx-4090"


class FakeSpawner(GpuSpawnerMixin):
    """Just enough of a JupyterHub spawner for gpulab_start: the launch is instant."""

    def __init__(self, config: Config, user: str, name: str = "") -> None:
        super().__init__()
        self.config = config
        self.user = SimpleNamespace(name=user)
        self.name = name
        self.user_options: dict[str, Any] = {}
        self.log = SpotMarket.instance().log

    def spawn_request(self, raw: dict[str, Any]) -> None:
        # What JupyterHub does with the request's options before it calls start().
        self.gpulab_options = None
        self.user_options = raw

    async def _launch(self, gpu_env: dict[str, str]) -> str:
        return "http://127.0.0.1:1"


@pytest.fixture
def market(tmp_path):
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
    spawner.spawn_request(raw)
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
    carol.spawn_request(raw)
    with pytest.raises(SpawnError) as e:
        asyncio.run(carol.gpulab_start())
    assert e.value.status_code == 409 and "above your max_price 0.20" in e.value.jupyterhub_message
    assert market.admit_calls == ["carol/"]
    assert carol.allocation is None and market.pool.allocator.get("carol/") is None


def test_a_start_without_the_pre_check_asks_the_market_itself(market: SpotMarket) -> None:
    dave = spawner_for(market, "dave")
    dave.spawn_request(spot("0.40"))
    asyncio.run(dave.gpulab_start())
    assert market.admit_calls == ["dave/"]


def test_an_answer_serves_one_start_with_the_same_options_only(market: SpotMarket) -> None:
    erin = spawner_for(market, "erin")
    assert asyncio.run(queue_instead_of_spawn(erin, spot("0.40"))) is None
    # The spawn that followed asked for something else: the market is asked about that.
    erin.spawn_request(spot("0.50"))
    asyncio.run(erin.gpulab_start())
    assert market.admit_calls == ["erin/", "erin/"]
    assert erin.gpulab_admission is None
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
