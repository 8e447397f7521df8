"""Users see their GPU working (issue 24, "Users see their GPU working"): the hub's own reading
of the cards a user's server holds, at ``GET /hub/api/gpulab/users/NAME/gpu``, and the nudge once
they sit idle, priced by the one price function.

One hub on simulated cards whose sampler and observer run every half second, with the nudge after
a quarter of a minute (``GpuNudge.idle_minutes=0.25``), so idleness plays out in seconds. Every
figure is checked against what the pool, the home page's API and the catalog say.
"""

from __future__ import annotations

import uuid

import pytest
import requests
from course_helpers import make_course, roster, token_for
from harness import Hub, wait_for

IDLE_MINUTES = 0.25
ARGS = [
    "--CardSampler.interval=0.5",
    "--ActivityObserver.interval=0.5",
    f"--GpuNudge.idle_minutes={IDLE_MINUTES}",
]
BUSY_LOOP = "import time\nt0 = time.time()\nwhile time.time() - t0 < {seconds}:\n    pass\n"


@pytest.fixture(scope="module")
def ghub(module_hub_factory) -> Hub:
    return module_hub_factory("gpu-usage-hub", extra_args=ARGS)


@pytest.fixture
def people(ghub: Hub):
    """Fresh users for one test; their servers are stopped after it."""
    made: list[str] = []

    def make(prefix: str = "g") -> str:
        name = ghub.create_user(f"{prefix}{uuid.uuid4().hex[:8]}")
        made.append(name)
        return name

    yield make
    for name in made:
        if ghub.server(name) is not None:
            ghub.stop_server(name)


def usage(hub: Hub, name: str, token: str | None = None, **params: str) -> requests.Response:
    return hub.api("GET", f"/gpulab/users/{name}/gpu", token=token, params=params)


def held_by(hub: Hub, name: str) -> list[str]:
    """The cards the pool says ``name``'s server holds (the admin's view of the pool)."""
    return sorted(g["uuid"] for g in hub.pool()["gpus"] if g.get("holder") == f"{name}/")


def measured(hub: Hub, name: str, token: str | None = None) -> dict:
    """The first answer in which every card has been read by the sampler."""

    def ready() -> dict | None:
        body = usage(hub, name, token).json()
        return (
            body
            if body["cards"] and all(c["util_pct"] is not None for c in body["cards"])
            else None
        )

    return wait_for(ready, 30, 0.25, f"{name}'s cards to be measured")


def server_token(hub: Hub, name: str) -> str:
    """The token of ``name``'s own server (what JupyterLab's extension asks the hub with)."""
    with hub.kernel(name) as k:
        return k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()


def test_each_user_sees_their_own_cards_and_nobody_elses(ghub: Hub, people) -> None:
    """Issue 24, users see their GPU: the cards are the pool's (never the server's word), another
    user (their browser token or their server's token) and course staff get 403."""
    ada, bob, cyd = people("ada"), people("bob"), people("cyd")
    ghub.spawn_ready(ada, {"gpu": "a100-80g", "gpus": 1})
    ghub.spawn_ready(bob, {"gpu": "rtx-4090", "gpus": 2})
    ghub.spawn_ready(cyd, {"gpu": "none"})
    ada_token, bob_token = token_for(ghub, ada), token_for(ghub, bob)

    mine = measured(ghub, ada, ada_token)
    uuids = sorted(c["uuid"] for c in mine["cards"])
    assert uuids == held_by(ghub, ada) == sorted(ghub.server(ada)["state"]["allocation"]["uuids"])
    assert len(uuids) == 1
    card = mine["cards"][0]
    assert card["type"] == "a100-80g" and card["simulated"] is True
    # A simulated card has no memory in use and no processes: the hub says so, invents none.
    assert card["processes"] == [] and card["mem_used_mib"] == 0
    assert card["mem_total_mib"] > 0 and card["power_w"] > 0 and card["temp_c"] > 0
    theirs = measured(ghub, bob, bob_token)
    assert sorted(c["uuid"] for c in theirs["cards"]) == held_by(ghub, bob)
    assert not set(uuids) & set(held_by(ghub, bob))

    # Another user, with their own token or their server's token, sees nothing of ada's: the
    # refusal JupyterHub gives a scope held for oneself only (404, as for a user who does not
    # exist, so it does not even tell whether ada exists).
    refused = usage(ghub, ada, bob_token)
    assert refused.status_code == 404 and "cards" not in refused.text
    assert usage(ghub, bob, ada_token).status_code == 404
    ada_server = server_token(ghub, ada)
    assert usage(ghub, bob, ada_server).status_code == 404
    # Ada's own server's token reads ada's cards (JupyterLab's item), through the extension too.
    assert sorted(c["uuid"] for c in usage(ghub, ada, ada_server).json()["cards"]) == uuids
    through = requests.get(
        ghub.user_url(ada, "gpulab/api/gpu-usage"),
        headers={"Authorization": f"token {ada_token}"},
        timeout=60,
    )
    assert through.status_code == 200, through.text
    assert sorted(c["uuid"] for c in through.json()["cards"]) == uuids
    # Bob's token in ada's server reaches nothing there either.
    r = requests.get(
        ghub.user_url(ada, "gpulab/api/gpu-usage"),
        headers={"Authorization": f"token {bob_token}"},
        timeout=60,
        allow_redirects=False,
    )
    assert r.status_code == 403

    # A teacher of a course ada takes is not shown her GPU (the course dashboard is theirs),
    # though they may open her server (servers!group): the same refusal as anyone else.
    course, teacher = f"gu{uuid.uuid4().hex[:6]}", f"t{uuid.uuid4().hex[:8]}"
    make_course(ghub, course, [teacher])
    assert roster(ghub, course, f"{ada},student\n", ghub.token).status_code == 200
    teacher_token = token_for(ghub, teacher)
    assert ghub.api("GET", f"/users/{ada}", token=teacher_token).status_code == 200
    assert usage(ghub, ada, teacher_token).status_code == 404

    # The admin sees anyone's; a no-GPU server holds nothing; bad input names its field.
    assert sorted(c["uuid"] for c in usage(ghub, ada).json()["cards"]) == uuids
    none = usage(ghub, cyd).json()
    assert none["cards"] == [] and none["nudge"] is None and none["idle_seconds"] is None
    bad = usage(ghub, ada, ada_token, server="a/b")
    assert bad.status_code == 400 and bad.json()["message"].startswith("server:")
    assert usage(ghub, f"nobody{uuid.uuid4().hex[:6]}").status_code == 404


