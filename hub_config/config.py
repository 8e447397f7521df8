"""Build the JupyterHub configuration of a gpulab node.

``gpulab up`` puts its settings in the environment (``GPULAB_*``) and starts JupyterHub with
``jupyterhub_config.py``, which calls :func:`configure`. An operator with a hand-written config can
call ``configure(c)`` too and override anything after it.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpulab.catalog import settings as table
from gpulab.hub_config.courses.lti import configure_from_env as configure_lti
from gpulab.hub_config.data_dir import admin_password, make_private_data_dir, secret_file
from gpulab.hub_config.origin import configure_origin, route_servers_to_services, users_host
from gpulab.hub_config.plugin import configure_plugin
from gpulab.hub_config.signup_handlers import signups_waiting

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Settings:
    """Everything ``gpulab up`` passes to the hub, read from ``GPULAB_*`` variables."""

    data_dir: Path
    ip: str = "127.0.0.1"
    port: int = 8000
    hub_port: int = 8081
    proxy_api_port: int = 8001
    simulate_gpus: str = ""
    catalog: str = ""
    admin_name: str = "admin"
    admin_token: str = ""
    # Prometheus' scrape token (service gpulab-prometheus, read:metrics only); "": no service.
    prometheus_token: str = ""
    open_signup: bool = False
    # Sign-up on a hub whose local servers all run as its one Unix user (not root).
    unsafe_signup_without_isolation: bool = False
    db_url: str = ""
    # Which spawner runs the servers: "local" (processes, the embedded default) or "docker".
    spawner: str = "local"
    # Docker only: the network user containers join, and where they reach the hub API. An empty
    # hub_ip binds the hub to that network's gateway (the host's address on it).
    docker_network: str = "bridge"
    hub_ip: str = ""
    hub_connect_ip: str = ""
    # A proxy run as its own service (docker-compose): its API URL; the hub then starts none.
    # Its token comes from CONFIGPROXY_AUTH_TOKEN, shared with the proxy.
    proxy_api_url: str = ""
    # Swarm only: the manager's Docker URL (empty: DOCKER_HOST or the local socket), each node's
    # own engine (JSON: node id, name or hostname -> Docker URL) and the shared home path.
    swarm_manager: str = ""
    swarm_node_engines: str = ""
    swarm_shared_home: str = ""
    # Where users' servers live: each on a subdomain of this host (hub_config/origin.py). ""
    # (unset): http://localhost:PORT; "none": on the hub's own origin (unsafe, see origin.py).
    subdomain_host: str = ""

    @classmethod
    def from_env(cls, env: os._Environ | dict | None = None) -> Settings:
        """The settings in ``env`` (default: this process's), parsed and checked by the settings
        table (gpulab.catalog.settings); a bad value stops the hub, naming the variable."""
        env = os.environ if env is None else env
        try:
            simulate = table.get("GPULAB_SIMULATE_GPUS", env)
            engines = table.get("GPULAB_SWARM_NODE_ENGINES", env)
            return cls(
                data_dir=Path(table.get("GPULAB_DATA_DIR", env)).resolve(),
                ip=table.get("GPULAB_IP", env),
                port=table.get("GPULAB_PORT", env),
                hub_port=table.get("GPULAB_HUB_PORT", env),
                proxy_api_port=table.get("GPULAB_PROXY_API_PORT", env),
                # `gpulab up` resolves "auto" to a spec (or none) before the hub starts.
                simulate_gpus="" if simulate in ("auto", "none") else simulate,
                catalog=table.get("GPULAB_CATALOG", env),
                admin_name=table.get("GPULAB_ADMIN_USER", env),
                admin_token=table.get("GPULAB_ADMIN_TOKEN", env),
                prometheus_token=table.get("GPULAB_PROMETHEUS_TOKEN", env),
                open_signup=table.get("GPULAB_OPEN_SIGNUP", env),
                unsafe_signup_without_isolation=table.get(
                    "GPULAB_UNSAFE_SIGNUP_WITHOUT_ISOLATION", env
                ),
                db_url=table.get("GPULAB_DB_URL", env),
                spawner=table.get("GPULAB_SPAWNER", env),
                docker_network=table.get("GPULAB_DOCKER_NETWORK", env),
                hub_ip=table.get("GPULAB_HUB_IP", env),
                hub_connect_ip=table.get("GPULAB_HUB_CONNECT_IP", env),
                proxy_api_url=table.get("GPULAB_PROXY_API_URL", env),
                swarm_manager=table.get("GPULAB_SWARM_MANAGER", env),
                swarm_node_engines=json.dumps(engines) if engines is not None else "",
                swarm_shared_home=table.get("GPULAB_SWARM_SHARED_HOME", env),
                subdomain_host=table.get("GPULAB_SUBDOMAIN_HOST", env),
            )
        except table.SettingError as e:
            raise SystemExit(str(e)) from None

    def users_host(self) -> str:
        """The checked ``subdomain_host`` the hub gets ("" when turned off with "none")."""
        try:
            return users_host(self.subdomain_host, self.port)
        except ValueError as e:
            raise SystemExit(str(e)) from None


def find_proxy_command() -> list[str]:
    local = REPO_ROOT / "node_modules" / ".bin" / "configurable-http-proxy"
    if local.exists():
        return [str(local)]
    found = shutil.which("configurable-http-proxy")
    if found:
        return [found]
    raise SystemExit(
        "configurable-http-proxy not found: run `make install` (npm install) in the gpulab checkout"
    )


def configure(c, settings: Settings | None = None) -> None:
    """Fill a JupyterHub config object ``c`` for a gpulab node."""
    s = settings or Settings.from_env()
    data = s.data_dir
    make_private_data_dir(data)

    c.JupyterHub.ip = s.ip
    c.JupyterHub.port = s.port
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = s.hub_port
    c.JupyterHub.db_url = s.db_url or f"sqlite:///{data / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
    # Every user's server on an origin of its own, and the hub's CSP (hub_config/origin.py).
    configure_origin(c, s.users_host())
    c.JupyterHub.pid_file = str(data / "jupyterhub.pid")

    if s.proxy_api_url:
        c.ConfigurableHTTPProxy.should_start = False
        c.ConfigurableHTTPProxy.api_url = s.proxy_api_url
    else:
        c.ConfigurableHTTPProxy.command = find_proxy_command()
        c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s.proxy_api_port}"
        c.ConfigurableHTTPProxy.pid_file = str(data / "jupyterhub-proxy.pid")

    c.JupyterHub.spawner_class = "gpulab-local"
    if s.spawner == "docker":
        configure_docker(c, s)
    elif s.spawner == "swarm":
        configure_swarm(c, s)
    elif s.spawner != "local":
        raise SystemExit(
            f"GPULAB_SPAWNER: {s.spawner!r} is not allowed; allowed: local, docker, swarm"
        )
    c.GpuPool.data_dir = str(data)
    c.GpuPool.catalog_path = s.catalog
    c.GpuInventory.simulate_gpus = s.simulate_gpus

    c.Authenticator.admin_users = {s.admin_name}
    # NativeAuthenticator keeps its own approval flag per account; every approved account may log in.
    c.Authenticator.allow_all = True
    c.NativeAuthenticator.open_signup = s.open_signup
    if s.spawner == "local" and os.geteuid() != 0:
        # Without root there are no per-user accounts or cgroups: every server runs as the hub's
        # own user. Fine for one person on a laptop; not for strangers signing up.
        if s.unsafe_signup_without_isolation:
            print(
                "gpulab: WARNING: not running as root, so every user's server runs as this one "
                "Unix user and users are NOT isolated from each other or from the hub's secrets; "
                "sign-up is open anyway (--unsafe-signup-without-isolation)."
            )
        else:
            c.NativeAuthenticator.enable_signup = False
            print(
                "gpulab: not running as root: every server runs as this Unix user, so users are "
                "not isolated from each other; sign-up is closed (run as root for per-user "
                "accounts, or pass --unsafe-signup-without-isolation to open it anyway)."
            )
    c.NativeAuthenticator.minimum_password_length = 8
    # A hand-written config calling configure(c) on a fresh data dir gets its password here too.
    admin_password(data)
    c.GpulabAuthenticator.admin_password_file = str(data / "admin-password")
    # LTI 1.3 launches from an LMS, when GPULAB_LTI_* are set (docs/lti.md).
    configure_lti(c, os.environ)

    # The market starts and stops servers through the hub's API: at the address it binds to
    # (not loopback, which a hub bound to the Docker gateway does not listen on).
    host = c.JupyterHub.hub_ip
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    configure_plugin(
        c,
        data_dir=str(data),
        catalog=s.catalog,
        admin_name=s.admin_name,
        admin_token=s.admin_token,
        prometheus_token=s.prometheus_token,
        market_token=secret_file(data / "spot-market-token"),
        hub_api_url=f"http://{host}:{s.hub_port}/hub/api",
    )
    # Servers that reach billing through the proxy under another name keep a route to it.
    route_servers_to_services(c)
    c.Spawner.start_timeout = 60
    c.Spawner.http_timeout = 30
    # Log-in and /hub/ land on the home page (balance, apps, free cards) for everyone, whether
    # or not their server runs: JupyterHub's default sends a person with no server straight to
    # the raw spawn form. A start is the home page's Launch or the form's Start, when asked.
    c.JupyterHub.redirect_to_server = False
    # Every hub page's navbar: an admin sees how many sign-ups wait (templates/page.html).
    template_vars = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    template_vars.setdefault("gpulab_signups_waiting", signups_waiting)
    c.JupyterHub.template_vars = template_vars


def configure_docker(c, s: Settings) -> None:
    """Run every server in a container (``gpulab-docker``); the hub must be reachable from them."""
    # dockerspawner and the Docker SDK are needed only by a Docker node.
    from gpulab.spawners.docker.spawner import network_gateway

    c.JupyterHub.spawner_class = "gpulab-docker"
    c.DockerSpawner.network_name = s.docker_network
    # The hub talks to each container on the container's own address on that network, so no
    # port is published on the host.
    c.DockerSpawner.use_internal_ip = True
    if s.hub_ip:
        c.JupyterHub.hub_ip = s.hub_ip
    else:
        # Bind only to the host's address on the containers' network: reachable from the
        # containers and from the proxy on this host, not from the outside.
        c.JupyterHub.hub_ip = network_gateway(s.docker_network)
    if s.hub_connect_ip:
        c.JupyterHub.hub_connect_ip = s.hub_connect_ip


def configure_swarm(c, s: Settings) -> None:
    """Run every server as a Docker Swarm service on a GPU node (``gpulab-swarm``).

    The cards are the nodes' (generic resources and GPU-type labels read from the manager), so
    this machine's own GPUs are not offered. Servers on other nodes reach the hub API at
    ``GPULAB_HUB_IP``, this machine's address on the nodes' network, which the hub binds to.
    """
    c.JupyterHub.spawner_class = "gpulab-swarm"
    if not s.hub_ip:
        raise SystemExit(
            "GPULAB_HUB_IP: the Swarm spawner needs this machine's address on the Swarm nodes' "
            "network (servers on every node reach the hub API there), e.g. GPULAB_HUB_IP=10.0.0.1"
        )
    c.JupyterHub.hub_ip = s.hub_ip
    c.JupyterHub.hub_connect_ip = s.hub_connect_ip or s.hub_ip
    if s.swarm_manager:
        c.SwarmCluster.manager_url = s.swarm_manager
    if s.swarm_node_engines:
        try:
            engines = table.setting("GPULAB_SWARM_NODE_ENGINES").parse(s.swarm_node_engines)
        except table.SettingError as e:
            raise SystemExit(str(e)) from None
        c.SwarmCluster.node_engines = engines
    c.GpuSwarmSpawner.shared_home_path = s.swarm_shared_home
    c.GpuInventory.use_nvml = "no"
