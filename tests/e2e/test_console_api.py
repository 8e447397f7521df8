"""The operator's console API against a real hub with real servers and a queued spot bid (issue 24).

Points of issue 24 covered (each test failed on the code before: there was no console, so
``/hub/api/gpulab/admin/console`` and ``/hub/gpulab/console`` were 404s):

- "An admin console in the hub (``admin`` scope): cards by node with who holds each, since when,
  at what price, and whether it is busy; utilisation over time per type; queues; the slowest
  recent spawns with their steps";
- "Every number on it is the same number as in the metrics": the holders, the counts per state,
  the queue length and each card's utilisation equal what ``/hub/metrics`` says (and the pool API
  and the spot queue API), since both are read from one snapshot;
- the threat model: a plain user, their server's token and a course teacher reach neither the
  API nor the page (403), and see no link to it.
"""

from __future__ import annotations

import uuid

import pytest
import requests
from console_helpers import RTX, clean_up, running_with_a_queue, spin
from course_helpers import make_course, token_for
from harness import PASSWORD, Hub, WebSession, admin_web, approved_user, wait_for
from prometheus_client.parser import text_string_to_metric_families

A100 = "a100-80g"


@pytest.fixture(scope="module")
def chub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "console-api",
        simulate="RTX-4090:2,A100-80G:1",
        extra_args=[
            "--CardSampler.interval=1",
            "--SpotMarket.tick_interval=0.5",
            "--SpotMarket.warning_seconds=2",
        ],
    )


def console(hub: Hub, token: str | None = None) -> requests.Response:
    return hub.api("GET", "/gpulab/admin/console", token=token)


def scrape(hub: Hub) -> dict[str, list]:
    """``/hub/metrics`` as JupyterHub serves it (the admin's token holds ``read:metrics``):
    family name -> samples."""
    r = requests.get(
        f"{hub.url}/hub/metrics", headers={"Authorization": f"token {hub.token}"}, timeout=30
    )
    assert r.status_code == 200, r.text[:300]
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(r.text):
        out.setdefault(family.name, []).extend(family.samples)
    return out


def as_browser(web: WebSession, path: str) -> requests.Response:
    """A GET as the page's script makes it: the log-in cookie and the XSRF header (so that a
    refusal is about who asks, not a missing XSRF token)."""
    return web.get(path, headers={"X-XSRFToken": web.http.cookies.get("_xsrf") or ""})


def stable(data: dict) -> list[tuple]:
    """What a console answer says of each card that only a new sample changes (idle seconds
    grow with the clock)."""
    return [(c["uuid"], c["state"], c["user"], c["util_pct"], c["busy"]) for c in data["cards"]]


def test_the_console_shows_the_pools_and_the_metrics_numbers(chub: Hub) -> None:
    hub = chub
    alice, bob, carol, queued = running_with_a_queue(hub)  # no RTX 4090 left: carol's bid waits
    try:
        with hub.kernel(alice) as k:
            spin(k)

            # The hub's own view: the pool API with holders (admins) and the spot queue.
            pool = hub.pool()
            holder = {g["uuid"]: g.get("holder") for g in pool["gpus"]}
            by_user = {h.split("/")[0]: u for u, h in holder.items() if h}
            assert set(by_user) == {alice, bob}
            od = {t["slug"]: t["on_demand_price"] for t in pool["gpu_types"]}

            def seen_busy():
                data = console(hub).json()
                cards = {c["uuid"]: c for c in data["cards"]}
                a, b = cards[by_user[alice]], cards[by_user[bob]]
                return data if a["busy"] and a["util_pct"] > 0 and not b["busy"] else None

            data = wait_for(seen_busy, 60, 0.5, "alice's card to show busy, bob's idle")
            cards = {c["uuid"]: c for c in data["cards"]}
            assert set(cards) == set(holder)  # every card of the pool, once
            for uid, c in cards.items():
                h = holder[uid]
                assert (c["user"], c["server"]) == ((h.split("/")[0], "") if h else ("", "")), c
                assert c["state"] == ("held" if h else "free") and c["simulated"] is True
            a = cards[by_user[alice]]
            assert a["type"] == RTX and a["pricing"] == "on_demand"
            assert a["price_per_hour"] == od[RTX]  # the catalog's price of one card, per hour
            assert a["since"] <= data["time"] and a["node"]
            b = cards[by_user[bob]]
            # Idle: below the sampler's busy threshold, with the seconds it has been idle.
            assert b["idle_seconds"] is not None and b["idle_seconds"] > 0
            assert b["util_pct"] is not None and b["util_pct"] < 5
            # The queue: carol's bid, its price and why it waits (no free card at her bid).
            assert [(q["user"], q["gpu_type"], q["max_price"]) for q in data["queues"]] == [
                (carol, RTX, "0.50")
            ]
            q = data["queues"][0]
            assert q["position"] == queued["position"] == 1 and q["current_price"] == "0.40"
            assert "free" in q["why"] and q["waited_seconds"] >= 0
            assert set(data["utilisation"]) == {RTX, A100}
            # The slowest spawns: both servers' starts, with their steps, slowest first.
            spawns = [s for s in data["spawns"] if s["user"] in (alice, bob)]
            assert {s["user"] for s in spawns} == {alice, bob}
            assert all(s["outcome"] == "success" and s["steps"] for s in spawns), spawns
            took = [s["duration_seconds"] for s in data["spawns"]]
            assert took == sorted(took, reverse=True)

            # The same numbers as /hub/metrics: counts per state, holders, queue, utilisation.
            def agree():
                before = console(hub).json()
                metrics = scrape(hub)
                after = console(hub).json()
                if stable(before) != stable(after):
                    return None  # a sample landed between: ask again
                return before, metrics

            data, metrics = wait_for(agree, 60, 0.2, "one snapshot read by both")
            states = {}
            for s in metrics["gpulab_pool_cards"]:
                key = (s.labels["type"], s.labels["state"])
                states[key] = states.get(key, 0) + s.value
            for t in (RTX, A100):
                for state in ("free", "held", "reserved"):
                    shown = sum(1 for c in data["cards"] if c["type"] == t and c["state"] == state)
                    assert states.get((t, state), 0) == shown, (t, state, states)
                offline = sum(o["cards"] for o in data["offline"] if o["type"] == t)
                assert states.get((t, "offline"), 0) == offline == 0
            util = {s.labels["UUID"]: s for s in metrics["DCGM_FI_DEV_GPU_UTIL"]}
            assert set(util) == set(cards)
            for c in data["cards"]:
                sample = util[c["uuid"]]
                assert (sample.labels["user"], sample.labels["server"]) == (c["user"], c["server"])
                assert sample.value == pytest.approx(c["util_pct"] or 0), (sample, c)
            idle = {s.labels["UUID"]: s.value for s in metrics["gpulab_card_idle_seconds"]}
            assert set(idle) == {c["uuid"] for c in data["cards"] if c["state"] == "held"}
            queue = {s.labels["type"]: s.value for s in metrics["gpulab_spot_queue_length"]}
            assert queue.get(RTX) == len(data["queues"]) == 1
    finally:
        clean_up(hub, (alice, bob, carol))


