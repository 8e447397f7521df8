"""A submitted training job, field by field, without a hub (issue 26: jobs, up to 8 cards on one
node, many nodes; bad input names the field and what is allowed)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.jobs.spec import (
    CHECKPOINT_INTERVAL_DEFAULT,
    FIELDS,
    JobSpec,
    JobSpecError,
    parse_job_spec,
)
from gpulab.spawners.options import parse_options

# The catalog as issue 26 ships it: up to 8 cards per server (the nodes' own limit is max_gpus).
CATALOG = load_catalog().model_copy(update={"max_gpus_per_server": 8})
# A pool whose largest A100 node has 8 cards and largest RTX 4090 node 4; no H100 anywhere.
MOST = {"a100-80g": 8, "rtx-4090": 4, "rtx-3090-ti": 2, "h100-80g": 0}


def parse(raw: dict, **kw) -> JobSpec:
    kw.setdefault("max_nodes", 8)
    kw.setdefault("max_gpus", MOST.__getitem__)
    return parse_job_spec(raw, CATALOG, **kw)


def refused(raw: object, **kw) -> JobSpecError:
    with pytest.raises(JobSpecError) as e:
        parse(raw, **kw)  # type: ignore[arg-type]
    assert e.value.status == 400
    assert str(e.value).startswith(f"{e.value.field}: ")
    return e.value


def test_defaults_one_node_on_demand_home_checkpoint_every_30_minutes() -> None:
    """Issue 26: a job runs a command from the home; checkpoints every 30 min by default."""
    s = parse({"command": "python train.py", "gpu": "a100-80g", "gpus": 2})
    assert (s.command, s.cwd, s.name, s.gpu, s.gpus, s.nodes) == (
        "python train.py",
        "",
        "",
        "a100-80g",
        2,
        1,
    )
    assert (s.image, s.pricing, s.max_price, s.priority) == ("base", "on-demand", None, 0)
    assert s.checkpoint_interval == CHECKPOINT_INTERVAL_DEFAULT == 1800
    assert s.max_attempts == 10 and s.cards() == 2


def test_eight_cards_on_one_node_and_a_gang() -> None:
    """Issue 26: up to 8 cards in one click where a node has them; N nodes x M cards."""
    s = parse({"command": "torchrun t.py", "gpu": "a100-80g", "gpus": 8, "nodes": 2})
    assert (s.gpus, s.nodes, s.cards()) == (8, 2, 16)


def test_server_options_read_back_by_the_spawn_contract() -> None:
    """Each rank's server is started with options parse_options reads to the same server."""
    s = parse(
        {
            "command": "python t.py",
            "gpu": "rtx-4090",
            "gpus": 2,
            "image": "pytorch",
            "datasets": ["sklearn-toy", "@alice/faces"],
            "pricing": "spot",
            "max_price": "0.50",
            "course": "ml101",
        }
    )
    opts = parse_options(s.server_options(), CATALOG)
    assert (opts.gpu, opts.gpus, opts.image, opts.pricing, opts.course) == (
        "rtx-4090",
        2,
        "pytorch",
        "spot",
        "ml101",
    )
    assert opts.datasets == ("sklearn-toy", "@alice/faces")
    assert opts.max_price == Decimal("0.50") == s.max_price
    # A no-GPU job and an on-demand one read back too.
    for raw in ({"command": "ls"}, {"command": "ls", "gpu": "a100-80g", "gpus": 1}):
        s = parse(raw)
        assert parse_options(s.server_options(), CATALOG).gpus == s.gpus


def test_a_confirmed_high_bid_stays_confirmed_for_its_servers() -> None:
    raw = {"command": "x", "gpu": "rtx-4090", "pricing": "spot", "max_price": "20"}
    assert refused(raw).field == "max_price"
    s = parse({**raw, "confirm_max_price": True})
    assert parse_options(s.server_options(), CATALOG).max_price == Decimal("20")


