"""Every ``GPULAB_*`` environment variable, declared once: name, type, default, help.

The CLI (``gpulab up`` / ``gpulab config``), the hub (``hub_config.config.Settings``, the
billing hooks, LTI) and the billing service read operator settings through :func:`get`, so a
value is parsed and checked in one place and a bad one is refused with the variable's name and
what is allowed (:class:`SettingError`). The flags of ``gpulab up`` take their defaults and help
from here; where a traitlet's default comes from a variable, :attr:`Setting.traitlets` says so.

Two kinds of names are declared:

- ``operator`` settings: what whoever runs gpulab may set (README "Settings", generated from this
  table by :func:`markdown`; ``gpulab config`` shows their effective values);
- ``internal`` hand-overs between gpulab's own processes (what a spawner writes into a user's
  server for its launcher and extensions, what the hub passes to billing) and ``test`` knobs of
  the test suite. Code inside a user's server (spawners/inside/, extensions/) imports nothing of
  gpulab and reads these itself; they are named here all the same, and a unit test fails on any
  ``GPULAB_*`` name in the tree that this table does not declare.

Part of the catalog floor: every process, the billing service too, may import it. Standard
library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from gpulab.catalog.setting_types import (
    KINDS,
    SCOPES,
    Setting,
    SettingError,
)

# The pool `gpulab up --simulate-gpus auto` simulates on a machine without GPUs.
DEMO_POOL = "RTX-4090:4,A100-80G:2,H100-80G:1"

HUB = "hub (gpulab up)"
SPAWNERS = "Docker and Swarm spawners"
BILLING = "billing"
LTI = "LTI 1.3 (docs/lti.md)"
DEPLOY = "deployment files (docker-compose.yml, docker-stack.yml, images/)"
SERVER = "handed to every user's server"

_S = Setting
TABLE: tuple[Setting, ...] = (
    # --- the hub: `gpulab up` and the hub config ------------------------------------------------
    _S(
        "GPULAB_IP",
        "str",
        "127.0.0.1",
        "address browsers connect to (0.0.0.0 for every interface)",
        HUB,
        flag="--ip",
        traitlets=("JupyterHub.ip",),
    ),
    _S(
        "GPULAB_PORT",
        "port",
        8000,
        "port browsers connect to: the proxy's public port",
        HUB,
        flag="--port",
        traitlets=("JupyterHub.port",),
    ),
    _S(
        "GPULAB_HUB_PORT",
        "port",
        8081,
        "the hub's own port, behind the proxy",
        HUB,
        flag="--hub-port",
        traitlets=("JupyterHub.hub_port",),
    ),
    _S(
        "GPULAB_PROXY_API_PORT",
        "port",
        8001,
        "configurable-http-proxy's REST API port on 127.0.0.1",
        HUB,
        flag="--proxy-api-port",
    ),
    _S(
        "GPULAB_DATA_DIR",
        "path",
        ".gpulab",
        "state: hub database, homes, allocation ledger, logs (the billing service's own data dir when it runs alone)",
        HUB,
        flag="--data-dir",
        traitlets=("GpuPool.data_dir", "BillingService.data_dir"),
        default_text="./.gpulab",
    ),
    _S(
        "GPULAB_SIMULATE_GPUS",
        "str",
        "auto",
        f"simulated GPUs, e.g. 'A100-80G:2,RTX-4090:4'; 'auto': a demo pool ({DEMO_POOL}) when NVML finds no GPU; 'none': never. `gpulab up` resolves 'auto'; a hand-written hub config calling configure(c) treats it as 'none'",
        HUB,
        flag="--simulate-gpus",
        traitlets=("GpuInventory.simulate_gpus",),
    ),
    _S(
        "GPULAB_CATALOG",
        "path",
        "",
        "the platform catalog (TOML); unset: the catalog shipped with gpulab",
        HUB,
        flag="--catalog",
        traitlets=("GpuPool.catalog_path", "BillingService.catalog_path"),
        default_text="(the shipped catalog)",
    ),
    _S(
        "GPULAB_DEMO_MODEL",
        "bool",
        True,
        "`gpulab up` makes the catalog's demo model (tiny-sd: a 7 MB Stable Diffusion pipeline with random weights, so that the Stable Diffusion tile has a model) in the data dir when it is missing; 0: never (a node with real models, or tests)",
        HUB,
    ),
    _S(
        "GPULAB_OPEN_SIGNUP",
        "bool",
        False,
        "let new sign-ups log in without admin approval",
        HUB,
        flag="--open-signup",
        traitlets=("NativeAuthenticator.open_signup",),
    ),
    _S(
        "GPULAB_UNSAFE_SIGNUP_WITHOUT_ISOLATION",
        "bool",
        False,
        "allow sign-up even though this hub does not run as root, so every local server runs as this one Unix user: each user could read and change every other user's files, kernels and tokens, and the hub's own secrets",
        HUB,
        flag="--unsafe-signup-without-isolation",
    ),
    _S(
        "GPULAB_SPAWNER",
        "choice",
        "local",
        "run servers as local processes, in Docker containers from the catalog's preloaded images, or as Docker Swarm services on GPU nodes (GPULAB_HUB_IP, GPULAB_SWARM_*)",
        HUB,
        flag="--spawner",
        choices=("local", "docker", "swarm"),
    ),
    _S(
        "GPULAB_SUBDOMAIN_HOST",
        "str",
        "",
        "the hub's public URL whose subdomains serve users' servers, each on an origin of its own (NAME.HOST: needs wildcard DNS, and a wildcard certificate for https), e.g. https://hub.example.org; 'none' serves users' pages on the hub's own origin, where any user's page can act as whoever opens it (unsafe)",
        HUB,
        flag="--subdomain-host",
        traitlets=("JupyterHub.subdomain_host",),
        default_text="http://localhost:PORT",
    ),
    _S(
        "GPULAB_ADMIN_USER",
        "str",
        "admin",
        "the admin account's name",
        HUB,
        traitlets=("Authenticator.admin_users",),
    ),
    _S(
        "GPULAB_ADMIN_TOKEN",
        "str",
        "",
        "a token registered with the admin role (service gpulab-admin), for automation and monitoring",
        HUB,
        secret=True,
    ),
    _S(
        "GPULAB_PROMETHEUS_TOKEN",
        "str",
        "",
        "a token for Prometheus to scrape the hub's /hub/metrics and billing's metrics with (service gpulab-prometheus, holding only read:metrics; monitoring/prometheus.yml)",
        HUB,
        secret=True,
    ),
    _S(
        "GPULAB_DB_URL",
        "str",
        "",
        "the hub's database (SQLAlchemy URL)",
        HUB,
        traitlets=("JupyterHub.db_url",),
        secret=True,
        default_text="SQLite in the data dir",
    ),
    _S(
        "GPULAB_PROXY_API_URL",
        "url",
        "",
        "the API of a proxy run as its own service (docker-compose); the hub then starts none (its token: CONFIGPROXY_AUTH_TOKEN)",
        HUB,
        traitlets=("ConfigurableHTTPProxy.api_url",),
    ),
    _S(
        "GPULAB_SSH_PORT",
        "port-or-off",
        8022,
        "SSH and SFTP into users' own servers and homes (the gpulab-ssh service, keys added on the home page or a hub token): the port it listens on, at GPULAB_IP; 0 turns SSH off",
        HUB,
        flag="--ssh-port",
        traitlets=("SshGateway.port",),
    ),
    # --- Docker and Swarm -------------------------------------------------------------------------
    _S(
        "GPULAB_DOCKER_NETWORK",
        "str",
        "bridge",
        "Docker: the network user containers join",
        SPAWNERS,
        traitlets=("DockerSpawner.network_name",),
    ),
    _S(
        "GPULAB_HUB_IP",
        "str",
        "",
        "Docker: the address the hub binds to (unset: the network's gateway); Swarm (required): this machine's address on the nodes' network",
        SPAWNERS,
        traitlets=("JupyterHub.hub_ip",),
    ),
    _S(
        "GPULAB_HUB_CONNECT_IP",
        "str",
        "",
        "where servers reach the hub API, when not at GPULAB_HUB_IP",
        SPAWNERS,
        traitlets=("JupyterHub.hub_connect_ip",),
    ),
    _S(
        "GPULAB_SWARM_MANAGER",
        "str",
        "",
        "Swarm: the manager's Docker URL (unset: DOCKER_HOST or the local socket)",
        SPAWNERS,
        traitlets=("SwarmCluster.manager_url",),
    ),
    _S(
        "GPULAB_SWARM_NODE_ENGINES",
        "json-map",
        None,
        "Swarm: each node's own Docker engine, by node id, name or hostname (also read by `gpulab images --nodes`)",
        SPAWNERS,
        traitlets=("SwarmCluster.node_engines",),
        default_text="(unset)",
    ),
    _S(
        "GPULAB_SWARM_SHARED_HOME",
        "str",
        "",
        "Swarm: the home path shared by every node (unset: a volume on one node)",
        SPAWNERS,
        traitlets=("GpuSwarmSpawner.shared_home_path",),
    ),
    # --- billing ----------------------------------------------------------------------------------
    _S("GPULAB_BILLING", "bool", True, "0 turns billing off", BILLING),
    _S(
        "GPULAB_BILLING_MIN_MINUTES",
        "number",
        10.0,
        "minutes of the requested mode the balance must pay for a start",
        BILLING,
        traitlets=("BillingService.start_minutes",),
    ),
    _S(
        "GPULAB_BILLING_STORAGE_INTERVAL",
        "number",
        600.0,
        "seconds between billing's reads of the hub's storage scan, each charging every home above the free size for the time since the last (0: storage is not metered)",
        BILLING,
        traitlets=("BillingService.storage_interval",),
    ),
    _S(
        "GPULAB_BILLING_PORT",
        "port",
        None,
        "managed billing: the service's port",
        BILLING,
        default_text="a free port, kept in the data dir",
    ),
    _S(
        "GPULAB_BILLING_DB_URL",
        "str",
        "",
        "billing's database (SQLAlchemy URL, e.g. postgresql://billing:secret@db/billing); passed to a managed service, read by an external one",
        BILLING,
        traitlets=("BillingService.db_url",),
        secret=True,
        default_text="SQLite in the data dir",
    ),
    _S(
        "GPULAB_BILLING_ARGS",
        "args",
        (),
        "managed billing: extra service arguments (--BillingService.x=y)",
        BILLING,
        default_text="(none)",
    ),
    _S(
        "GPULAB_BILLING_EXTERNAL_URL",
        "base-url",
        "",
        "external billing: where the hub and the proxy (and by default every server) reach a service the hub does not start, e.g. http://billing:10101",
        BILLING,
    ),
    _S(
        "GPULAB_BILLING_API_TOKEN",
        "str",
        "",
        "external billing (required with it, at least 16 characters): the service's hub token, the service's JUPYTERHUB_API_TOKEN",
        BILLING,
        secret=True,
    ),
    _S(
        "GPULAB_BILLING_SERVER_URL",
        "url",
        "",
        "where servers reach billing when not where the hub does, e.g. http://proxy:8000/services/billing/",
        BILLING,
        default_text="the service's own address",
    ),
    _S(
        "GPULAB_HUB_DATA_DIR",
        "path",
        "",
        "billing service: the hub's data dir (its spot price history; a read-only mount is enough)",
        BILLING,
        traitlets=("BillingService.market_data_dir",),
        default_text="GPULAB_DATA_DIR",
    ),
    _S(
        "GPULAB_REPORTER_HEARTBEAT",
        "number",
        10.0,
        "seconds between the usage reporter's heartbeats (passed to every server)",
        BILLING,
    ),
    _S(
        "GPULAB_REPORTER_MAX_BACKOFF",
        "number",
        60.0,
        "the reporter's longest wait between retries, seconds (passed to every server)",
        BILLING,
    ),
    # --- LTI --------------------------------------------------------------------------------------
    _S(
        "GPULAB_LTI_ISSUER",
        "str",
        "",
        "the LMS's issuer (iss); unset: LTI is off",
        LTI,
        traitlets=("GpulabLTI.issuer",),
    ),
    _S(
        "GPULAB_LTI_CLIENT_IDS",
        "list",
        (),
        "the client ids the LMS gave gpulab",
        LTI,
        traitlets=("GpulabLTI.client_ids",),
        default_text="(none)",
    ),
    _S(
        "GPULAB_LTI_AUTHORIZE_URL",
        "str",
        "",
        "the LMS's OIDC authorization endpoint",
        LTI,
        traitlets=("GpulabLTI.authorize_url",),
    ),
    _S(
        "GPULAB_LTI_JWKS_URL",
        "str",
        "",
        "the LMS's public keys (JWKS)",
        LTI,
        traitlets=("GpulabLTI.jwks_endpoint",),
    ),
    _S(
        "GPULAB_LTI_DEPLOYMENT_IDS",
        "list",
        (),
        "the deployment ids accepted",
        LTI,
        traitlets=("GpulabLTI.deployment_ids",),
        default_text="(none)",
    ),
    # --- read by the deployment files, not by Python ----------------------------------------------
    _S(
        "GPULAB_HUB_DB_PASSWORD",
        "str",
        "",
        "docker compose / stack: the hub database's password",
        DEPLOY,
        secret=True,
    ),
    _S(
        "GPULAB_BILLING_DB_PASSWORD",
        "str",
        "",
        "docker compose / stack: the billing database's password",
        DEPLOY,
        secret=True,
    ),
    _S(
        "GPULAB_PROMETHEUS_TOKEN_FILE",
        "path",
        "",
        "monitoring overlays (monitoring/docker-compose.yml): a file holding GPULAB_PROMETHEUS_TOKEN, given to Prometheus as a secret",
        DEPLOY,
    ),
    _S(
        "GPULAB_PROMETHEUS_PORT",
        "int",
        9090,
        "monitoring overlays: Prometheus' port, published on 127.0.0.1 only",
        DEPLOY,
    ),
    _S(
        "GPULAB_GRAFANA_PORT",
        "int",
        3000,
        "monitoring overlays: Grafana's port (127.0.0.1 under compose; the hub node's under Swarm: firewall it to operators)",
        DEPLOY,
    ),
    _S(
        "GPULAB_GRAFANA_ADMIN_PASSWORD",
        "str",
        "",
        "monitoring overlays: Grafana's admin password (no sign-up, no anonymous access)",
        DEPLOY,
        secret=True,
    ),
    _S(
        "GPULAB_DATASETS_DIR",
        "path",
        "/srv/gpulab-datasets",
        "docker compose / stack: the host folder of data: datasets, mounted at the same path",
        DEPLOY,
    ),
    _S(
        "GPULAB_HUB_NODE_IP",
        "str",
        "",
        "docker stack: the hub node's address on the GPU nodes' network",
        DEPLOY,
    ),
    _S(
        "GPULAB_IMAGE_CACHE",
        "path",
        "",
        "images/build-test-image.sh: also save the test image there",
        DEPLOY,
    ),
    _S("GPULAB_VENV", "path", "/opt/venv", "images/finish-venv.sh: the image's venv", DEPLOY),
    # --- internal: written by a spawner into each user's server -----------------------------------
    *(
        _S(n, "str", "", h, SERVER, scope="internal")
        for n, h in (
            ("GPULAB_MODE", "the session's mode, as shown (e.g. A100-80G x1 (simulated))"),
            ("GPULAB_GPU_TYPE", "the GPU type, or none"),
            ("GPULAB_GPU_COUNT", "cards held"),
            ("GPULAB_GPUS_SIMULATED", "1 when the cards are simulated"),
            ("GPULAB_PRICING", "on-demand or spot"),
            ("GPULAB_PRICE_PER_HOUR", "the session's price"),
            ("GPULAB_MAX_PRICE", "Kubernetes profiles: a spot bid"),
            ("GPULAB_CURRENCY", "the catalog's currency"),
            ("GPULAB_IMAGE", "the image slug"),
            ("GPULAB_DATASETS", "dataset slugs, comma-separated"),
            ("GPULAB_APP", "the one-click app, if any"),
            ("GPULAB_COURSES", "course:role pairs, comma-separated"),
            ("GPULAB_ALLOCATION_ID", "the allocation the server's processes belong to"),
            ("GPULAB_HUB_ID", "the hub that started it (orphan sweeps, test leftovers)"),
            (
                "GPULAB_BILLING_URL",
                "where its usage reporter and JupyterLab extension reach billing",
            ),
            ("GPULAB_PREEMPTION_DEADLINE", "spot preemption warning: the deadline"),
            ("GPULAB_PREEMPTION_REASON", "spot preemption warning: why"),
            ("GPULAB_RUN_AS", "launcher: uid:gid:name of the account"),
            ("GPULAB_CGROUP_PROCS", "launcher: cgroup.procs files to join"),
            ("GPULAB_UMASK", "launcher: the user's umask"),
            ("GPULAB_PRIVATE_PROC", "launcher: 1 for a private /proc"),
            ("GPULAB_DATASET_MOUNTS", "launcher: JSON list of [source, target]"),
            ("GPULAB_DATASET_MODE", "launcher: bind or symlink"),
            ("GPULAB_TRIM_IMPORTS", "launcher and fork server: 0 keeps every import"),
            ("GPULAB_APP_SERVERS", "launcher: the apps' jupyter-server-proxy config (JSON)"),
            ("GPULAB_SCRATCH", "launcher: JSON sizes of the server's own /tmp and /dev/shm"),
            ("GPULAB_REPORTER_SPOOL", "the usage reporter's spool folder"),
            ("GPULAB_COMFYUI_PREFIX", "images/comfyui: the URL prefix ComfyUI serves under"),
            ("GPULAB_UNSAFE_AUTOGRADE", "nbgrader in a server: 1 lets staff autograde anyway"),
        )
    ),
    # --- internal: a training job's server (the hub's spawner -> the job runner -> the command)
    *(
        _S(n, "str", "", h, "a training job's server", scope="internal")
        for n, h in (
            ("GPULAB_JOB_ID", "job server: the job's id"),
            ("GPULAB_JOB_ATTEMPT", "job server: the attempt, 1, 2, ..."),
            ("GPULAB_JOB_RANK", "job server: this server's node rank in the job"),
            ("GPULAB_JOB_NODES", "job server: the job's nodes"),
            ("GPULAB_JOB_GPUS", "job server: cards per node"),
            ("GPULAB_JOB_CPUS", "job server: the server's CPUs (OMP_NUM_THREADS per process)"),
            ("GPULAB_JOB_COMMAND", "job runner: the command, run as bash -lc COMMAND"),
            ("GPULAB_JOB_CWD", "job runner: the folder below the home the command runs in"),
            ("GPULAB_JOB_LINGER", "job runner: seconds a quick command waits for the hub's check"),
            ("GPULAB_JOB_SCOPE", "job runner: container: signal every catcher in the container"),
            ("GPULAB_JOB_NETWORK", "launcher: private: the job's own network, loopback only"),
            ("GPULAB_JOB_LISTEN_FD", "job runner: the HTTP socket the launcher bound for it"),
            ("GPULAB_CHECKPOINT_DIR", "job: the folder to write checkpoints into"),
            ("GPULAB_CHECKPOINT_SIGNAL", "job: the checkpoint signal (SIGUSR1)"),
            ("GPULAB_CHECKPOINT_SECONDS", "job: seconds it gets after the checkpoint signal"),
            ("GPULAB_RESUME", "job: the newest checkpoint to resume from, or empty"),
        )
    ),
    _S(
        "GPULAB_TOKEN",
        "str",
        "",
        "gpulab jobs (the CLI, where a user runs it): a hub API token of their own; in their "
        "server the CLI uses the server's JUPYTERHUB_API_TOKEN",
        "read by the jobs CLI",
        scope="internal",
    ),
    _S(
        "GPULAB_HUB_PID",
        "int",
        None,
        "the hub's pid, passed to a billing service it starts (which exits when the hub is gone)",
        "handed by the hub to billing",
        scope="internal",
    ),
    # --- the test suite ---------------------------------------------------------------------------
    *(
        _S(n, "str", "", h, "tests", scope="test")
        for n, h in (
            ("GPULAB_REQUIRE_ALL", "1 (CI): a missing service fails a test instead of skipping it"),
            ("GPULAB_CHROMIUM", "the browser the browser tests drive"),
            ("GPULAB_SCREENSHOTS", "a folder to keep the browser tests' screenshots"),
            ("GPULAB_PG_BIN", "PostgreSQL's bin folder"),
            ("GPULAB_TEST_SESSION", "marks what one test session started (leftover checks)"),
            ("GPULAB_RUN_WHOLE", "marks what one command a test runs whole started (run_whole)"),
            ("GPULAB_CONTRACT_WAIT", "JupyterHub's spawner contract tests: wait_until_listening"),
            ("GPULAB_CONTRACT_ONLY", "JupyterHub's spawner contract tests: the only ones to run"),
            ("GPULAB_CONTRACT_DESELECT", "JupyterHub's spawner contract tests: ones left out"),
            ("GPULAB_FROM_SHELL", "marks that a user's shell rc file ran"),
        )
    ),
)
del _S

SETTINGS: dict[str, Setting] = {s.name: s for s in TABLE}
assert len(SETTINGS) == len(TABLE), "a GPULAB_* name is declared twice"
assert all(s.kind in KINDS and s.scope in SCOPES for s in TABLE)


def setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in gpulab.catalog.settings") from None


def get(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The parsed value of ``name`` in ``env`` (default: this process's environment)."""
    env = os.environ if env is None else env
    return setting(name).parse(env.get(name))


