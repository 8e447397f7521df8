"""`docker-compose config` of the repository's docker-compose.yml, with test values for every
variable it requires (the tests in this folder read the layout from it, never from a copy)."""

from __future__ import annotations

import os
import shutil
import subprocess

import yaml
from conftest import require
from harness import REPO

# Every variable docker-compose.yml refuses to run without, each with a distinct value so that a
# test can tell which one ended up where.
REQUIRED = {
    "POSTGRES_SUPERUSER_PASSWORD": "pg-superuser-secret-for-test",
    "GPULAB_HUB_DB_PASSWORD": "pg-hub-secret-for-test",
    "GPULAB_BILLING_DB_PASSWORD": "pg-billing-secret-for-test",
    "CONFIGPROXY_AUTH_TOKEN": "proxy-token-for-test",
    "GPULAB_BILLING_API_TOKEN": "billing-token-for-test",
    "DOCKER_GID": "4242",
}


def compose_config() -> dict:
    exe = shutil.which("docker-compose")
    require(exe is not None, "docker-compose (Debian package docker-compose)")
    # Only the test values: an operator's .env or shell must not change what is checked.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "POSTGRES_"))}
    out = subprocess.run(
        [exe, "-f", str(REPO / "docker-compose.yml"), "config"],
        env={**clean, **REQUIRED},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def service_networks(svc: dict) -> dict[str, list[str]]:
    """A service's networks -> its extra aliases there (the list and the map syntax alike)."""
    nets = svc.get("networks") or {}
    if isinstance(nets, list):
        return {n: [] for n in nets}
    return {n: list((v or {}).get("aliases", [])) for n, v in nets.items()}


def user_network(cfg: dict) -> str:
    """The compose key of the network the hub puts user containers on."""
    name = cfg["services"]["hub"]["environment"]["GPULAB_DOCKER_NETWORK"]
    found = [k for k, net in cfg["networks"].items() if (net or {}).get("name") == name]
    assert len(found) == 1, (name, cfg["networks"])
    return found[0]


def command_options(command: list[str]) -> dict[str, str]:
    """``--name=value`` options of a command line (configurable-http-proxy's)."""
    return dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)


def internal_network(cfg: dict) -> str:
    """The compose key of the one `internal: true` network."""
    found = [k for k, net in cfg["networks"].items() if (net or {}).get("internal")]
    assert len(found) == 1, cfg["networks"]
    return found[0]


# ---- scripts run in the test containers of the network tests ------------------------------------

# Accept-and-close listeners on HOST:PORT arguments. A name is resolved in the container, as
# configurable-http-proxy resolves its --api-ip (Node's listen looks the name up).
LISTEN = r"""
import socket, sys, threading, time
def serve(sock):
    while True:
        conn, _ = sock.accept()
        conn.close()
for arg in sys.argv[1:]:
    host, port = arg.rsplit(":", 1)
    for _ in range(100):
        try:
            sock = socket.create_server((socket.gethostbyname(host), int(port)))
            break
        except OSError:
            # Swarm's DNS may learn a new task's alias a moment after the task starts.
            time.sleep(0.2)
    else:
        raise SystemExit(f"cannot listen on {arg}")
    threading.Thread(target=serve, args=(sock,), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"""

PROBE = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        return "open"
    except socket.gaierror:
        return "no such name"
    except TimeoutError:
        return "timed out"
    except OSError as e:
        return type(e).__name__
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    print(json.dumps(dict(zip(sys.argv[1:], pool.map(probe, sys.argv[1:])))))
"""
