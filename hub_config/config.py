"""Build the JupyterHub configuration of a gpulab node.

``gpulab up`` puts its settings in the environment (``GPULAB_*``) and starts JupyterHub with
``jupyterhub_config.py``, which calls :func:`configure`. An operator with a hand-written config can
call ``configure(c)`` too and override anything after it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpulab.hub_config.handlers import CUSTOM_SCOPES, READ_POOL_SCOPE

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
    open_signup: bool = False
    db_url: str = ""

    @classmethod
    def from_env(cls, env: os._Environ | dict | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            data_dir=Path(env.get("GPULAB_DATA_DIR") or ".gpulab").resolve(),
            ip=env.get("GPULAB_IP", "127.0.0.1"),
            port=int(env.get("GPULAB_PORT", "8000")),
            hub_port=int(env.get("GPULAB_HUB_PORT", "8081")),
            proxy_api_port=int(env.get("GPULAB_PROXY_API_PORT", "8001")),
            simulate_gpus=env.get("GPULAB_SIMULATE_GPUS", ""),
            catalog=env.get("GPULAB_CATALOG", ""),
            admin_name=env.get("GPULAB_ADMIN_USER", "admin"),
            admin_token=env.get("GPULAB_ADMIN_TOKEN", ""),
            open_signup=env.get("GPULAB_OPEN_SIGNUP", "0") == "1",
            db_url=env.get("GPULAB_DB_URL", ""),
        )


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
    data.mkdir(parents=True, exist_ok=True)

    c.JupyterHub.ip = s.ip
    c.JupyterHub.port = s.port
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.hub_port = s.hub_port
    c.JupyterHub.db_url = s.db_url or f"sqlite:///{data / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(data / "jupyterhub.pid")

    c.ConfigurableHTTPProxy.command = find_proxy_command()
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s.proxy_api_port}"
    c.ConfigurableHTTPProxy.pid_file = str(data / "jupyterhub-proxy.pid")

    c.JupyterHub.spawner_class = "gpulab-local"
    c.GpuPool.data_dir = str(data)
    c.GpuPool.catalog_path = s.catalog
    c.GpuInventory.simulate_gpus = s.simulate_gpus

    c.JupyterHub.authenticator_class = "gpulab.hub_config.auth.GpulabAuthenticator"
    c.Authenticator.admin_users = {s.admin_name}
    # NativeAuthenticator keeps its own approval flag per account; every approved account may log in.
    c.Authenticator.allow_all = True
    c.NativeAuthenticator.open_signup = s.open_signup
    c.NativeAuthenticator.minimum_password_length = 8
    c.GpulabAuthenticator.admin_password_file = str(data / "admin-password")

    c.JupyterHub.custom_scopes = CUSTOM_SCOPES
    roles = [{"name": "user", "scopes": ["self", READ_POOL_SCOPE]}]
    if s.admin_token:
        c.JupyterHub.services = [{"name": "gpulab-admin", "api_token": s.admin_token}]
        roles.append({"name": "admin", "services": ["gpulab-admin"]})
        roles.append(
            {"name": "gpulab-service", "scopes": [READ_POOL_SCOPE], "services": ["gpulab-admin"]}
        )
    c.JupyterHub.load_roles = roles

    # A server's own token may read the pool and restart its own server in another mode
    # (the JupyterLab toggle), besides JupyterHub's defaults.
    c.Spawner.server_token_scopes = [
        "access:servers!server",
        "users:activity!user",
        "read:users:name!user",
        "read:servers!user",
        "servers!user",
        READ_POOL_SCOPE,
    ]
    c.Spawner.start_timeout = 60
    c.Spawner.http_timeout = 30
