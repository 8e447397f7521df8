"""What the hub refuses and what it never loses: bad input, full pools, races, dead servers."""

from __future__ import annotations

import json
import os
import pwd
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness import Hub, wait_for

BAD_OPTIONS = [
    ({"image": "nope"}, "image", "base"),
    ({"gpu": "tpu-v5"}, "gpu", "a100-80g"),
    ({"gpu": "a100-80g", "gpus": 0}, "gpus", "between 1 and"),
    ({"gpu": "a100-80g", "gpus": 99}, "gpus", "between 1 and"),
    ({"gpu": "a100-80g", "gpus": "two"}, "gpus", "whole number"),
    ({"datasets": ["imagenet-full"]}, "datasets", "sklearn-toy"),
    ({"datasets": "sklearn-toy,x"}, "datasets", "sklearn-toy"),
    ({"pricing": "auction"}, "pricing", "on-demand, spot"),
    ({"gpu": "a100-80g", "pricing": "spot", "max_price": "cheap"}, "max_price", "positive number"),
    ({"gpu": "a100-80g", "pricing": "spot", "max_price": -1}, "max_price", "positive number"),
    ({"gpu": "a100-80g", "pricing": "spot", "max_price": 0}, "max_price", "positive number"),
    ({"gpu": "none", "pricing": "spot"}, "pricing", "needs a GPU type"),
    (
        {"colour": "blue"},
        "colour",
        "allowed fields: app, image, gpu, gpus, datasets, pricing, max_price",
    ),
]


@pytest.mark.parametrize(("options", "field", "allowed"), BAD_OPTIONS)
def test_bad_options_are_refused_and_change_nothing(
    hub: Hub, user: str, options: dict, field: str, allowed: str
) -> None:
    pool_before = hub.pool()
    r = hub.spawn(user, options)
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert f"{field}:" in message and allowed in message
    assert hub.server(user) is None
    assert hub.pool()["gpu_types"] == pool_before["gpu_types"]
    # The rejected options were not kept as the user's defaults either.
    assert hub.user(user)["servers"] == {}


def test_container_images_are_refused_by_the_local_spawner(hub: Hub, user: str) -> None:
    r = hub.spawn(user, {"image": "pytorch", "gpu": "a100-80g"})
    assert r.status_code == 409, r.text
    assert "needs the Docker spawner" in r.json()["message"] and "base" in r.json()["message"]
    assert hub.server(user) is None
    assert hub.free("a100-80g") == 2


def test_full_gpu_type_fails_fast_and_says_what_is_free(hub: Hub) -> None:
    users = [hub.create_user() for _ in range(3)]
    try:
        for u in users[:2]:
            hub.spawn_ready(u, {"gpu": "a100-80g"})
        r = hub.spawn(users[2], {"gpu": "a100-80g"})
        assert r.status_code == 409, r.text
        message = r.json()["message"]
        assert "No a100-80g available" in message and "0 of 2 free" in message
        assert "rtx-4090 x2" in message and "no-GPU mode" in message
        assert hub.server(users[2]) is None
    finally:
        for u in users:
            if hub.server(u):
                hub.stop_server(u)
    assert hub.free("a100-80g") == 2


def test_twenty_concurrent_spawns_never_share_a_gpu(hub: Hub) -> None:
    users = [hub.create_user() for _ in range(20)]
    try:
        with ThreadPoolExecutor(20) as ex:
            results = list(ex.map(lambda u: hub.spawn(u, {"gpu": "rtx-4090"}), users))
        codes = sorted(r.status_code for r in results)
        started = [u for u, r in zip(users, results, strict=True) if r.status_code in (201, 202)]
        assert len(started) == 2, codes
        assert codes.count(409) == 18
        for u in started:
            hub.wait_ready(u)
        held = [hub.server(u)["state"]["allocation"]["uuids"][0] for u in started]
        assert len(set(held)) == 2
        assert hub.free("rtx-4090") == 0
        # Every card the pool calls held is held by exactly one of the started servers.
        pool_holders = {g["uuid"]: g["holder"] for g in hub.pool()["gpus"] if g["held"]}
        assert {pool_holders[u] for u in held} == {f"{u}/" for u in started}
    finally:
        for u in users:
            if hub.server(u):
                hub.stop_server(u)
    assert hub.free("rtx-4090") == 2