def is_set(name: str, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(name, "").strip()) or (setting(name).kind == "str" and name in env)


@dataclass(frozen=True)
class Effective:
    setting: Setting
    value: Any
    source: str  # "default", "environment" or "flag --x"

    def shown(self) -> str:
        """The value as ``gpulab config`` prints it (secrets hidden)."""
        s, v = self.setting, self.value
        if v is None or v == "" or v == ():
            return s.shown_default() if self.source == "default" else '""'
        if s.secret:
            if "://" in str(v):
                p = urlparse(str(v))
                if p.password:
                    return str(v).replace(f":{p.password}@", ":***@")
                return str(v)
            return "*** (set)"
        return s.text(v)


def effective(
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    scopes: Iterable[str] = ("operator",),
) -> list[Effective]:
    """Every setting of ``scopes`` with its value and where it came from. ``flags``: name ->
    value given on the command line (those win). Raises :class:`SettingError` for the first bad
    value; :func:`problems` lists them all."""
    env = os.environ if env is None else env
    flags = flags or {}
    out = []
    for s in TABLE:
        if s.scope not in scopes:
            continue
        if s.name in flags:
            out.append(Effective(s, flags[s.name], f"flag {s.flag}"))
        elif is_set(s.name, env):
            out.append(Effective(s, s.parse(env[s.name]), "environment"))
        else:
            out.append(Effective(s, s.default, "default"))
    return out