def test_the_console_lists_preemptions_as_the_spot_api_and_the_metrics_do(chub: Hub) -> None:
    """ "queues and preemptions": a spot server reclaimed when the price rose above its bid is
    listed, newest first, as the spot API records it, and counted in gpulab_preemptions_total."""
    hub = chub
    dave = hub.create_user(f"d{uuid.uuid4().hex[:5]}")
    before = sum(
        s.value for s in scrape(hub).get("gpulab_preemptions", []) if s.name.endswith("_total")
    )
    assert hub.api("PUT", f"/gpulab/spot/prices/{A100}", json={"price": "0.95"}).ok
    try:
        hub.spawn_ready(dave, {"gpu": A100, "pricing": "spot", "max_price": "1.00"}, timeout=120)
        assert hub.api("PUT", f"/gpulab/spot/prices/{A100}", json={"price": "1.50"}).ok
        wait_for(lambda: hub.server(dave) is None, 60, 0.5, "dave's server to be reclaimed")
        records = [
            p
            for p in hub.api("GET", "/gpulab/spot/preemptions").json()["preemptions"]
            if p["user"] == dave
        ]
        assert len(records) == 1 and records[0]["status"] == "stopped", records
        shown = [p for p in console(hub).json()["preemptions"] if p["user"] == dave]
        assert [(p["id"], p["gpu_type"], p["reason"], p["status"], p["price"]) for p in shown] == [
            (records[0]["id"], A100, records[0]["reason"], "stopped", "1.50")
        ]
        assert shown[0]["max_price"] == "1.00" and shown[0]["warned_at"] <= shown[0]["stopped_at"]
        after = scrape(hub)["gpulab_preemptions"]
        counted = {
            (s.labels["type"], s.labels["reason"]): s.value
            for s in after
            if s.name.endswith("_total")
        }
        assert counted.get((A100, records[0]["reason"]), 0) >= 1
        assert sum(counted.values()) == before + 1
    finally:
        hub.api("PUT", f"/gpulab/spot/prices/{A100}", json={"price": None})
        if hub.server(dave):
            hub.stop_server(dave)


def test_users_their_servers_and_teachers_are_refused_the_console(chub: Hub) -> None:
    hub = chub
    person = approved_user(hub, "plain")
    teacher = approved_user(hub, "teach")
    make_course(hub, f"cons{uuid.uuid4().hex[:5]}", [teacher])
    for name in (person, teacher):
        web = WebSession(hub)
        assert web.login(name, PASSWORD)  # (a first log-in makes the hub's user)
        r = console(hub, token=token_for(hub, name))
        assert r.status_code == 403 and "cards" not in r.text, (name, r.status_code, r.text)
        page = web.get("/hub/gpulab/console")
        assert page.status_code == 403 and "gpulab-console-nodes" not in page.text, name
        api = as_browser(web, "/hub/api/gpulab/admin/console")
        assert api.status_code == 403 and "cards" not in api.text, name
        assert 'id="gpulab-nav-console"' not in web.get("/hub/home").text
    # A server's own token (which any code in the server reads) is refused too.
    hub.spawn_ready(person, {"gpu": "none"}, timeout=120)
    try:
        with hub.kernel(person) as k:
            out = k.execute(
                "import os, urllib.request, urllib.error\n"
                "req = urllib.request.Request(os.environ['JUPYTERHUB_API_URL'] + "
                "'/gpulab/admin/console', headers={'Authorization': 'token ' + "
                "os.environ['JUPYTERHUB_API_TOKEN']})\n"
                "try:\n"
                "    print(urllib.request.urlopen(req).status)\n"
                "except urllib.error.HTTPError as e:\n"
                "    print(e.code)"
            )
        assert out.strip() == "403", out
    finally:
        hub.stop_server(person)
    # The admin reaches both and sees the navbar's link.
    admin = admin_web(hub)
    page = admin.get("/hub/gpulab/console")
    assert page.status_code == 200 and 'id="gpulab-console-nodes"' in page.text
    assert 'id="gpulab-nav-console"' in admin.get("/hub/home").text
    assert as_browser(admin, "/hub/api/gpulab/admin/console").status_code == 200