def test_a_server_that_dies_gives_its_gpu_back(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "a100-80g"})
    pid = hub.server(user)["state"]["pid"]
    before = hub.free("a100-80g")
    os.kill(pid, signal.SIGKILL)
    # The hub polls its servers (every 5 s for local processes) and frees the card.
    wait_for(lambda: hub.server(user) is None, timeout=30, what="the hub to notice the death")
    assert hub.free("a100-80g") == before + 1


def test_progress_reports_the_real_steps(hub: Hub, user: str) -> None:
    # The hub streams a spawn's progress (every step from the first) only while the spawn is
    # pending, and a forked server can answer within a second. So the server process is stopped
    # (SIGSTOP) as soon as its pid is on record, before it can listen: the spawn stays pending (a
    # stopped process is alive) until the stream is open, then the process is continued.
    ledger = hub.data_dir / "allocations.json"

    def server_pid() -> int | None:
        try:
            records = json.loads(ledger.read_text())["allocations"]
        except (OSError, ValueError, KeyError):
            return None
        return next((a["pid"] for a in records if a["owner"] == f"{user}/" and a["pid"]), None)

    held: list[int] = []
    try:
        with ThreadPoolExecutor(1) as ex:
            post = ex.submit(hub.spawn, user, {"gpu": "rtx-4090", "datasets": ["sklearn-toy"]})
            pid = wait_for(
                lambda: server_pid() or (post.done() and -1), 60, 0.002, "the server's pid"
            )
            assert pid != -1, post.result().text
            os.kill(pid, signal.SIGSTOP)
            held.append(pid)
            events = []
            with hub.api("GET", f"/users/{user}/server/progress", stream=True) as resp:
                # The hub has taken the pending spawn's stream (its headers are here).
                os.kill(held.pop(), signal.SIGCONT)
                for line in resp.iter_lines(decode_unicode=True):
                    if line and line.startswith("data:"):
                        events.append(json.loads(line[5:]))
            assert post.result().status_code in (201, 202)
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
    text = "\n".join(e.get("message", "") for e in events)
    for step in ("Allocating GPUs", "Allocated RTX 4090 x1 (simulated)", "Mounting datasets"):
        assert step in text, text
    for step in ("Starting the server process", "Waiting for JupyterLab", "JupyterLab is ready"):
        assert step in text, text
    assert events[-1].get("ready") is True, events


def test_switch_moves_a_running_server_and_keeps_files(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "a100-80g", "datasets": ["sklearn-toy"]})
    old_pid = hub.server(user)["state"]["pid"]
    with hub.kernel(user) as k:
        k.execute("open('notes.txt', 'w').write('keep me')")

    r = hub.api("POST", f"/gpulab/users/{user}/switch", json={"gpu": "none"})
    assert r.status_code == 202, r.text
    assert r.json()["options"]["gpu"] == "none"
    assert r.json()["options"]["datasets"] == ["sklearn-toy"]
    wait_for(
        lambda: (s := hub.server(user)) and s["ready"] and s["state"]["pid"] != old_pid,
        timeout=60,
        what="the switched server",
    )
    with hub.kernel(user) as k:
        assert k.execute("print(open('notes.txt').read())").strip() == "keep me"
        assert (
            k.execute("import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))").strip() == "''"
        )


def _listening_uids() -> list[int]:
    """The owners (uids) of the node's listening TCP sockets, one entry per socket."""
    uids = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                uids.append(int(fields[7]))
    return uids


