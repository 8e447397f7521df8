"""An operator's own ``jupyterhub_config.py`` calling ``configure(c)``, started with
``jupyterhub -f`` on a fresh data dir (no ``gpulab up`` to prepare anything), gives a working
node: the admin logs in with the generated password and starts a no-GPU server from the form."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import requests
from harness import VENV_BIN, Hub, admin_web, wait_for

CONFIG = """\
# A hand-written JupyterHub config for a gpulab node.
from gpulab.hub_config.config import configure

configure(c)
# Anything may be overridden after configure(c).
c.Spawner.start_timeout = 90
"""


class ConfigFileHub(Hub):
    """A hub started as ``jupyterhub -f CONFIG``, with gpulab's settings in GPULAB_* variables."""

    def __init__(self, data_dir: Path, config_file: Path) -> None:
        super().__init__(data_dir, cli=[str(VENV_BIN / "jupyterhub"), "-f", str(config_file)])
        self.config_file = config_file

    def start(self, timeout: float = 90) -> ConfigFileHub:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")},
            # Only the data dir is required; the ports keep clear of other hubs on this machine.
            "GPULAB_DATA_DIR": str(self.data_dir),
            "GPULAB_PORT": str(self.port),
            "GPULAB_HUB_PORT": str(self.hub_port),
            "GPULAB_PROXY_API_PORT": str(self.proxy_api_port),
            "PATH": os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", os.defpath)]),
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cli,
                env=env,
                cwd=self.config_file.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                return requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, timeout, what="the hub to answer")
        return self


def test_handwritten_config_on_a_fresh_data_dir_logs_in_and_spawns(
    tmp_path: Path, chp_installed
) -> None:
    config = tmp_path / "site" / "jupyterhub_config.py"
    config.parent.mkdir()
    config.write_text(CONFIG)
    data = tmp_path / "fresh-data"
    assert not data.exists()
    hub = ConfigFileHub(data, config).start()
    try:
        assert (data / "admin-password").stat().st_mode & 0o077 == 0
        web = admin_web(hub)  # logs in with DATA_DIR/admin-password
        xsrf = {"X-XSRFToken": web.http.cookies.get("_xsrf", path="/hub/")}
        form = web.get("/hub/spawn/admin")
        assert form.ok and 'name="gpu" value="none"' in form.text, form.text[-2000:]
        r = web.post(
            "/hub/spawn/admin",
            [("gpu", "none"), ("gpus", "1"), ("image", "base"), ("pricing", "on-demand")],
        )
        assert r.ok, r.text[-2000:]

        def ready() -> dict | None:
            server = web.get("/hub/api/users/admin", headers=xsrf).json()["servers"].get("")
            return server if server and server["ready"] else None

        server = wait_for(ready, 90, what="admin's server")
        assert server["user_options"]["gpu"] == "none"
        lab = web.get("/user/admin/lab")
        assert lab.ok and "JupyterLab" in lab.text
        r = web.http.delete(f"{hub.url}/hub/api/users/admin/server", headers=xsrf, timeout=60)
        assert r.status_code in (202, 204), r.text
        wait_for(
            lambda: not web.get("/hub/api/users/admin", headers=xsrf).json()["servers"],
            60,
            what="admin's server to stop",
        )
    finally:
        hub.stop()