def problems(env: Mapping[str, str] | None = None) -> list[str]:
    """What is wrong with the operator settings in ``env``, one message per variable."""
    env = os.environ if env is None else env
    out = []
    for s in TABLE:
        try:
            s.parse(env.get(s.name))
        except SettingError as e:
            out.append(str(e))
    return out


def undeclared(env: Mapping[str, str] | None = None) -> list[str]:
    """``GPULAB_*`` names set in ``env`` that gpulab does not know (a typo, a removed setting)."""
    env = os.environ if env is None else env
    return sorted(k for k in env if k.startswith("GPULAB_") and k not in SETTINGS)


# --- the README's table ----------------------------------------------------------------------------

BEGIN = "<!-- settings table: generated by `gpulab config --markdown`; do not edit by hand -->"
END = "<!-- end of settings table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_cell(s: Setting) -> str:
    shown = s.shown_default()
    return shown if s.default_text or shown.startswith("(") else f"`{shown}`"


def markdown() -> str:
    """The README's settings section body (between :data:`BEGIN` and :data:`END`)."""
    lines = []
    groups: dict[str, list[Setting]] = {}
    for s in TABLE:
        if s.scope == "operator":
            groups.setdefault(s.group, []).append(s)
    for group, rows in groups.items():
        lines += [f"**{group[0].upper()}{group[1:]}**", ""]
        lines += ["| Variable | Flag | Type | Default | Meaning |", "|---|---|---|---|---|"]
        for s in rows:
            flag = f"`{s.flag}`" if s.flag else ""
            meaning = s.help
            if s.traitlets:
                meaning += " (" + ", ".join(f"`{t}`" for t in s.traitlets) + ")"
            lines.append(
                f"| `{s.name}` | {flag} | {_cell(s.expected)} | {_cell(_default_cell(s))} "
                f"| {_cell(meaning)} |"
            )
        lines.append("")
    for scope, title in (
        (
            "internal",
            "Internal hand-overs between gpulab's own processes (not settings: set by gpulab)",
        ),
        ("test", "Test-suite knobs"),
    ):
        lines += [f"**{title}**", ""]
        for s in TABLE:
            if s.scope == scope:
                lines.append(f"- `{s.name}`: {s.help}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def replace_markdown(text: str) -> str:
    """``text`` (the README) with its generated section replaced by :func:`markdown`."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"the README has no {BEGIN!r} ... {END!r} section")
    return f"{head}{BEGIN}\n\n{markdown()}\n{END}{tail}"


if __name__ == "__main__":  # python -m gpulab.catalog.settings README.md: rewrite its table
    import sys

    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = replace_markdown(old)
        if new != old:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"{path}: settings table rewritten")