def test_concurrent_switches_move_the_server_once_and_leave_no_process_behind(
    hub: Hub, user: str
) -> None:
    """Attack (issue 24's wave): several switches of one server at once, with the user's own
    token. Each restarted the same spawner: one process was forgotten and ran on, unbilled and
    unobserved, holding a card nobody else could have. Now one switch runs, the others are 409,
    the user holds the cards of that one, and the account's only listener is the hub's server."""
    from gpulab.spawners.local.accounts import account_name

    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    uid = pwd.getpwnam(account_name(user)).pw_uid
    token = hub.api("POST", f"/users/{user}/tokens", json={"expires_in": 600}).json()["token"]
    bodies = [
        {"gpu": "a100-80g"},
        {"gpu": "none"},
        {"gpu": "a100-80g", "gpus": 2},
        {"gpu": "none", "datasets": []},
    ]

    def switch(body: dict):
        return hub.api("POST", f"/gpulab/users/{user}/switch", token=token, json=body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(switch, bodies))
    codes = sorted(r.status_code for r in answers)
    assert codes == [202, 409, 409, 409], [(r.status_code, r.text) for r in answers]
    refused = [r.json()["message"] for r in answers if r.status_code == 409]
    assert all("being switched" in m or "start it instead" in m for m in refused), refused
    won = next(b for b, r in zip(bodies, answers, strict=True) if r.status_code == 202)
    wait_for(
        lambda: (s := hub.server(user)) and s["ready"] and s["user_options"]["gpu"] == won["gpu"],
        timeout=90,
        what="the one switch's server",
    )
    held = [g for g in hub.pool()["gpus"] if g["held"] and g["holder"] == f"{user}/"]
    assert len(held) == (0 if won["gpu"] == "none" else won.get("gpus", 1)), held
    # One server listens for the account: the one the hub knows (no forgotten process).
    wait_for(lambda: _listening_uids().count(uid) == 1, timeout=30, what="one listener")
    hub.stop_server(user)
    wait_for(lambda: uid not in _listening_uids(), timeout=30, what="no listener after the stop")


def test_a_stop_during_a_switch_stops_the_server_for_good(hub: Hub, user: str) -> None:
    """Attack (issue 24's second wave): a stop asked right after a switch was answered 202 while
    the switch's own stop ran, and the switch then started the new server all the same: the user
    kept paying for a server they had stopped. Now the switch starts nothing, and its cards go
    back."""
    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    r = hub.api("POST", f"/gpulab/users/{user}/switch", json={"gpu": "a100-80g"})
    assert r.status_code == 202, r.text
    stop = hub.api("DELETE", f"/users/{user}/server")
    assert stop.status_code in (202, 204), stop.text
    # The switch reserved an A100 for the new server: it is free again only once the switch
    # has ended without starting it (a started server would hold it).
    wait_for(
        lambda: (
            hub.server(user) is None and hub.free("a100-80g") == 2 and hub.free("rtx-4090") == 2
        ),
        timeout=90,
        what="the server stopped and every card free",
    )
    assert hub.server(user) is None


def test_switch_to_a_full_type_changes_nothing(hub: Hub) -> None:
    a, b, c = (hub.create_user() for _ in range(3))
    try:
        hub.spawn_ready(a, {"gpu": "a100-80g"})
        hub.spawn_ready(b, {"gpu": "a100-80g"})
        hub.spawn_ready(c, {"gpu": "none"})
        pid = hub.server(c)["state"]["pid"]
        r = hub.api("POST", f"/gpulab/users/{c}/switch", json={"gpu": "a100-80g"})
        assert r.status_code == 409, r.text
        assert "No a100-80g available" in r.json()["message"]
        r = hub.api("POST", f"/gpulab/users/{c}/switch", json={"image": "nope"})
        assert r.status_code == 400 and "image:" in r.json()["message"]
        s = hub.server(c)
        assert s["ready"] and s["state"]["pid"] == pid and s["user_options"]["gpu"] == "none"
    finally:
        for u in (a, b, c):
            if hub.server(u):
                hub.stop_server(u)


def test_a_user_cannot_switch_someone_elses_server(hub: Hub) -> None:
    owner, other = hub.create_user(), hub.create_user()
    try:
        hub.spawn_ready(owner, {"gpu": "none"})
        r = hub.api("POST", f"/users/{other}/tokens", json={"expires_in": 600})
        token = r.json()["token"]
        r = hub.api("POST", f"/gpulab/users/{owner}/switch", token=token, json={"gpu": "rtx-4090"})
        assert r.status_code == 404 or r.status_code == 403, r.text
        assert hub.server(owner)["user_options"]["gpu"] == "none"
    finally:
        hub.stop_server(owner)
