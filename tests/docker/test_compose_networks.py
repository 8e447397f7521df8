"""The compose file's network layout, for real: its networks created in the Docker Engine as
docker-compose.yml defines them, a stand-in container per service (the test image, listening on
the service's real ports with the service's network attachments and aliases), and a stand-in
user server on the users' network that must reach the hub's API and the proxy's public port and
nothing else: not PostgreSQL, not billing's own port, not the proxy's API, by name or by address.

The stand-ins only accept and close TCP connections; what is checked is the Docker networking
(the isolation between bridges, `internal: true`, network-scoped aliases) and where each service
binds, which is what keeps a tenant out."""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlparse

import pytest
from compose_helpers import (
    LISTEN,
    PROBE,
    command_options,
    compose_config,
    internal_network,
    service_networks,
    user_network,
)

LABEL = "org.gpulab.test-compose-networks"


# Network keys this test knows how to reproduce; anything else must be added here, so that the
# test never checks a layout other than the file's.
NETWORK_KEYS = {"name", "internal", "driver", "driver_opts", "labels", "attachable"}


def listeners(cfg: dict) -> dict[str, list[str]]:
    """Each service's HOST:PORT listeners, as the real service binds them."""
    services = cfg["services"]
    proxy = command_options(services["proxy"]["command"])
    billing = urlparse(services["billing"]["environment"]["JUPYTERHUB_SERVICE_URL"])
    hub_ip = services["hub"]["environment"]["GPULAB_HUB_IP"]
    return {
        # The image's default: listen_addresses = '*'.
        "postgres": ["0.0.0.0:5432"],
        "billing": [f"{billing.hostname}:{billing.port}"],
        # CHP's --ip defaults to every address.
        "proxy": [f"{proxy.get('ip') or '0.0.0.0'}:{proxy['port']}", f"{proxy['api-ip']}:{proxy['api-port']}"],
        "hub": [f"{hub_ip}:8081"],
    }  # fmt: skip


@pytest.fixture(scope="module")
def layout(docker, test_image: str):
    """The compose file's networks and services as stand-ins; everything removed afterwards,
    whatever happened."""
    cfg = compose_config()
    run = f"gpulab-nettest-{uuid.uuid4().hex[:8]}"
    labels = {LABEL: run}
    nets: dict[str, str] = {}
    containers: dict[str, object] = {}
    try:
        for key, net in cfg["networks"].items():
            net = net or {}
            assert set(net) <= NETWORK_KEYS, f"network {key}: reproduce {set(net) - NETWORK_KEYS}"
            assert net.get("driver", "bridge") == "bridge", key
            name = f"{run}-{key}"
            docker.networks.create(
                name,
                driver="bridge",
                internal=bool(net.get("internal")),
                options=net.get("driver_opts"),
                labels={**labels, **(net.get("labels") or {})},
            )
            nets[key] = name
        for svc, binds in listeners(cfg).items():
            attach = service_networks(cfg["services"][svc])
            first, *rest = attach
            # As compose does: every network gets the service name as an alias, plus its own.
            aliases = {key: [svc, *extra] for key, extra in attach.items()}
            api = docker.api
            # Its published ports too, on loopback and a free host port (this machine's 8000 may
            # be taken): Docker publishes through a non-internal network only, so this shows
            # that the public port still works with the proxy also on the internal network.
            published = [published_target(p) for p in cfg["services"][svc].get("ports", [])]
            created = api.create_container(
                test_image,
                ["python", "-c", LISTEN, *binds],
                name=f"{run}-{svc}",
                labels=labels,
                ports=published,
                host_config=api.create_host_config(
                    network_mode=nets[first],
                    port_bindings={port: ("127.0.0.1", None) for port in published},
                ),
                networking_config=api.create_networking_config(
                    {nets[first]: api.create_endpoint_config(aliases=aliases[first])}
                ),
            )
            # Connected before it starts, as compose does: the proxy resolves its API alias
            # at start.
            for key in rest:
                api.connect_container_to_network(created["Id"], nets[key], aliases=aliases[key])
            container = docker.containers.get(created["Id"])
            container.start()
            containers[svc] = container
        for svc, container in containers.items():
            deadline = time.monotonic() + 30
            while b"listening" not in container.logs():
                container.reload()
                assert container.status == "running", (svc, container.logs()[-2000:])
                assert time.monotonic() < deadline, (svc, container.logs()[-2000:])
                time.sleep(0.2)
        yield cfg, nets, containers, run
    finally:
        for c in docker.containers.list(all=True, filters={"label": f"{LABEL}={run}"}):
            c.remove(force=True)
        for n in docker.networks.list(filters={"label": f"{LABEL}={run}"}):
            n.remove()


