"""Issue 22, "ready means the app can do its job": a launch whose app cannot become ready ends as
a clear error on the launch status within a bounded time, its server stopped, its card freed, and
billing's statement credits back the whole charge of that session (the user pays nothing).

Points of the issue covered (each failed on the old code): the WebUI without a model answered
its readiness URL with 200, so the hub called the launch "ready" (no error ever came), left the
server running on its RTX 4090 and billed it.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from apps_helpers import apps_hub
from billing.client import Billing, user_token
from harness import Hub, wait_for


@pytest.fixture(scope="module")
def nohub(module_hub_factory) -> Hub:
    # The operator never made the demo model: the model store is empty.
    return apps_hub(module_hub_factory, "apps-nomodel", model=False)


def launch_status(hub: Hub, user: str, token: str) -> dict:
    r = hub.api("GET", f"/gpulab/users/{user}/launch", token)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_app_without_a_model_ends_as_an_error_that_bills_nothing(nohub: Hub) -> None:
    user = nohub.create_user()
    token = user_token(nohub, user)
    billing = Billing(nohub)
    before = Decimal(billing.balance(user)["balance"]["exact"])
    t0 = time.monotonic()
    r = nohub.api("POST", f"/gpulab/users/{user}/apps/sd-webui/launch", token, json={})
    assert r.status_code == 202, r.text
    assert r.json()["gpu"] == "rtx-4090"

    # The hub (not the browser) sees that the WebUI has no model and ends the launch, well
    # within the app's timeout, with the app's own reason in plain words.
    status = wait_for(
        lambda: (s := launch_status(nohub, user, token))["failed"] and s,
        120,
        0.5,
        "the launch to end as failed",
    )
    took = time.monotonic() - t0
    assert took < 120
    failed = status["failed"]
    assert failed.startswith("Stable Diffusion WebUI could not start: no model in ~/models"), failed
    assert "the operator adds models" in failed
    assert "not charged" in failed

    # Its server is stopped and its card is free again.
    wait_for(lambda: nohub.server(user) is None, 90, 0.5, "the server to be stopped")
    wait_for(lambda: nohub.free("rtx-4090") == 2, 30, 0.5, "the card to be free")
    # The launch status still says why (the launch page shows it), and nothing is running.
    after = launch_status(nohub, user, token)
    assert after["failed"] == failed and not after["active"]

    # Billing: the session held a card (so it was charged), and its whole charge is credited
    # back (a "launch failed" compensation on the statement): the balance is where it was.
    def settled() -> dict | None:
        usage = billing.usage(user)
        servers = usage["servers"]
        if len(servers) != 1 or not servers[0].get("compensations"):
            return None
        balance = Decimal(billing.balance(user)["balance"]["exact"])
        return usage if balance == before else None

    usage = wait_for(settled, 90, 0.5, "the failed launch's charge to be credited back")
    (srv,) = usage["servers"]
    # What the session was charged for the seconds it held the card (0 when it ended before the
    # hub's observer first sampled it), all of it credited back.
    charged = Decimal(srv["amount"]["exact"])
    (credit,) = srv["compensations"]
    assert Decimal(credit["amount"]["exact"]) == charged
    assert credit["note"].startswith("launch failed: the session's whole charge")
    assert Decimal(usage["compensation"]["exact"]) == charged


@pytest.fixture(scope="module")
def capped(module_hub_factory) -> Hub:
    return apps_hub(
        module_hub_factory,
        "apps-nomodel-capped",
        model=False,
        extra_args=["--LaunchWatch.credits_per_day=1"],
    )


def failed_launch(hub: Hub, user: str, token: str) -> str:
    r = hub.api("POST", f"/gpulab/users/{user}/apps/sd-webui/launch", token, json={})
    assert r.status_code == 202, r.text
    status = wait_for(
        lambda: (s := launch_status(hub, user, token))["failed"] and s,
        120,
        0.5,
        "the launch to end as failed",
    )
    wait_for(lambda: hub.server(user) is None, 90, 0.5, "the server to be stopped")
    return status["failed"]


def test_launches_made_to_fail_are_credited_a_bounded_number_of_times(capped: Hub) -> None:
    """The attack: a user controls their server, its app's readiness answer included, and could
    make launches fail on purpose to use a GPU server for free until the hub ends each one.
    Only ``LaunchWatch.credits_per_day`` failed launches a day are credited; the next is charged
    as usual (and says so). Before this bound every failed launch was credited."""
    user = capped.create_user()
    token = user_token(capped, user)
    billing = Billing(capped)
    first = failed_launch(capped, user, token)
    assert "this launch is not charged" in first
    second = failed_launch(capped, user, token)
    assert "charged as usual" in second and "not charged in the last 24 hours" in second

    def two_sessions() -> list | None:
        servers = billing.usage(user)["servers"]
        ok = len(servers) == 2 and any(s.get("compensations") for s in servers)
        return servers if ok else None

    first_session, second_session = sorted(
        wait_for(two_sessions, 90, 0.5, "both sessions, the first credited"),
        key=lambda s: s["session"],
    )
    assert first_session["compensations"] and not second_session.get("compensations")
