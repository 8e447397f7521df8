"""gpulab-swarm on a real multi-node Docker Swarm: real engines in their own network namespaces
on this machine (tests/swarm_helpers.py), a real hub (`gpulab up --spawner swarm`), its proxy and
real servers. Only the GPUs are simulated: each node advertises two as Swarm generic resources
(`GPU-SIM-...`) and is labelled `gpulab.simulated=true`.

One cluster (2 nodes x 2 cards) and one hub serve the whole module, to keep its cost to one
cluster start: placement and the pool, images only where a node holds them, 20 concurrent spawns,
homes that follow the user, a paused and a drained node, a hub SIGKILL, and (last, since the
cluster keeps one node after it) a node killed. Homes are on a shared directory standing in for
the operator's shared filesystem (``shared_home_path``).
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
from billing.client import Billing
from harness import Hub, admin_web, wait_for
from swarm_helpers import (
    SwarmCluster,
    remove_hub_services,
    running_task,
    service_of,
    shared_homes_dir,
    swarm_hub_settings,
)

# The multi-engine test swarm (network namespaces, a bridge, extra dockerds, heavy on a 2-core
# machine): its modules run one after another on one worker of a parallel run.
pytestmark = pytest.mark.xdist_group("swarm")

SWARM_NODES = [("a100-80g", 2), ("a100-80g", 2)]


@pytest.fixture(scope="module")
def shub(swarm_cluster: SwarmCluster, module_hub_factory, catalog: Path, tmp_path_factory) -> Hub:
    # The cluster first: fixtures are torn down in reverse, so the hub stops before it.
    homes = shared_homes_dir(tmp_path_factory)
    return module_hub_factory(
        "shub",
        on_stop=lambda h: remove_hub_services(swarm_cluster, h.data_dir),
        **swarm_hub_settings(swarm_cluster, catalog, homes),
    )


@pytest.fixture
def users(shub: Hub):
    """``users(n)``: n new users; their servers are stopped after the test."""
    made: list[str] = []

    def make(n: int = 1) -> list[str]:
        names = [shub.create_user() for _ in range(n)]
        made.extend(names)
        return names

    yield make
    for name in made:
        if shub.server(name) is not None:
            shub.stop_server(name)


def cards(hub: Hub, user: str) -> list[str]:
    return hub.server(user)["state"]["allocation"]["uuids"]


def node_of(cluster: SwarmCluster, hub: Hub, user: str) -> int:
    """The index (1-based) of the node running ``user``'s server."""
    task = running_task(cluster, service_of(cluster, hub.data_dir, user)["ID"])
    return cluster.node_ids.index(task["NodeID"]) + 1


def in_server(hub: Hub, user: str, code: str) -> str:
    with hub.kernel(user) as k:
        return k.execute(code)


ENV = (
    "import os, json; print(json.dumps({k: os.environ.get(k) for k in "
    "['CUDA_VISIBLE_DEVICES', 'DOCKER_RESOURCE_NVIDIA-GPU', 'GPULAB_MODE']} | {'uid': os.getuid()}))"
)


