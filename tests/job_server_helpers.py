"""What the job-server tests of the spawners share (tests/e2e/test_job_servers.py,
tests/docker/test_docker_jobs.py): a hub whose config files each test's JobLaunch at the
server's start, standing in for the job scheduler's ``offer`` (``pre_spawn_hook``), with two
test-only API handlers that ask the server's spawner in the hub for ``gpulab_exit_status`` and
``gpulab_signal_processes``; job servers started with the platform's own token."""

from __future__ import annotations

import json
from pathlib import Path

from harness import ConfigFileHub

CONFIG = """\
import os
from jupyterhub.apihandlers.base import APIHandler
from gpulab.hub_config.config import configure
from gpulab.spawners.jobs.launch import JobLaunch, offer

configure(c)
LAUNCHES = {launches!r}


def offer_filed_launch(spawner):
    # Stands in for the job scheduler's offer() before its start request.
    path = os.path.join(LAUNCHES, spawner.user.name + "." + spawner.name + ".json")
    if os.path.exists(path):
        with open(path) as f:
            offer(spawner.owner, JobLaunch.from_json(f.read()))


class ExitStatus(APIHandler):
    async def get(self, name, server):
        spawner = self.find_user(name).spawners[server]
        self.finish({{"exit": await spawner.gpulab_exit_status()}})


class Signal(APIHandler):
    async def get(self, name, server):
        spawner = self.find_user(name).spawners[server]
        signalled, skipped = await spawner.gpulab_signal_processes()
        self.finish({{"signalled": signalled, "skipped": skipped}})


c.Spawner.pre_spawn_hook = offer_filed_launch
c.JupyterHub.extra_handlers = [
    (r"/api/test-job-exit/([^/]+)/([^/]+)", ExitStatus),
    (r"/api/test-job-signal/([^/]+)/([^/]+)", Signal),
]
"""


def job_hub(root: Path, **env: str) -> ConfigFileHub:
    """An unstarted hub (``env``: its GPULAB_* settings) that files launches from ``root/launches``."""
    launches = root / "launches"
    launches.mkdir(parents=True, exist_ok=True)
    config = root / "site" / "jupyterhub_config.py"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(CONFIG.format(launches=str(launches)))
    hub = ConfigFileHub(root / "data", config)
    hub.extra_env.update(GPULAB_ADMIN_TOKEN=hub.token, **env)
    hub.launches = launches
    return hub


def platform_token(hub: ConfigFileHub) -> str:
    """The ``gpulab-market`` service's token: the platform's, which the job scheduler uses."""
    return (hub.data_dir / "spot-market-token").read_text().strip()


def file_launch(hub, user: str, job_id: int, command: str, gpus: int = 1) -> str:
    """File the JobLaunch of attempt 1 of a one-node job; returns its server's name."""
    server = f"job-{job_id}"
    launch = {"job_id": job_id, "attempt": 1, "rank": 0, "nodes": 1, "gpus": gpus}
    launch.update(command=command, cwd="", checkpoint_seconds=30)
    (hub.launches / f"{user}.{server}.json").write_text(json.dumps(launch))
    return server


def start_job_server(hub, user: str, server: str, options: dict):
    return hub.api("POST", f"/users/{user}/servers/{server}", platform_token(hub), json=options)


def server_of(hub, user: str, server: str) -> dict | None:
    return hub.user(user)["servers"].get(server)


def exit_status(hub, user: str, server: str) -> int | None:
    r = hub.api("GET", f"/test-job-exit/{user}/{server}")
    r.raise_for_status()
    return r.json()["exit"]


def signal_job(hub, user: str, server: str) -> dict:
    r = hub.api("GET", f"/test-job-signal/{user}/{server}")
    r.raise_for_status()
    return r.json()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")
