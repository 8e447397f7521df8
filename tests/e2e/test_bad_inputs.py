"""Issue 22, "bad input is never silently fixed": a spot max price that cannot be read, or that
makes no sense, is refused on every path that takes one, and nothing starts, no card is held,
nothing is charged; refusals carry the API's text (field names) and a plain one for people.

Points covered (each fails on the code before issue 22):

- unreadable max prices (``1e999999``, which Decimal reads as a finite number, and ``-1``/``NaN``
  on the launch API, which answered 409 or 500) are a 400 naming ``max_price`` on the REST spawn
  API, the spawn form's POST, the app launch API and the switch API, with a plain ``human`` text;
- a max price above ten times on-demand (9 for an RTX 4090 at 0.68/h, which started at once)
  needs ``confirm_max_price``; 1e20 is refused even confirmed;
- routine refusals (a max price under the spot price) keep the API's words in ``message``
  (``"wait": true in the API``) and speak plainly in ``human`` and on the spawn form's page.
"""

from __future__ import annotations

import pytest
from billing.client import Billing, user_token
from harness import PASSWORD, Hub, WebSession, approved_user

# 1e999999 reads as a finite positive Decimal: the old parser let it through.
UNREADABLE = ["abc", "-1", "0", "NaN", "Infinity", "1e999999"]
SPOT = {"gpu": "rtx-4090", "pricing": "spot"}


def nothing_happened(hub: Hub, user: str, before: list[dict]) -> None:
    assert hub.server(user) is None
    assert hub.pool()["gpu_types"] == before
    usage = Billing(hub).usage(user, user_token(hub, user))
    assert not usage["servers"], usage


def assert_refused_naming_max_price(r, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    data = r.json()
    assert "max_price" in data["message"], data
    assert data.get("field") == "max_price", data
    # The plain sentence for a page: the person's words, not the API's field name.
    assert data.get("human") and "max_price" not in data["human"], data
    return data


@pytest.mark.parametrize("value", UNREADABLE)
def test_unreadable_max_price_is_a_400_on_every_api(hub: Hub, value: str) -> None:
    user = hub.create_user()
    before = hub.pool()["gpu_types"]

    r = hub.spawn(user, {**SPOT, "max_price": value})
    assert_refused_naming_max_price(r)
    nothing_happened(hub, user, before)

    r = hub.api(
        "POST",
        f"/gpulab/users/{user}/apps/jupyterlab/launch",
        json={**SPOT, "max_price": value},
    )
    assert_refused_naming_max_price(r)
    nothing_happened(hub, user, before)


def test_unreadable_max_price_on_the_spawn_form_is_said_plainly(hub: Hub) -> None:
    user = approved_user(hub, "bad")
    web = WebSession(hub)
    assert web.login(user, PASSWORD)
    before = hub.pool()["gpu_types"]
    fields = {"gpu": "rtx-4090", "gpus": "1", "image": "base", "pricing": "spot"}
    r = web.post(f"/hub/spawn/{user}", {**fields, "max_price": "1e999999"})
    assert r.status_code == 400, r.text[-2000:]
    assert "The max price must be a sensible amount of money per card-hour" in r.text
    assert "max_price:" not in r.text.split('id="spawn_form"')[0]
    # The form comes back as it was filled in: the refused value is there to correct.
    assert 'value="1e999999"' in r.text
    nothing_happened(hub, user, before)


def test_max_price_above_ten_times_on_demand_needs_a_confirmation(hub: Hub) -> None:
    user = hub.create_user()
    before = hub.pool()["gpu_types"]
    r = hub.spawn(user, {**SPOT, "max_price": "9"})
    data = assert_refused_naming_max_price(r)
    assert data["confirm"] == "confirm_max_price" and "ten times" in data["human"]
    nothing_happened(hub, user, before)

    r = hub.api(
        "POST", f"/gpulab/users/{user}/apps/jupyterlab/launch", json={**SPOT, "max_price": "9"}
    )
    data = assert_refused_naming_max_price(r)
    assert data["confirm"] == "confirm_max_price"
    nothing_happened(hub, user, before)

    r = hub.spawn(user, {**SPOT, "max_price": "1e20", "confirm_max_price": True})
    data = assert_refused_naming_max_price(r)
    assert "confirm" not in data
    nothing_happened(hub, user, before)

    try:
        hub.spawn_ready(user, {**SPOT, "max_price": "9", "confirm_max_price": True})
        options = hub.server(user)["user_options"]
        assert options["max_price"] == "9" and options["confirm_max_price"] is True
    finally:
        hub.stop_server(user)


def test_switch_refuses_an_unreadable_max_price_and_keeps_the_server(hub: Hub) -> None:
    user = hub.create_user()
    try:
        hub.spawn_ready(user, {"gpu": "none"})
        pid = hub.server(user)["state"]["pid"]
        for value in ("abc", "1e999999"):
            r = hub.api("POST", f"/gpulab/users/{user}/switch", json={**SPOT, "max_price": value})
            assert_refused_naming_max_price(r)
        s = hub.server(user)
        assert s["ready"] and s["state"]["pid"] == pid and s["user_options"]["gpu"] == "none"
    finally:
        hub.stop_server(user)


def test_a_spot_refusal_speaks_plainly_and_keeps_the_api_words(hub: Hub) -> None:
    user = approved_user(hub, "low")
    web = WebSession(hub)
    assert web.login(user, PASSWORD)  # the hub account exists from the first log-in
    before = hub.pool()["gpu_types"]
    r = hub.spawn(user, {**SPOT, "max_price": "0.01"})
    assert r.status_code == 409, r.text
    data = r.json()
    assert '"wait": true in the API' in data["message"] and "max_price" in data["message"]
    assert data["human"].startswith("Your spot server did not start")
    assert '"wait"' not in data["human"] and "max_price" not in data["human"]
    nothing_happened(hub, user, before)

    fields = {"gpu": "rtx-4090", "gpus": "1", "image": "base", "pricing": "spot"}
    r = web.post(f"/hub/spawn/{user}", {**fields, "max_price": "0.01"})
    assert r.status_code == 409, r.text[-2000:]
    assert "Your spot server did not start" in r.text
    assert "in the API" not in r.text
    nothing_happened(hub, user, before)