def test_simulated_utilisation_follows_the_kernel_and_falls_to_idle(ghub: Hub, people) -> None:
    """Issue 24, users see their GPU working: a kernel burning CPU on a simulated card shows as
    a busy card (the hub observes the server's CPU), and the card reads idle once it stops."""
    ada = people("ada")
    ghub.spawn_ready(ada, {"gpu": "a100-80g", "gpus": 1})
    token = token_for(ghub, ada)
    measured(ghub, ada, token)

    def idle() -> bool:
        return usage(ghub, ada, token).json()["cards"][0]["util_pct"] < 5

    # Once the server has settled after its start (its own CPU counts), the card reads idle.
    wait_for(idle, 60, 0.25, "the card to read idle")
    with ghub.kernel(ada) as k:
        k.send(BUSY_LOOP.format(seconds=25))

        def busy() -> dict | None:
            body = usage(ghub, ada, token).json()
            # At least 15 %: a loaded CI machine gives the loop only part of a core.
            return body if body["cards"][0]["util_pct"] >= 15 else None

        working = wait_for(busy, 30, 0.25, "the card to read busy")
        assert working["idle_seconds"] == 0 and working["nudge"] is None
        # The loop ends: the card falls back to idle and its idle time grows.
        wait_for(idle, 60, 0.25, "the card to read idle again")
        wait_for(
            lambda: (usage(ghub, ada, token).json()["idle_seconds"] or 0) >= 3,
            30,
            0.25,
            "the idle time to grow",
        )


def nudged(hub: Hub, name: str, token: str) -> dict:
    def got() -> dict | None:
        body = usage(hub, name, token).json()
        return body if body["nudge"] else None

    return wait_for(got, 60, 0.25, f"{name}'s idle nudge")


def test_the_nudge_comes_after_idle_minutes_at_the_prices_billing_uses(ghub: Hub, people) -> None:
    """Issue 24, the nudge: "idle for N min: switch to no-GPU mode and pay CNY 0.09/h instead of
    2.10", after ``GpuNudge.idle_minutes`` of idleness, with the user's actual price now (on
    demand, and the spot price in force on spot) and the no-GPU price: the one price function's,
    the same figures as the home page's."""
    ada, sam = people("ada"), people("sam")
    # A pinned spot price, so the spot server's price is known: below on-demand, above the floor.
    pin = ghub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.41"})
    assert pin.status_code == 200, pin.text
    try:
        ghub.spawn_ready(ada, {"gpu": "a100-80g", "gpus": 1})
        ghub.spawn_ready(sam, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.60"})
        ada_token, sam_token = token_for(ghub, ada), token_for(ghub, sam)

        # No nudge before idle_minutes: never one while the idle time is below it.
        early = measured(ghub, ada, ada_token)
        if early["idle_seconds"] is None or early["idle_seconds"] < IDLE_MINUTES * 60:
            assert early["nudge"] is None, early

        catalog = ghub.api("GET", "/gpulab/catalog", token=ada_token).json()["your_prices"]
        on_demand = catalog["gpu_types"]["a100-80g"]["price_per_hour"]
        no_gpu = catalog["no_gpu"]["price_per_hour"]
        home = ghub.api("GET", f"/gpulab/users/{ada}/home", token=ada_token).json()["server"]
        nudge = nudged(ghub, ada, ada_token)["nudge"]
        assert nudge["idle_seconds"] >= IDLE_MINUTES * 60
        assert nudge["price_now"] == home["price_per_hour"] == on_demand == "2.10"
        assert nudge["price_no_gpu"] == no_gpu == "0.09"
        assert nudge["currency"] == "CNY"
        assert "switch to no-GPU mode and pay CNY 0.09/h instead of 2.10" in nudge["text"]
        assert nudge["text"].startswith("GPU idle for ")

        spot = nudged(ghub, sam, sam_token)["nudge"]
        sam_home = ghub.api("GET", f"/gpulab/users/{sam}/home", token=sam_token).json()["server"]
        assert spot["price_now"] == sam_home["price_per_hour"] == "0.41"
        assert "pay CNY 0.09/h instead of 0.41" in spot["text"]
    finally:
        ghub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": None})
