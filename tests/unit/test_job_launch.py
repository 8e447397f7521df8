"""What the scheduler hands a job server (spawners/jobs/launch.py) and how many cards one server
may ask for (GpuPool.max_cards_per_node, spawners/options.py check_cards_fit), issue 26."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from traitlets.config import Config

from gpulab.spawners.jobs.launch import JobLaunch, is_job_server, launch_for, offer, withdraw
from gpulab.spawners.node.inventory import GpuDevice
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.options import OptionsError, check_cards_fit, parse_options


def test_a_launch_survives_the_spawners_state_and_is_filed_per_server() -> None:
    """Issue 26 (a restarted hub knows its job servers): a JobLaunch reads back from its JSON
    (the spawner's state) unchanged; the registry files one per server until withdrawn."""
    launch = JobLaunch(
        job_id=17,
        attempt=2,
        rank=1,
        nodes=2,
        gpus=4,
        command="torchrun train.py",
        cwd="runs/a",
        checkpoint_seconds=120.0,
        env={"MASTER_ADDR": "gpulab-job-17-0", "MASTER_PORT": "29500"},
        alloc_id="a-1",
        network="gpulab-job-17",
    )
    assert JobLaunch.from_json(launch.to_json()) == launch
    assert JobLaunch.from_json(json.dumps(launch.to_json())) == launch

    offer("alice/job-17-1", launch)
    offer("alice/job-17-1", replace(launch, attempt=3))
    assert launch_for("alice/job-17-1").attempt == 3
    assert launch_for("bob/job-17-1") is None
    withdraw("alice/job-17-1")
    assert launch_for("alice/job-17-1") is None
    assert is_job_server("job-17") and is_job_server("job-17-0")
    assert not is_job_server("") and not is_job_server("lab") and not is_job_server("jobs")


def make_pool(tmp_path: Path, gpus: str) -> GpuPool:
    GpuPool.clear_instance()
    c = Config()
    c.GpuPool.data_dir = str(tmp_path / "data")
    c.GpuInventory.simulate_gpus = gpus
    return GpuPool.instance(config=c)


@pytest.fixture
def pool(tmp_path: Path):
    yield make_pool(tmp_path, "A100-80G:8,RTX-4090:4")
    GpuPool.clear_instance()


@pytest.fixture
def small_pool(tmp_path: Path):
    yield make_pool(tmp_path, "RTX-4090:1")
    GpuPool.clear_instance()


def test_the_most_cards_per_server_is_the_largest_nodes(pool: GpuPool) -> None:
    """Issue 26 (Up to 8 cards in one click, where a node has them): the catalog allows 8 per
    server; a server of a type gets at most what the largest node of that type has (held
    cards count: they come back); more is a 400 naming gpus with the most there is."""
    assert pool.catalog.max_gpus_per_server == 8
    assert pool.max_cards_per_node("a100-80g") == 8
    assert pool.max_cards_per_node("rtx-4090") == 4
    assert pool.max_cards_per_node("h100-80g") == 0

    ok = parse_options({"gpu": "a100-80g", "gpus": 8}, pool.catalog)
    check_cards_fit(ok, pool.catalog, pool.max_cards_per_node("a100-80g"))
    too_many = parse_options({"gpu": "rtx-4090", "gpus": 8}, pool.catalog)
    with pytest.raises(OptionsError) as e:
        check_cards_fit(too_many, pool.catalog, pool.max_cards_per_node("rtx-4090"))
    assert e.value.field == "gpus" and "at most 4" in str(e.value)
    assert "largest node here has 4 RTX 4090 cards" in e.value.human
    # No card of the type at all: left to the allocator and the spot queue (409 / queued).
    none_here = parse_options({"gpu": "h100-80g", "gpus": 8}, pool.catalog)
    check_cards_fit(none_here, pool.catalog, pool.max_cards_per_node("h100-80g"))


def test_a_clusters_largest_node_counts_not_its_total(small_pool: GpuPool) -> None:
    """Issue 26: on a cluster (Swarm), 6 A100 over two nodes of 4 and 2 make a 4-card server at
    most: a server's cards sit on one node (many nodes are a gang job's, not one server's)."""

    def card(i: int, node: str) -> GpuDevice:
        return GpuDevice(i, f"GPU-n-{i}", "A100", 81920, "a100-80g", True, None, node)

    assert small_pool.max_cards_per_node("a100-80g") == 0
    devices = [card(i, "n1") for i in range(4)] + [card(i, "n2") for i in range(4, 6)]
    small_pool.set_cluster(devices, {"n1": {"name": "n1"}, "n2": {"name": "n2"}})
    assert sum(d.gpu_type == "a100-80g" for d in small_pool.inventory.rentable) == 6
    assert small_pool.max_cards_per_node("a100-80g") == 4
