"""docker-stack.yml, the Swarm twin of docker-compose.yml (docs/swarm.md).

Checked as `docker stack deploy` reads it (`docker stack config`, the CLI's own loader and
interpolation): the same four services as the single-node stack, all pinned to the hub's node,
exactly one hub, nothing the Swarm loader silently ignores, unprivileged users, the same internal
network as docker-compose.yml (PostgreSQL, billing and the proxy's API only there), only the hub's
API and the proxy's public port published (on the hub's node), and no secret in any environment:
every secret is a Docker secret, mounted where a command reads it.

Then the layout for real: the stack deployed with `docker stack deploy` on a real multi-engine
swarm (``swarm_cluster``), every service replaced by a stand-in from the test image that listens
where the real one listens (the proxy's API on the address of its ``proxy-api`` alias), and a
stand-in user server on a GPU node (another engine), attached as gpulab-swarm attaches servers (to
no network of the stack), that must reach the hub's API and the proxy's public port at the hub
node's address and nothing else. The real images (hub, configurable-http-proxy, PostgreSQL) cannot
be built or pulled here (no registry), so the services' own processes are not run.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from urllib.parse import urlparse

import pytest
import yaml
from compose_helpers import LISTEN, PROBE, command_options, compose_config, service_networks
from conftest import require
from harness import REPO, wait_for

# The multi-engine test swarm (network namespaces, a bridge, extra dockerds, heavy on a 2-core
# machine): its modules run one after another on one worker of a parallel run.
pytestmark = pytest.mark.xdist_group("swarm")

STACK = REPO / "docker-stack.yml"
# The only variables the stack needs from the operator's shell (secrets come from Docker secrets):
# the socket's group and the hub node's address, where servers on GPU nodes reach the hub.
REQUIRED = {"DOCKER_GID": "4242", "GPULAB_HUB_NODE_IP": "10.0.0.1"}
HUB_NODE = ["node.role == manager", "node.labels.gpulab.hub == true"]
# Keys of docker-compose.yml that `docker stack deploy` ignores without a word: a stack file that
# carries one promises something Swarm does not do.
IGNORED_BY_SWARM = {"build", "depends_on", "restart", "container_name", "links", "devices"}
# Environment names that would carry a secret in docker-compose.yml's way of passing them.
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|_KEY$|DB_URL", re.I)


def stack_config(env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    docker = shutil.which("docker")
    require(docker is not None, "the docker CLI (Debian package docker.io)")
    probe = subprocess.run([docker, "stack", "config", "--help"], capture_output=True, timeout=30)
    require(probe.returncode == 0, "`docker stack config` (docker CLI >= 20.10)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "DOCKER_"))}
    return subprocess.run(
        [docker, "stack", "config", "-c", str(STACK)],
        env={**clean, **(REQUIRED if env is None else env)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def stack() -> dict:
    out = stack_config()
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def roles(cfg: dict) -> dict[str, str]:
    """Network key -> "internal" (`internal: true`) or "other"."""
    return {
        key: "internal" if (net or {}).get("internal") else "other"
        for key, net in cfg["networks"].items()
    }


def layout(cfg: dict) -> dict[str, dict[str, list[str]]]:
    """Service -> network role -> its extra aliases there."""
    r = roles(cfg)
    return {
        svc: {r[key]: sorted(aliases) for key, aliases in service_networks(spec).items()}
        for svc, spec in cfg["services"].items()
    }


def published(spec: dict) -> list[tuple[int, int, str]]:
    """(target, published, mode) of each port a service publishes."""
    return [(p["target"], int(p["published"]), p["mode"]) for p in spec.get("ports", [])]


def command_text(spec: dict) -> str:
    return " ".join([*(spec.get("entrypoint") or []), *(spec.get("command") or [])])


def test_the_stack_file_loads_and_asks_only_for_the_socket_group_and_hub_address() -> None:
    ok = stack_config()
    assert ok.returncode == 0, ok.stderr
    for name in REQUIRED:
        missing = stack_config(env={k: v for k, v in REQUIRED.items() if k != name})
        assert missing.returncode != 0
        assert name in missing.stderr, missing.stderr


def test_the_same_services_as_the_single_node_stack_all_on_the_hub_node(stack) -> None:
    assert set(stack["services"]) == set(compose_config()["services"])
    for name, spec in stack["services"].items():
        assert not IGNORED_BY_SWARM & set(spec), (name, IGNORED_BY_SWARM & set(spec))
        deploy = spec["deploy"]
        # Their state is in local volumes on that node: elsewhere they would start empty.
        assert deploy["placement"]["constraints"] == HUB_NODE, name
        assert deploy.get("replicas") == 1, name
        assert deploy["restart_policy"]["condition"] == "any", name
        # Names resolve to the task itself: no virtual IP (IPVS) between the platform services.
        assert deploy["endpoint_mode"] == "dnsrr", name
    hub = stack["services"]["hub"]
    # Never two hubs: they would hand out the same cards.
    assert hub["deploy"].get("mode", "replicated") == "replicated"
    assert hub["deploy"]["update_config"]["order"] == "stop-first"
    assert hub["environment"]["GPULAB_SPAWNER"] == "swarm"
    # Servers are created through the manager's engine; only the hub has its socket.
    sockets = {
        name
        for name, spec in stack["services"].items()
        for v in spec.get("volumes", [])
        if v.get("source") == "/var/run/docker.sock"
    }
    assert sockets == {"hub"}
    # Unprivileged users, the hub with the socket's group only.
    assert hub["user"] == f"gpulab-hub:{REQUIRED['DOCKER_GID']}"
    assert stack["services"]["billing"]["user"] == "gpulab-billing"


def test_ssh_is_off_on_a_swarm(stack) -> None:
    """Issue 25 (SSH): the gateway is off on a swarm, said so: servers run on other nodes'
    engines, out of reach of `docker exec` through the manager's socket, and no port of it is
    published."""
    assert stack["services"]["hub"]["environment"]["GPULAB_SSH_PORT"] == "0"
    published = [p for spec in stack["services"].values() for p in spec.get("ports", [])]
    assert all(str(p.get("target")) != "8022" for p in published), published


def test_servers_can_reach_only_the_hubs_api_and_the_proxys_public_port(stack) -> None:
    compose = compose_config()
    services = stack["services"]
    internal = next(k for k, r in roles(stack).items() if r == "internal")
    assert stack["networks"][internal]["driver"] == "overlay"
    assert stack["networks"][internal]["internal"] is True
    # The internal network is the single-node stack's: the same services, the same aliases.
    on_internal = {s: nets["internal"] for s, nets in layout(stack).items() if "internal" in nets}
    in_compose = {s: nets["internal"] for s, nets in layout(compose).items() if "internal" in nets}
    assert on_internal == in_compose
    # PostgreSQL and billing are on nothing else, and publish nothing.
    assert layout(stack)["postgres"] == {"internal": []}
    assert layout(stack)["billing"] == {"internal": []}
    # gpulab-swarm attaches servers to no network of the stack: on the GPU nodes they reach the
    # hub node's address, where exactly two ports are published (on that node, not the mesh).
    proxy = services["proxy"]
    opts = command_options(command_text(proxy).split())
    hub_port = 8081
    assert {s: published(spec) for s, spec in services.items() if spec.get("ports")} == {
        "hub": [(hub_port, hub_port, "host")],
        "proxy": [(int(opts["port"]), 8000, "host")],
    }
    # The proxy's API is bound to an alias of the internal network only, and the proxy resolves
    # it to its own address there: with dnsrr (a virtual IP cannot be bound). Not published.
    assert layout(stack)["proxy"]["internal"] == [opts["api-ip"]]
    assert proxy["deploy"]["endpoint_mode"] == "dnsrr"
    henv = services["hub"]["environment"]
    assert urlparse(henv["GPULAB_PROXY_API_URL"]).hostname == opts["api-ip"]
    # Servers are told the hub node's address for the hub's API and for billing's public route.
    node_ip = REQUIRED["GPULAB_HUB_NODE_IP"]
    assert henv["GPULAB_HUB_CONNECT_IP"] == node_ip
    assert henv["GPULAB_BILLING_SERVER_URL"] == f"http://{node_ip}:8000/services/billing/"
    # The hub and the proxy get a way out to the GPU nodes (servers' published ports there).
    assert {s for s, nets in layout(stack).items() if "other" in nets} == {"hub", "proxy"}
    assert all(
        not stack["networks"][k].get("internal") for k, r in roles(stack).items() if r == "other"
    )


def test_no_secret_is_in_any_environment(stack) -> None:
    compose = compose_config()
    # Every variable that carries a secret in docker-compose.yml...
    compose_secrets = {
        key
        for spec in compose["services"].values()
        for key in (spec.get("environment") or {})
        if SECRET_NAME.search(key)
    }
    assert compose_secrets, "docker-compose.yml passes its secrets in the environment"
    for name, spec in stack["services"].items():
        env = spec.get("environment") or {}
        # ...is absent here; a secret-looking name only points at a Docker secret's file.
        assert not compose_secrets & set(env), (name, compose_secrets & set(env))
        for key, value in env.items():
            if SECRET_NAME.search(key):
                assert key.endswith("_FILE") and value.startswith("/run/secrets/"), (name, key)
        # Each secret file a service reads is a secret mounted into that service.
        mounted = {s["source"] if isinstance(s, dict) else s for s in spec.get("secrets", [])}
        read = set(re.findall(r"/run/secrets/([\w.-]+)", command_text(spec) + json.dumps(env)))
        assert read == mounted, (name, read, mounted)
        # Readable by the service's own user only where it runs as one.
        for s in spec.get("secrets", []):
            if isinstance(s, dict) and "uid" in s:
                assert s["mode"] == 0o400, (name, s)
    # Created by the operator (`docker secret create`), never from a file in the checkout.
    assert stack["secrets"] and all(s.get("external") for s in stack["secrets"].values())


def test_postgres_gets_the_same_roles_and_databases_as_the_single_node_stack(stack) -> None:
    compose = compose_config()
    # docker-compose 1.x prints the short syntax (SOURCE:TARGET:MODE), 2.x the long one.
    mounts = [
        (v["source"], v["target"]) if isinstance(v, dict) else tuple(v.split(":")[:2])
        for v in compose["services"]["postgres"]["volumes"]
    ]
    init = [src for src, target in mounts if target.startswith("/docker-entrypoint-initdb.d/")]
    configs = stack["services"]["postgres"]["configs"]
    assert [c["target"] for c in configs] == ["/docker-entrypoint-initdb.d/10-gpulab.sql"]
    assert stack["configs"][configs[0]["source"]]["file"] == init[0]
    # initdb.sql reads the role passwords from these variables; the command exports them from
    # the secrets before the image's entrypoint runs it.
    text = command_text(stack["services"]["postgres"])
    for var in ("GPULAB_HUB_DB_PASSWORD", "GPULAB_BILLING_DB_PASSWORD"):
        assert f"{var}=" in text and var in (REPO / "images/compose/initdb.sql").read_text()
    # The services connect as those roles to their own databases.
    hub, billing = (command_text(stack["services"][s]) for s in ("hub", "billing"))
    assert "gpulab_hub:" in hub and "/jupyterhub" in hub
    assert "gpulab_billing:" in billing and "/billing" in billing


# ---- the layout on a real swarm -----------------------------------------------------------------


def listeners(cfg: dict) -> dict[str, list[str]]:
    """Where each real service listens (as tests/docker/test_compose_networks.py reads them)."""
    services = cfg["services"]
    proxy = command_options(command_text(services["proxy"]).split())
    billing = urlparse(services["billing"]["environment"]["JUPYTERHUB_SERVICE_URL"])
    return {
        "postgres": ["0.0.0.0:5432"],
        "billing": [f"{billing.hostname}:{billing.port}"],
        "proxy": [f"0.0.0.0:{proxy['port']}", f"{proxy['api-ip']}:{proxy['api-port']}"],
        "hub": [f"{services['hub']['environment']['GPULAB_HUB_IP']}:8081"],
    }


def stand_in_stack(cfg: dict, image: str, server_node: str) -> dict:
    """The stack with every service's process replaced by a listener on its real addresses,
    everything else Swarm acts on kept (networks, aliases, endpoint mode, placement, published
    ports, secrets, configs), plus a user server pinned to ``server_node``. Dropped: the images'
    users and volumes (the test image has neither gpulab's users nor the hub node's paths) and
    PostgreSQL's health check (no pg_isready in it)."""
    out = json.loads(json.dumps(cfg))
    out.pop("x-hub-node", None)
    out.pop("volumes", None)
    for name, spec in out["services"].items():
        for key in ("user", "volumes", "healthcheck", "command"):
            spec.pop(key, None)
        spec["image"] = image
        spec["entrypoint"] = ["python", "-c", LISTEN, *listeners(cfg)[name]]
    out["services"]["server"] = {
        "image": image,
        "entrypoint": ["sleep", "infinity"],
        # As gpulab-swarm makes a server: a plain uid, on no network of the stack (its node's
        # default bridge), pinned to its node.
        "user": "1000",
        "networks": [],
        "deploy": {"placement": {"constraints": [f"node.id == {server_node}"]}},
    }
    return out