def test_gpu_servers_land_on_nodes_with_free_cards_and_never_share_one(
    shub, users, swarm_cluster
) -> None:
    big, small = users(2)
    shub.spawn_ready(big, {"gpu": "a100-80g", "gpus": 2}, timeout=90)
    shub.spawn_ready(small, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
    n_big, n_small = node_of(swarm_cluster, shub, big), node_of(swarm_cluster, shub, small)
    # A server's cards are all on its node, and the server sees exactly those.
    assert n_big != n_small
    assert set(cards(shub, big)) == set(swarm_cluster.nodes[n_big - 1].gpus)
    assert set(cards(shub, small)) < set(swarm_cluster.nodes[n_small - 1].gpus)
    env = json.loads(in_server(shub, big, ENV))
    assert sorted(env["CUDA_VISIBLE_DEVICES"].split(",")) == sorted(cards(shub, big))
    # Swarm reserves no generic resources for it (see reserve_generic_resources).
    assert env["DOCKER_RESOURCE_NVIDIA-GPU"] is None
    assert env["GPULAB_MODE"] == "A100-80G x2 (simulated)" and env["uid"] == 1000

    # The pool, across the cluster and per node.
    pool = shub.pool()
    a100 = next(t for t in pool["gpu_types"] if t["slug"] == "a100-80g")
    assert (a100["free"], a100["total"]) == (1, 4)
    nodes = {n["id"]: n for n in pool["nodes"]}
    assert {n["state"] for n in nodes.values()} == {"ready"}
    assert nodes[swarm_cluster.node_ids[n_big - 1]]["gpu_types"] == [
        {"slug": "a100-80g", "total": 2, "free": 0}
    ]
    assert nodes[swarm_cluster.node_ids[n_small - 1]]["gpu_types"] == [
        {"slug": "a100-80g", "total": 2, "free": 1}
    ]


# ---- images: offered only where a node holds them ----------------------------------------------


def test_image_on_no_node_is_greyed_out_and_refused_before_anything_is_held(
    shub, users, swarm_cluster
) -> None:
    (user,) = users(1)
    free = shub.free("a100-80g")
    # The test image is on every node; "broken" only on the hub's own machine's engine.
    html = admin_web(shub).get("/hub/spawn").text
    options = dict(re.findall(r'<option value="([a-z0-9-]+)"([^>]*)>', html))
    assert "disabled" not in options["base"]
    assert "disabled" in options["broken"]
    assert "is not on any Swarm node that takes servers" in html

    r = shub.spawn(user, {"image": "broken", "gpu": "a100-80g"})
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "Image 'broken' is unavailable" in message and "not on any Swarm node" in message
    assert "gpulab images --preload" in message
    assert shub.free("a100-80g") == free and shub.server(user) is None
    users_with_services = {
        (s["Spec"].get("Labels") or {}).get("org.gpulab.user") for s in swarm_cluster.services()
    }
    assert user not in users_with_services


# ---- many users at once ------------------------------------------------------------------------


def test_twenty_concurrent_spawns_give_four_servers_and_sixteen_clear_refusals(
    shub, users, swarm_cluster
) -> None:
    names = users(20)

    def post(name: str):
        return shub.spawn(name, {"gpu": "a100-80g", "gpus": 1})

    with ThreadPoolExecutor(len(names)) as pool:
        answers = dict(zip(names, pool.map(post, names), strict=True))
    started = [n for n, r in answers.items() if r.status_code in (201, 202)]
    refused = {n: r for n, r in answers.items() if r.status_code == 409}
    assert len(started) == 4 and len(refused) == 16, {n: r.status_code for n, r in answers.items()}
    for r in refused.values():
        message = r.json()["message"]
        # A clear refusal that names what is free instead.
        assert "No a100-80g available: 1 requested, 0 of 4 free" in message, message
        assert 'no-GPU mode (gpu: "none") is always available' in message, message
    for name in started:
        shub.wait_ready(name, timeout=120)
    held = [c for name in started for c in cards(shub, name)]
    assert sorted(held) == sorted(c for n in swarm_cluster.nodes for c in n.gpus)
    assert sorted(node_of(swarm_cluster, shub, n) for n in started) == [1, 1, 2, 2]
    # The refused hold nothing: no server, no card, no service.
    hub_services = {
        (s["Spec"].get("Labels") or {}).get("org.gpulab.user") for s in swarm_cluster.services()
    }
    for name in refused:
        assert shub.server(name) is None
        assert name not in hub_services
    assert shub.free("a100-80g") == 0


# ---- homes follow the user; a paused (drained) node ----------------------------------------


def test_home_follows_the_user_and_a_paused_node_takes_nothing_new(
    shub, users, swarm_cluster
) -> None:
    mover, stayer, late = users(3)
    shub.spawn_ready(mover, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
    first = node_of(swarm_cluster, shub, mover)
    in_server(shub, mover, "open('notes.txt', 'w').write('written on the first node')")
    # Best fit puts the second one-card server on the same node, which is then full.
    shub.spawn_ready(stayer, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
    assert node_of(swarm_cluster, shub, stayer) == first
    stayer_task = running_task(
        swarm_cluster, service_of(swarm_cluster, shub.data_dir, stayer)["ID"]
    )
    shub.stop_server(mover)

    # The operator takes the node out of service gently (docker node update --availability
    # pause): nothing new goes there, and what runs there keeps going.
    swarm_cluster.pause_node(first)
    try:
        node_id = swarm_cluster.node_ids[first - 1]

        def paused_in_pool():
            nodes = {n["id"]: n for n in shub.pool()["nodes"]}
            return nodes[node_id]["availability"] == "pause" and not nodes[node_id]["gpu_types"]

        wait_for(paused_in_pool, 20, interval=0.2, what="the paused node's cards to leave the pool")
        shub.spawn_ready(mover, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
        assert node_of(swarm_cluster, shub, mover) != first
        assert in_server(shub, mover, "print(open('notes.txt').read())") == (
            "written on the first node\n"
        )
        # The stayer's server is untouched on the paused node.
        assert shub.server(stayer)["ready"] and node_of(swarm_cluster, shub, stayer) == first
        assert in_server(shub, stayer, "print(6 * 7)") == "42\n"
        # The other node's last card is the only one offered; the paused node's free one is not.
        r = shub.spawn(late, {"gpu": "a100-80g", "gpus": 2})
        assert r.status_code == 409, r.text
        assert "2 requested, 1 of 2 free" in r.json()["message"]
        assert shub.server(late) is None
    finally:
        swarm_cluster.activate_node(first)
    wait_for(lambda: shub.free("a100-80g") == 2, 20, what="the node's free card back in the pool")
    # Back in service, the node kept the stayer's server: the same task, still running (Swarm
    # re-checks a node's tasks when it is updated while active).
    again = running_task(swarm_cluster, service_of(swarm_cluster, shub.data_dir, stayer)["ID"])
    assert again["ID"] == stayer_task["ID"]
    assert shub.server(stayer)["ready"]


def test_swarm_drain_stops_the_nodes_servers_with_the_reason_and_frees_their_cards(
    shub, users, swarm_cluster
) -> None:
    """Swarm's own drain (unlike pause) shuts a node's tasks down: their servers are reported
    stopped with the reason, not left looking alive, and the user can start again elsewhere."""
    (user,) = users(1)
    shub.spawn_ready(user, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
    where = node_of(swarm_cluster, shub, user)
    swarm_cluster.drain_node(where)
    try:
        wait_for(lambda: shub.server(user) is None, 30, interval=0.2, what="the server stopped")
        log = shub.log_path.read_text(errors="replace")
        lines = [x for x in log.splitlines() if f" of {user}/ stopped: " in x]
        assert lines, log[-3000:]
        name = f"n{where}"
        assert all(f"its node {name} was drained: Swarm shut its task down" in x for x in lines)
        assert shub.free("a100-80g") == 2
        shub.spawn_ready(user, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
        assert node_of(swarm_cluster, shub, user) != where
    finally:
        swarm_cluster.activate_node(where)
    wait_for(lambda: shub.free("a100-80g") == 3, 20, what="the drained node back in the pool")


# ---- a hub crash (SIGKILL) --------------------------------------------------------------------


def test_hub_sigkill_restart_adopts_every_service_with_its_cards(
    shub, users, swarm_cluster
) -> None:
    big, small, other = users(3)
    shub.spawn_ready(big, {"gpu": "a100-80g", "gpus": 2}, timeout=90)
    shub.spawn_ready(small, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
    before = {
        u: (cards(shub, u), service_of(swarm_cluster, shub.data_dir, u)["ID"]) for u in (big, small)
    }
    tasks = {u: running_task(swarm_cluster, sid)["ID"] for u, (_, sid) in before.items()}
    in_server(shub, small, "open('before-crash.txt', 'w').write('written before')")

    shub.kill()
    # Worst case: the ledger is lost too; the restarted hub rebuilds it from the services'
    # labels and the cards Swarm assigned to their tasks.
    (shub.data_dir / "allocations.json").unlink()
    shub.start(timeout=90)

    for u, (held, sid) in before.items():
        assert shub.server(u)["ready"]
        assert sorted(cards(shub, u)) == sorted(held)
        assert service_of(swarm_cluster, shub.data_dir, u)["ID"] == sid
        assert running_task(swarm_cluster, sid)["ID"] == tasks[u]  # never restarted
    pool = shub.pool()
    holders = {g["uuid"]: g["holder"] for g in pool["gpus"] if g["held"]}
    assert holders == {c: f"{u}/" for u, (held, _) in before.items() for c in held}
    assert shub.free("a100-80g") == 1
    assert in_server(shub, small, "print(open('before-crash.txt').read())") == "written before\n"
    # No card is handed out twice.
    r = shub.spawn(other, {"gpu": "a100-80g", "gpus": 2})
    assert r.status_code == 409 and "2 requested, 1 of 4 free" in r.text, r.text


# ---- a node dies (last: the cluster keeps one node) --------------------------------------------


def test_killed_node_stops_its_servers_frees_the_pool_and_closes_billing(
    shub, users, swarm_cluster
) -> None:
    (victim,) = users(1)
    billing = Billing(shub)
    # Node 1 is the swarm's only manager: the victim's server goes to node 2.
    swarm_cluster.pause_node(1)
    try:
        wait_for(lambda: shub.free("a100-80g") == 2, 20, what="node 1 out of the pool")
        shub.spawn_ready(victim, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
    finally:
        swarm_cluster.activate_node(1)
    assert node_of(swarm_cluster, shub, victim) == 2
    wait_for(lambda: shub.free("a100-80g") == 3, 20, what="node 1 back in the pool")
    with shub.kernel(victim) as k:
        k.execute("x = 1")
        t_kill = time.time()
        swarm_cluster.kill_node(2)
        wait_for(lambda: shub.server(victim) is None, 30, interval=0.2, what="the server stopped")
    noticed = time.time() - t_kill
    assert noticed < 30

    pool = shub.pool()
    nodes = {n["id"]: n for n in pool["nodes"]}
    assert nodes[swarm_cluster.node_ids[1]]["state"] == "down"
    assert nodes[swarm_cluster.node_ids[1]]["gpu_types"] == []
    a100 = next(t for t in pool["gpu_types"] if t["slug"] == "a100-80g")
    assert (a100["free"], a100["total"]) == (2, 2)
    assert not any(g["held"] for g in pool["gpus"])
    assert "stopped: its node n2" in shub.log_path.read_text(errors="replace")

    # Billing closed the session, charging nothing after the node's last sign of life.
    def closed():
        usage = billing.usage(victim)
        return usage if usage["servers"] and usage["servers"][0]["stopped"] else None

    usage = wait_for(closed, 30, 0.5, "billing to close the session")
    (server,) = usage["servers"]
    last = max(ts(k["last_seen"]) for k in server["kernels"])
    assert last <= t_kill + 0.5
    assert server["billed_seconds"] <= last - ts(server["started"]) + 0.5

    # The user starts again, on the node that is left.
    shub.spawn_ready(victim, {"gpu": "a100-80g", "gpus": 1}, timeout=90)
    assert node_of(swarm_cluster, shub, victim) == 1
    assert in_server(shub, victim, "print('back')") == "back\n"


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
