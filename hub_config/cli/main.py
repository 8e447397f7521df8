"""``gpulab``: the command line of a gpulab node.

``gpulab up`` validates the catalog and GPU settings, prepares the data dir (admin password on
first start), prints how to log in and runs JupyterHub in this process.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from gpulab.catalog import CatalogError, load_catalog
from gpulab.hub_config import origin
from gpulab.hub_config.cli.images import add_images_parser, cmd_images
from gpulab.hub_config.cli.kubernetes import add_kubernetes_parser, cmd_kubernetes
from gpulab.hub_config.cli.models import add_models_parser, cmd_models
from gpulab.hub_config.data_dir import admin_password, make_private_data_dir
from gpulab.spawners.node.inventory import GpuInventory, SimulateSpecError, parse_simulate_spec

CONFIG_FILE = Path(__file__).resolve().parent.parent / "jupyterhub_config.py"
DEMO_POOL = "RTX-4090:4,A100-80G:2,H100-80G:1"


def _port(value: str) -> int:
    port = int(value)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port must be 1-65535, not {port}")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpulab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the platform (JupyterHub + GPU spawner + SQLite)")
    up.add_argument(
        "--ip",
        default=os.environ.get("GPULAB_IP", "127.0.0.1"),
        help="address browsers connect to (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    up.add_argument(
        "--port",
        type=_port,
        default=int(os.environ.get("GPULAB_PORT", "8000")),
        help="port browsers connect to: the proxy's public port (default 8000)",
    )
    up.add_argument(
        "--hub-port",
        type=_port,
        default=int(os.environ.get("GPULAB_HUB_PORT", "8081")),
        help="the hub's own port, behind the proxy (default 8081)",
    )
    up.add_argument(
        "--proxy-api-port",
        type=_port,
        default=int(os.environ.get("GPULAB_PROXY_API_PORT", "8001")),
        help="configurable-http-proxy's REST API port on 127.0.0.1 (default 8001)",
    )
    up.add_argument(
        "--data-dir",
        default=os.environ.get("GPULAB_DATA_DIR", ".gpulab"),
        help="state: hub database, homes, allocation ledger, logs (default ./.gpulab)",
    )
    up.add_argument(
        "--simulate-gpus",
        default=os.environ.get("GPULAB_SIMULATE_GPUS", "auto"),
        metavar="SPEC",
        help=f"simulated GPUs, e.g. 'A100-80G:2,RTX-4090:4'; 'auto' (default): {DEMO_POOL} "
        "when NVML finds no GPU; 'none': never",
    )
    up.add_argument("--catalog", default=os.environ.get("GPULAB_CATALOG", ""), help="catalog TOML")
    up.add_argument(
        "--open-signup",
        action="store_true",
        default=os.environ.get("GPULAB_OPEN_SIGNUP") == "1",
        help="let new sign-ups log in without admin approval",
    )
    up.add_argument(
        "--unsafe-signup-without-isolation",
        action="store_true",
        default=os.environ.get("GPULAB_UNSAFE_SIGNUP_WITHOUT_ISOLATION") == "1",
        help="allow sign-up even though this hub does not run as root, so every local server "
        "runs as this one Unix user: each user could read and change every other user's "
        "files, kernels and tokens, and the hub's own secrets (off by default)",
    )
    up.add_argument(
        "--spawner",
        choices=("local", "docker", "swarm"),
        default=os.environ.get("GPULAB_SPAWNER", "local"),
        help="run servers as local processes (default), in Docker containers from the "
        "catalog's preloaded images, or as Docker Swarm services on GPU nodes (GPULAB_HUB_IP, "
        "GPULAB_SWARM_MANAGER, GPULAB_SWARM_NODE_ENGINES, GPULAB_SWARM_SHARED_HOME)",
    )
    up.add_argument(
        "--subdomain-host",
        default=os.environ.get("GPULAB_SUBDOMAIN_HOST", ""),
        metavar="URL",
        help="the hub's public URL whose subdomains serve users' servers, each on an origin of "
        "its own: alice's at NAME.HOST (needs wildcard DNS, and a wildcard certificate for "
        "https), e.g. https://hub.example.org; default http://localhost:PORT (browsers resolve "
        "*.localhost to this machine); 'none' serves users' pages on the hub's own origin, "
        "where any user's page can act as whoever opens it (unsafe)",
    )
    up.add_argument("jupyterhub_args", nargs="*", help="extra JupyterHub arguments (after --)")
    add_images_parser(sub)
    add_models_parser(sub)
    add_kubernetes_parser(sub)
    return parser


def resolve_simulation(spec: str, catalog_path: str) -> str:
    """Turn 'auto'/'none'/a spec into the spec the hub uses, validating it against the catalog."""
    catalog = load_catalog(catalog_path or None)
    if spec == "none":
        return ""
    if spec == "auto":
        inventory = GpuInventory(catalog)
        if inventory.devices:
            return ""
        print(f"gpulab: no GPU found by NVML; simulating a demo pool: {DEMO_POOL} (SIMULATED)")
        spec = DEMO_POOL
    parse_simulate_spec(spec, catalog)
    return spec


def cmd_up(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    if args.spawner == "swarm":
        if args.simulate_gpus not in ("auto", "none"):
            print(
                "gpulab: --simulate-gpus: a swarm's cards are its nodes' (simulated ones are "
                "advertised by the nodes, labelled gpulab.simulated=true); allowed: auto, none",
                file=sys.stderr,
            )
            return 2
        args.simulate_gpus = "none"
    try:
        simulate = resolve_simulation(args.simulate_gpus, args.catalog)
    except (CatalogError, SimulateSpecError) as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    make_private_data_dir(data_dir)
    password, new = admin_password(data_dir)
    os.environ.update(
        GPULAB_DATA_DIR=str(data_dir),
        GPULAB_IP=args.ip,
        GPULAB_PORT=str(args.port),
        GPULAB_HUB_PORT=str(args.hub_port),
        GPULAB_PROXY_API_PORT=str(args.proxy_api_port),
        GPULAB_SIMULATE_GPUS=simulate,
        GPULAB_CATALOG=args.catalog,
        GPULAB_OPEN_SIGNUP="1" if args.open_signup else "0",
        GPULAB_UNSAFE_SIGNUP_WITHOUT_ISOLATION="1" if args.unsafe_signup_without_isolation else "0",
        GPULAB_SPAWNER=args.spawner,
        GPULAB_SUBDOMAIN_HOST=args.subdomain_host,
    )
    try:
        users_host = origin.users_host(args.subdomain_host, args.port)
    except ValueError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    if users_host:
        print(f"gpulab: starting on {users_host}  (data: {data_dir})")
        name = urlparse(users_host)
        print(
            f"gpulab: each user's server on its own origin: {name.scheme}://NAME.{name.netloc}"
            f"/user/NAME/ (open the hub at {users_host}, not at its IP address)"
        )
    else:
        host = "127.0.0.1" if args.ip in ("", "0.0.0.0") else args.ip
        print(f"gpulab: starting on http://{host}:{args.port}  (data: {data_dir})")
        print(
            "gpulab: WARNING: --subdomain-host none: users' servers share the hub's origin, so "
            "a page a user serves can act as anyone who opens it (staff included)"
        )
    if new:
        print(
            f"gpulab: log in as 'admin' with password {password}  (saved in {data_dir}/admin-password)"
        )
    else:
        print(f"gpulab: log in as 'admin'; the password is in {data_dir}/admin-password")
    if args.spawner == "local" and os.geteuid() != 0 and not args.unsafe_signup_without_isolation:
        pass  # configure() says why sign-up is closed
    else:
        print(
            "gpulab: new users sign up at /hub/signup; "
            + (
                "sign-up is open."
                if args.open_signup
                else "the admin approves them at /hub/authorize."
            )
        )
    sys.stdout.flush()

    # JupyterHub's app is heavy to import: only `gpulab up` needs it.
    from jupyterhub.app import main as jupyterhub_main

    jupyterhub_main(["-f", str(CONFIG_FILE), *args.jupyterhub_args])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return cmd_up(args)
    if args.command == "images":
        return cmd_images(args)
    if args.command == "models":
        return cmd_models(args)
    if args.command == "kubernetes":
        return cmd_kubernetes(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