def published_target(port) -> int:
    """The container port of a `ports` entry of `docker-compose config` (long or short form)."""
    if isinstance(port, dict):
        return int(port["target"])
    return int(str(port).rsplit(":", 1)[-1].split("/")[0])


def host_port(container, port: int) -> int:
    container.reload()
    return int(container.attrs["NetworkSettings"]["Ports"][f"{port}/tcp"][0]["HostPort"])


def ip_on(container, network: str) -> str:
    container.reload()
    return container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]


def probe_from(container, *targets: str) -> dict[str, str]:
    code, out = container.exec_run(["python", "-c", PROBE, *targets])
    assert code == 0, out.decode(errors="replace")
    return json.loads(out)


def test_a_user_container_reaches_the_hub_and_the_proxy_only(docker, test_image, layout) -> None:
    cfg, nets, containers, run = layout
    users = user_network(cfg)
    internal = internal_network(cfg)
    henv = cfg["services"]["hub"]["environment"]
    # What servers are told to use: the hub's API and billing's route on the proxy's public port.
    hub_api = f"{henv['GPULAB_HUB_CONNECT_IP']}:8081"
    public = urlparse(henv["GPULAB_BILLING_SERVER_URL"])
    assert public.port == int(command_options(cfg["services"]["proxy"]["command"])["port"])
    # The proxy's API where the hub calls it.
    api = urlparse(henv["GPULAB_PROXY_API_URL"])
    billing_port = urlparse(
        cfg["services"]["billing"]["environment"]["JUPYTERHUB_SERVICE_URL"]
    ).port
    inside = {
        "postgres": "postgres:5432",
        "billing": f"billing:{billing_port}",
        "proxy api": f"{api.hostname}:{api.port}",
    }

    # The stand-ins listen, and the services that must reach them do: otherwise a refusal below
    # would prove nothing.
    assert probe_from(containers["hub"], *inside.values(), hub_api) == dict.fromkeys(
        [*inside.values(), hub_api], "open"
    )
    assert probe_from(containers["proxy"], f"billing:{billing_port}", "hub:8081") == {
        f"billing:{billing_port}": "open",
        "hub:8081": "open",
    }
    assert probe_from(containers["billing"], "hub:8081") == {"hub:8081": "open"}

    # A user's server, on the network the hub puts servers on, locked down as the spawner
    # locks it (uid 1000, no capabilities).
    by_address = {
        f"{ip_on(containers['postgres'], nets[internal])}:5432",
        f"{ip_on(containers['billing'], nets[internal])}:{billing_port}",
        f"{ip_on(containers['proxy'], nets[internal])}:{api.port}",
        # The API is not on the proxy's address on the users' network either.
        f"{ip_on(containers['proxy'], nets[users])}:{api.port}",
        f"proxy:{api.port}",
    }
    reachable = {hub_api, f"{public.hostname}:{public.port}"}
    server = docker.containers.run(
        test_image,
        ["sleep", "infinity"],
        name=f"{run}-user-server",
        labels={LABEL: run},
        network=nets[users],
        user="1000",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        detach=True,
    )
    found = probe_from(server, *reachable, *inside.values(), *by_address)
    assert {t: found[t] for t in reachable} == dict.fromkeys(reachable, "open"), found
    refused = {t: r for t, r in found.items() if t not in reachable}
    assert "open" not in refused.values(), found
    # The internal names don't even resolve there.
    assert {found[t] for t in inside.values()} == {"no such name"}, found


def test_published_ports_reach_the_service_from_the_host(layout) -> None:
    """The proxy's public port, published as compose publishes it, answers on the host although
    the proxy is on the internal network too."""
    cfg, _, containers, _ = layout
    published = {
        svc: [published_target(p) for p in spec.get("ports", [])]
        for svc, spec in cfg["services"].items()
    }
    assert {svc for svc, ports in published.items() if ports} == {"proxy"}, published
    for svc, ports in published.items():
        for port in ports:
            socket.create_connection(("127.0.0.1", host_port(containers[svc], port)), 5).close()
