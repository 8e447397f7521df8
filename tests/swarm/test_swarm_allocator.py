"""The allocator's cluster rules on their own (no swarm needed): a server's cards all on one node,
best fit, pins, Swarm's own choice of cards recorded without ever holding a card twice, and the
manager's node list read into cards (only ready, active nodes take servers)."""

from __future__ import annotations

import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.node.allocator import GpuAllocator, NoCapacity
from gpulab.spawners.node.inventory import GpuDevice
from gpulab.spawners.swarm.cluster import SwarmCluster, read_cluster

CATALOG = load_catalog()


def card(node: str, i: int) -> GpuDevice:
    return GpuDevice(
        index=i,
        uuid=f"GPU-SIM-{node}-{i}",
        name=f"A100 on {node} (simulated)",
        memory_total_mib=80 * 1024,
        gpu_type="a100-80g",
        simulated=True,
        node=node,
    )


def cluster_allocator(tmp_path, shape: dict[str, int]) -> GpuAllocator:
    devices = [card(node, i) for node, n in shape.items() for i in range(n)]
    return GpuAllocator(devices, tmp_path / "ledger.json")


def test_cards_of_one_server_are_on_one_node_and_best_fit_keeps_whole_nodes(tmp_path) -> None:
    a = cluster_allocator(tmp_path, {"n1": 2, "n2": 3})
    one = a.allocate("alice/", "a100-80g", 1)
    # Best fit: the node with the fewest free cards that still fits (n1), so n2 stays whole.
    assert a.node_of(one) == "n1"
    three = a.allocate("bob/", "a100-80g", 3)
    assert a.node_of(three) == "n2"
    # One card is free in all (on n1): two cards can't be split over nodes.
    with pytest.raises(NoCapacity) as e:
        a.allocate("carol/", "a100-80g", 2)
    assert "2 requested, 1 of 5 free" in str(e.value)


def test_enough_free_cards_but_not_on_one_node_says_so(tmp_path) -> None:
    a = cluster_allocator(tmp_path, {"n1": 2, "n2": 2})
    # One card taken on each node (their homes are there).
    for owner, where in (("alice/", "n1"), ("bob/", "n2")):
        a.pin(owner, {where}, f"on node {where}")
        assert a.node_of(a.allocate(owner, "a100-80g", 1)) == where
    with pytest.raises(NoCapacity) as e:
        a.allocate("carol/", "a100-80g", 2)
    assert "2 of 4 free (at most 1 on one node)" in str(e.value)


def test_pinned_owner_gets_cards_only_on_its_nodes_and_is_told_why(tmp_path) -> None:
    a = cluster_allocator(tmp_path, {"n1": 1, "n2": 2})
    a.pin("alice/", {"n2"}, "on the node(s) holding image base (n2)")
    got = a.allocate("alice/", "a100-80g", 1)
    assert a.node_of(got) == "n2"  # not n1, which best fit alone would pick
    a.pin("bob/", {"n2"}, "on node n2, which holds this server's home")
    a.allocate("bob/", "a100-80g", 1)
    a.pin("carol/", {"n2"}, "on node n2, which holds this server's home")
    with pytest.raises(NoCapacity) as e:
        a.allocate("carol/", "a100-80g", 1)
    assert "0 of 3 free on node n2, which holds this server's home" in str(e.value)
    a.pin("carol/", None)
    assert a.node_of(a.allocate("carol/", "a100-80g", 1)) == "n1"


def test_swarms_choice_of_cards_is_recorded_by_swapping_never_sharing(tmp_path) -> None:
    a = cluster_allocator(tmp_path, {"n1": 2})
    alice = a.allocate("alice/", "a100-80g", 1)
    bob = a.allocate("bob/", "a100-80g", 1)
    # Swarm gave alice's task the card the allocator picked for bob: they swap.
    picked_for_alice, picked_for_bob = list(alice.uuids), list(bob.uuids)
    assert a.reassign("alice/", picked_for_bob).uuids == picked_for_bob
    assert a.get("bob/").uuids == picked_for_alice
    assert sorted(a.get("alice/").uuids + a.get("bob/").uuids) == ["GPU-SIM-n1-0", "GPU-SIM-n1-1"]
    assert a.get("alice/").uuids != a.get("bob/").uuids
    # Cards of another node, or the wrong count, are refused.
    with pytest.raises(ValueError):
        a.reassign("alice/", ["GPU-SIM-n9-0"])
    with pytest.raises(ValueError):
        a.reassign("alice/", ["GPU-SIM-n1-0", "GPU-SIM-n1-1"])
    assert alice.alloc_id == a.get("alice/").alloc_id


def node(node_id: str, state: str = "ready", availability: str = "active", **labels) -> dict:
    return {
        "ID": node_id,
        "Spec": {
            "Availability": availability,
            "Labels": {"gpulab.gpu-type": "a100-80g", "gpulab.simulated": "true", **labels},
        },
        "Status": {"State": state, "Addr": f"10.0.0.{len(node_id)}"},
        "Description": {
            "Hostname": "box",
            "Resources": {
                "NanoCPUs": 8_000_000_000,
                "GenericResources": [
                    {"NamedResourceSpec": {"Kind": "NVIDIA-GPU", "Value": f"GPU-SIM-{node_id}-{i}"}}
                    for i in range(2)
                ],
            },
        },
    }


def test_only_ready_active_nodes_cards_are_offered_and_a_bad_label_is_reported() -> None:
    warnings: list[str] = []
    nodes = [
        node("up", **{"gpulab.node": "gpu-1"}),
        node("dead", state="down"),
        node("paused", availability="pause"),
        node("odd", **{"gpulab.gpu-type": "tpu-v9"}),
    ]
    devices, info = read_cluster(nodes, CATALOG, "NVIDIA-GPU", warnings.append)
    assert sorted(d.uuid for d in devices) == ["GPU-SIM-up-0", "GPU-SIM-up-1"]
    assert all(d.node == "up" and d.simulated and "(simulated)" in d.name for d in devices)
    assert info["up"]["name"] == "gpu-1" and info["dead"]["state"] == "down"
    assert info["paused"]["availability"] == "pause" and info["odd"]["gpus"] == 2
    (warning,) = warnings
    assert "gpulab.gpu-type='tpu-v9' is not a catalog GPU type" in warning


def test_a_node_engine_key_shared_by_several_nodes_reaches_none_of_them() -> None:
    # Every node() is on hostname "box": a key "box" must not send n1's exec to n2's engine.
    _, info = read_cluster(
        [node("n1", **{"gpulab.node": "gpu-1"}), node("n2"), node("n3")],
        CATALOG,
        "NVIDIA-GPU",
        print,
    )
    cluster = SwarmCluster(
        node_engines={
            "box": "tcp://shared:2375",
            "gpu-1": "tcp://gpu-1:2375",
            "n3": "tcp://n3:2375",
        }
    )
    cluster.nodes = info
    assert cluster.engine_url("n1") == "tcp://gpu-1:2375"
    assert cluster.engine_url("n2") is None
    assert cluster.engine_url("n3") == "tcp://n3:2375"