def running_container(cluster, service: str, timeout: float = 120):
    """(node id, node engine client, container id) of the one running task of ``service``."""
    manager = cluster.manager_client()
    found: list = []

    def running() -> bool:
        tasks = manager.tasks(filters={"service": service, "desired-state": "running"})
        errors = [t["Status"].get("Err") for t in tasks if t["Status"].get("Err")]
        assert not errors, (service, errors)
        up = [t for t in tasks if t["Status"]["State"] == "running"]
        found[:] = up
        return len(up) == 1

    wait_for(running, timeout, interval=0.5, what=f"{service} to run")
    task = found[0]
    node = task["NodeID"]
    return node, cluster.node_of(node).client(), task["Status"]["ContainerStatus"]["ContainerID"]


def exec_probe(client, container: str, *targets: str) -> dict[str, str]:
    run = client.exec_create(container, ["python", "-c", PROBE, *targets])
    out = client.exec_start(run["Id"])
    assert client.exec_inspect(run["Id"])["ExitCode"] == 0, out
    return json.loads(out)


def test_a_user_server_on_a_gpu_node_reaches_the_hub_and_the_proxy_only(
    swarm_cluster, tmp_path
) -> None:
    cluster = swarm_cluster
    manager = cluster.manager_client()
    hub_node, gpu_node = cluster.nodes[0], cluster.nodes[1]
    # The stack as the operator renders it for this swarm: the hub node's address is node 1's.
    rendered = stack_config({**REQUIRED, "GPULAB_HUB_NODE_IP": hub_node.address})
    assert rendered.returncode == 0, rendered.stderr
    stack = yaml.safe_load(rendered.stdout)
    # The operator's step: the hub's node carries the label the stack pins its services to.
    info = manager.inspect_node(hub_node.node_id)
    labels = dict(info["Spec"].get("Labels") or {}, **{"gpulab.hub": "true"})
    manager.update_node(
        hub_node.node_id, info["Version"]["Index"], dict(info["Spec"], Labels=labels)
    )
    for name in stack["secrets"]:
        manager.create_secret(name, secrets.token_hex(16).encode())
    path = tmp_path / "stack.yml"
    path.write_text(yaml.safe_dump(stand_in_stack(stack, cluster.image, gpu_node.node_id)))
    name = f"gls{cluster.token}"
    # --resolve-image never: no registry to ask for digests (the images are on the nodes).
    argv = ["docker", "-H", cluster.manager_url, "stack", "deploy", "--resolve-image", "never"]
    deploy = subprocess.run(
        [*argv, "-c", str(path), name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert deploy.returncode == 0, deploy.stderr
    try:
        containers = {svc: running_container(cluster, f"{name}_{svc}") for svc in listeners(stack)}
        for svc, (node, client, cid) in containers.items():
            deadline = time.monotonic() + 60
            while b"listening" not in client.logs(cid):
                assert client.inspect_container(cid)["State"]["Running"], client.logs(cid)[-2000:]
                assert time.monotonic() < deadline, (svc, client.logs(cid)[-2000:])
                time.sleep(0.2)
            # The platform services run on the hub's node, as pinned.
            assert node == hub_node.node_id, svc
        node, server_client, server = running_container(cluster, f"{name}_server")
        assert node == gpu_node.node_id

        henv = stack["services"]["hub"]["environment"]
        api = urlparse(henv["GPULAB_PROXY_API_URL"])
        public = urlparse(henv["GPULAB_BILLING_SERVER_URL"])
        billing_port = urlparse(
            stack["services"]["billing"]["environment"]["JUPYTERHUB_SERVICE_URL"]
        ).port
        inside = ["postgres:5432", f"billing:{billing_port}", f"{api.hostname}:{api.port}"]
        # The hub reaches everything it uses (else a refusal below would prove nothing).
        _, hub_client, hub = containers["hub"]
        assert exec_probe(hub_client, hub, *inside) == dict.fromkeys(inside, "open")
        # Where a server is told the hub's API and billing's public route are.
        reachable = [f"{henv['GPULAB_HUB_CONNECT_IP']}:8081", f"{public.hostname}:{public.port}"]
        # What it must not reach: the internal services' own ports on the hub's node, and their
        # addresses on the internal overlay, however it learnt them.
        internal_net = f"{name}_{next(k for k, r in roles(stack).items() if r == 'internal')}"
        overlay = {
            svc: containers[svc][1].inspect_container(containers[svc][2])["NetworkSettings"][
                "Networks"
            ][internal_net]["IPAddress"]
            for svc in ("postgres", "billing", "proxy")
        }
        blocked = [
            *(f"{hub_node.address}:{port}" for port in (5432, billing_port, api.port)),
            f"{overlay['postgres']}:5432",
            f"{overlay['billing']}:{billing_port}",
            f"{overlay['proxy']}:{api.port}",
        ]
        # The hub reaches the internal ones at those addresses too (they are the right ones).
        assert set(exec_probe(hub_client, hub, *blocked[3:]).values()) == {"open"}
        found = exec_probe(server_client, server, *reachable, *blocked)
        assert {t: found[t] for t in reachable} == dict.fromkeys(reachable, "open"), found
        assert not {t for t in blocked if found[t] == "open"}, found
        # The public port, published on the hub's node itself.
        socket.create_connection((hub_node.address, public.port), timeout=5).close()
    finally:
        subprocess.run(
            ["docker", "-H", cluster.manager_url, "stack", "rm", name],
            capture_output=True,
            timeout=60,
        )
        wait_for(
            lambda: not manager.services(filters={"label": f"com.docker.stack.namespace={name}"}),
            60,
            interval=0.5,
            what="the stack's services to go",
        )
        for secret in stack["secrets"]:
            for _ in range(50):
                try:
                    manager.remove_secret(secret)
                    break
                except Exception:
                    # Still held by a task that is shutting down.
                    time.sleep(0.2)