def test_stored_and_read_back_unchanged() -> None:
    s = parse({"command": "a b", "gpu": "rtx-4090", "pricing": "spot", "max_price": "0.123456"})
    assert JobSpec.from_json(s.to_json()) == s
    assert s.to_json()["max_price"] == "0.123456"


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({}, "command", "is required"),
        ({"command": ""}, "command", "must not be empty"),
        ({"command": "   "}, "command", "must not be empty"),
        ({"command": ["python", "t.py"]}, "command", "one string"),
        ({"command": "x" * 4097}, "command", "at most 4096 characters"),
        ({"command": "a\x00b"}, "command", "NUL"),
        ({"command": "x", "cwd": "/etc"}, "cwd", "relative to your home"),
        ({"command": "x", "cwd": "~root"}, "cwd", "relative to your home"),
        ({"command": "x", "cwd": "a/../../b"}, "cwd", "'..'"),
        ({"command": "x", "cwd": ".."}, "cwd", "'..'"),
        ({"command": "x", "cwd": "a" * 256}, "cwd", "at most 255"),
        ({"command": "x", "cwd": "a\nb"}, "cwd", "printable"),
        ({"command": "x", "name": "n" * 65}, "name", "at most 64"),
        ({"command": "x", "name": "a\x1b[31m"}, "name", "printable"),
        ({"command": "x", "gpu": "tpu"}, "gpu", "unknown GPU type"),
        ({"command": "x", "gpu": "h100-80g"}, "gpu", "no node of this hub has H100-80G"),
        ({"command": "x", "gpu": "rtx-4090", "gpus": 0}, "gpus", "between 1 and"),
        (
            {"command": "x", "gpu": "rtx-4090", "gpus": 5},
            "gpus",
            "at most 4 RTX 4090 cards on one node",
        ),
        ({"command": "x", "gpu": "rtx-4090", "gpus": 2.5}, "gpus", "whole number"),
        ({"command": "x", "image": "nope"}, "image", "unknown image"),
        ({"command": "x", "datasets": ["nope"]}, "datasets", "unknown dataset"),
        ({"command": "x", "pricing": "ondemand"}, "pricing", "on-demand, spot"),
        ({"command": "x", "pricing": "spot"}, "pricing", "needs a GPU type"),
        ({"command": "x", "gpu": "rtx-4090", "max_price": "1"}, "max_price", "spot jobs only"),
        ({"command": "x", "course": "ML 101"}, "course", "course name"),
        ({"command": "x", "gpu": "rtx-4090", "nodes": 0}, "nodes", "between 1 and 8"),
        ({"command": "x", "gpu": "rtx-4090", "nodes": 9}, "nodes", "between 1 and 8"),
        ({"command": "x", "gpu": "rtx-4090", "nodes": True}, "nodes", "whole number"),
        ({"command": "x", "nodes": 2}, "nodes", "no-GPU mode"),
        ({"command": "x", "priority": 11}, "priority", "between -10 and 10"),
        ({"command": "x", "priority": -11}, "priority", "between -10 and 10"),
        ({"command": "x", "priority": 1.5}, "priority", "whole number"),
        (
            {"command": "x", "checkpoint_interval": 59},
            "checkpoint_interval",
            "0 (off) or between 60 and 86400",
        ),
        ({"command": "x", "checkpoint_interval": 86401}, "checkpoint_interval", "86400"),
        ({"command": "x", "checkpoint_interval": -1}, "checkpoint_interval", "0 (off)"),
        ({"command": "x", "max_attempts": 0}, "max_attempts", "between 1 and 100"),
        ({"command": "x", "max_attempts": 101}, "max_attempts", "between 1 and 100"),
        ({"command": "x", "wait": True}, "wait", "unknown field"),
        ({"command": "x", "app": "jupyterlab"}, "app", "unknown field"),
        ({"command": "x", "owner": "bob"}, "owner", "unknown field"),
    ],
)
def test_bad_fields_are_refused_naming_the_field_and_what_is_allowed(
    raw: dict, field: str, words: str | None
) -> None:
    e = refused(raw)
    assert e.field == field, str(e)
    if words:
        assert words in str(e), str(e)
    assert e.allowed and e.human


def test_not_an_object_is_refused() -> None:
    e = refused(["command", "x"])
    assert e.field == "job" and "JSON object" in str(e)


def test_one_node_hub_and_priority_ceiling_and_hub_default_interval() -> None:
    """Where the spawner runs no gangs, nodes must be 1; an API may cap users' priority; the
    hub's own default checkpoint interval fills an omitted one (0 still turns it off)."""
    e = refused({"command": "x", "gpu": "rtx-4090", "nodes": 2}, max_nodes=1)
    assert e.field == "nodes" and "one node" in str(e)
    e = refused({"command": "x", "priority": 1}, max_priority=0)
    assert e.field == "priority" and "between -10 and 0" in str(e)
    assert parse({"command": "x", "priority": -3}, max_priority=0).priority == -3
    assert parse({"command": "x"}, checkpoint_interval=600).checkpoint_interval == 600
    assert parse({"command": "x", "checkpoint_interval": 0}).checkpoint_interval == 0


def test_every_field_is_named_in_fields() -> None:
    assert set(FIELDS) == set(JobSpec.model_fields)
