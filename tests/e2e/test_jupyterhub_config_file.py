"""An operator's own ``jupyterhub_config.py`` calling ``configure(c)``, started with
``jupyterhub -f`` on a fresh data dir (no ``gpulab up`` to prepare anything), gives a working
node: the admin logs in with the generated password and starts a no-GPU server from the form."""

from __future__ import annotations

from pathlib import Path

from harness import ConfigFileHub, Hub, admin_web, wait_for

CONFIG = """\
# A hand-written JupyterHub config for a gpulab node.
from gpulab.hub_config.config import configure

configure(c)
# Anything may be overridden after configure(c).
c.Spawner.start_timeout = 90
"""


class AdminBrowser:
    """The admin of a ConfigFileHub in a browser-less web session, logged in with the password
    that configure(c) generated in the data dir."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.web = admin_web(hub)
        self.xsrf = {"X-XSRFToken": self.web.http.cookies.get("_xsrf", path="/hub/")}

    def server(self) -> dict | None:
        r = self.web.get("/hub/api/users/admin", headers=self.xsrf)
        r.raise_for_status()
        return r.json()["servers"].get("")

    def start_from_form(self, fields: list[tuple[str, str]]) -> dict:
        form = self.web.get("/hub/spawn/admin")
        assert form.ok and 'name="gpu" value="none"' in form.text, form.text[-2000:]
        r = self.web.post("/hub/spawn/admin", fields)
        assert r.ok, r.text[-2000:]
        return wait_for(
            lambda: (s := self.server()) and s["ready"] and s, 90, what="admin's server"
        )

    def stop_server(self) -> None:
        r = self.web.http.delete(
            f"{self.hub.url}/hub/api/users/admin/server", headers=self.xsrf, timeout=60
        )
        assert r.status_code in (202, 204), r.text
        wait_for(lambda: self.server() is None, 60, what="admin's server to stop")


NO_GPU = [("gpu", "none"), ("gpus", "1"), ("image", "base"), ("pricing", "on-demand")]


def start_hub(tmp_path: Path, config_text: str) -> ConfigFileHub:
    config = tmp_path / "site" / "jupyterhub_config.py"
    config.parent.mkdir()
    config.write_text(config_text)
    data = tmp_path / "fresh-data"
    assert not data.exists()
    return ConfigFileHub(data, config).start()


def test_handwritten_config_on_a_fresh_data_dir_logs_in_and_spawns(
    tmp_path: Path, chp_installed
) -> None:
    hub = start_hub(tmp_path, CONFIG)
    try:
        assert (hub.data_dir / "admin-password").stat().st_mode & 0o077 == 0
        admin = AdminBrowser(hub)
        server = admin.start_from_form(NO_GPU)
        assert server["user_options"]["gpu"] == "none"
        lab = admin.web.get("/user/admin/lab")
        assert lab.ok and "JupyterLab" in lab.text
        admin.stop_server()
    finally:
        hub.stop()


def test_shell_cmd_and_popen_kwargs_apply_to_gpulab_servers(tmp_path: Path, chp_installed) -> None:
    """LocalProcessSpawner's shell_cmd and popen_kwargs, set after configure(c), apply to
    gpulab's own server command: it then starts with Popen instead of the fork server."""
    rcfile = tmp_path / "bashrc"
    rcfile.write_text("export GPULAB_FROM_SHELL=yes\n")
    hub = start_hub(
        tmp_path,
        CONFIG
        + f"c.LocalProcessSpawner.shell_cmd = ['bash', '--rcfile', {str(rcfile)!r}, '-i', '-c']\n"
        + "c.LocalProcessSpawner.popen_kwargs = {'umask': 0o027}\n",
    )
    try:
        admin = AdminBrowser(hub)
        server = admin.start_from_form(NO_GPU)
        pid = server["state"]["pid"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"GPULAB_FROM_SHELL=yes" in environ  # the shell's rc file ran before the server
        assert b"GPULAB_MODE=No GPU" in environ  # and gpulab's environment came through it
        status = Path(f"/proc/{pid}/status").read_text()
        assert "Umask:\t0027" in status, status
        assert not (hub.data_dir / "run" / "forkserver.pid").exists()
        assert admin.web.get("/user/admin/lab").ok
        admin.stop_server()
    finally:
        hub.stop()
