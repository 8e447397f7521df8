"""The user-origin settings (hub_config/origin.py): what an operator may set, and what it does."""

from __future__ import annotations

import re

import pytest
from traitlets.config import Config

from gpulab.hub_config.origin import (
    configure_origin,
    content_security_policy,
    route_servers_to_services,
    subdomain_hook,
    user_label,
    users_host,
)


def test_users_host_defaults_to_localhost_and_none_turns_it_off() -> None:
    assert users_host("", 8000) == "http://localhost:8000"
    assert users_host("https://hub.example.org/", 8000) == "https://hub.example.org"
    assert users_host("NONE", 8000) == ""


@pytest.mark.parametrize(
    "bad",
    [
        "hub.example.org",
        "ftp://hub.example.org",
        "https://hub.example.org/x",
        "http://10.0.0.1:8000",
    ],
)
def test_a_bad_subdomain_host_names_the_setting_and_what_is_allowed(bad: str) -> None:
    with pytest.raises(ValueError) as e:
        users_host(bad, 8000)
    assert "GPULAB_SUBDOMAIN_HOST" in str(e.value)


def test_users_get_subdomains_and_services_stay_on_the_hubs_host() -> None:
    assert subdomain_hook("alice", "hub.example.org", "user") == "alice.hub.example.org"
    assert subdomain_hook("billing", "hub.example.org", "service") == "hub.example.org"


def test_configure_sets_jupyterhubs_subdomain_host_and_the_csp() -> None:
    c = Config()
    configure_origin(c, "https://hub.example.org")
    assert c.JupyterHub.subdomain_host == "https://hub.example.org"
    csp = c.JupyterHub.tornado_settings["headers"]["Content-Security-Policy"]
    assert csp == content_security_policy("https://hub.example.org")
    assert "form-action 'self' https://*.hub.example.org;" in csp
    # Over https the hub's login cookie is a __Host- one: no subdomain can toss a replacement.
    assert c.JupyterHub.cookie_host_prefix_enabled is True
    local = Config()
    configure_origin(local, "http://localhost:8000")
    assert "cookie_host_prefix_enabled" not in local.JupyterHub
    off = Config()
    configure_origin(off, "")
    assert "subdomain_host" not in off.JupyterHub


def test_servers_that_reach_billing_through_the_proxy_keep_a_route_to_it() -> None:
    c = Config()
    c.JupyterHub.port = 8000
    configure_origin(c, "https://hub.example.org")
    c.JupyterHub.services = [{"name": "billing", "url": "http://billing:10101"}]
    c.Spawner.environment = {"GPULAB_BILLING_URL": "http://proxy:8000/services/billing/"}
    route_servers_to_services(c)
    assert c.Proxy.extra_routes == {"proxy/services/billing/": "http://billing:10101"}
    # Servers that reach billing's own port need no route.
    direct = Config()
    direct.JupyterHub.port = 8000
    configure_origin(direct, "http://localhost:8000")
    direct.JupyterHub.services = [{"name": "billing", "url": "http://127.0.0.1:10101"}]
    direct.Spawner.environment = {"GPULAB_BILLING_URL": "http://127.0.0.1:10101/services/billing/"}
    route_servers_to_services(direct)
    assert "extra_routes" not in direct.Proxy


# A pair found by a tester in seconds of CPU: JupyterHub's 'idna' naming gives both
# "u-aliceuni--01b8dab", so the second account would serve pages on the first one's origin.
COLLIDING = ("alice@uni.edu", "alice@uni.edu.@++!~++_")


def test_names_that_collide_under_jupyterhubs_naming_get_origins_of_their_own() -> None:
    from jupyterhub.utils import subdomain_hook_idna

    a, b = COLLIDING
    assert subdomain_hook_idna(a, "h", "user") == subdomain_hook_idna(b, "h", "user")
    assert subdomain_hook(a, "h", "user") != subdomain_hook(b, "h", "user")


@pytest.mark.parametrize(
    "name",
    [
        "alice@uni.edu",
        "BOB",
        "café",
        "\uff42\uff4f\uff42",
        "x--y",
        "xn--caf-dma",
        "-bob",
        "bob.",
        "a" * 70,
    ],
)
def test_a_name_that_is_no_plain_label_is_escaped_with_128_bits(name: str) -> None:
    label = user_label(name)
    assert re.fullmatch(r"u-[a-z0-9]{0,20}--[0-9a-f]{32}", label), label
    assert len(label) <= 63


def test_no_name_can_be_chosen_to_equal_anothers_escaped_label() -> None:
    victim = user_label("alice@uni.edu")
    # Signing up under the victim's label itself, or its plain spellings, gives another label.
    for attacker in (victim, victim.upper(), victim.replace("--", "-"), "aliceuniedu"):
        assert user_label(attacker) != victim, attacker
    assert user_label("bob") == "bob" and user_label("bo-b") == "bo-b"
