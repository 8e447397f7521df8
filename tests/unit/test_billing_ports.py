"""The managed billing service never takes a port the hub's own processes are about to bind."""

from __future__ import annotations

from traitlets.config import Config

from gpulab.hub_config.billing.hooks import _free_port_besides, _hub_ports


def test_billing_port_avoids_the_hubs_own_ports() -> None:
    c = Config()
    c.JupyterHub.port = 40097
    c.JupyterHub.hub_port = 40098
    c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:40099"
    assert _hub_ports(c) == {40097, 40098, 40099}
    # A picker that offers the proxy's public port first (what happened once in a benchmark:
    # billing listened there and every start was refused) ends on a port nobody else wants.
    offers = iter([40097, 40099, 40098, 41000])
    assert _free_port_besides(_hub_ports(c), lambda: next(offers)) == 41000
