"""Job servers on a real hub with the local spawner (issue 26): a JobLaunch filed in the hub and
the server ``job-ID`` started through the hub's REST API with the platform's own token (the
``gpulab-market`` service's, as the job scheduler starts them) runs the job runner in
JupyterLab's place, as the user's account in the server's cgroup; its output is the server's
log, its exit code is the spawner's ``gpulab_exit_status``, and what it detached dies with the
server's stop. The hub's config files each test's JobLaunch from a file at the server's start
(``pre_spawn_hook``), standing in for the scheduler's ``offer``; a small test-only API handler
reads ``gpulab_exit_status`` in the hub."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import require
from harness import ConfigFileHub, wait_for

from gpulab.spawners.local.accounts import account_name
from gpulab.spawners.storage.homes import home_name

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


c.Spawner.pre_spawn_hook = offer_filed_launch
c.JupyterHub.extra_handlers = [(r"/api/test-job-exit/([^/]+)/([^/]+)", ExitStatus)]
"""


@pytest.fixture(scope="module")
def jhub(tmp_path_factory, chp_installed):
    require(os.geteuid() == 0, "root (job servers run as the users' own accounts)")
    root = Path(tmp_path_factory.mktemp("job-servers"))
    launches = root / "launches"
    launches.mkdir()
    config = root / "site" / "jupyterhub_config.py"
    config.parent.mkdir()
    config.write_text(CONFIG.format(launches=str(launches)))
    hub = ConfigFileHub(root / "data", config)
    hub.extra_env.update(GPULAB_ADMIN_TOKEN=hub.token, GPULAB_SIMULATE_GPUS="A100-80G:8,RTX-4090:4")
    hub.launches = launches
    hub.start()
    yield hub
    hub.stop()


def platform_token(hub: ConfigFileHub) -> str:
    return (hub.data_dir / "spot-market-token").read_text().strip()


def file_launch(hub, user: str, job_id: int, command: str, gpus: int = 1) -> str:
    server = f"job-{job_id}"
    launch = {"job_id": job_id, "attempt": 1, "rank": 0, "nodes": 1, "gpus": gpus}
    launch.update(command=command, cwd="", checkpoint_seconds=30)
    (hub.launches / f"{user}.{server}.json").write_text(json.dumps(launch))
    return server


def start_job_server(hub, user: str, server: str, options: dict):
    return hub.api("POST", f"/users/{user}/servers/{server}", platform_token(hub), json=options)


def server_of(hub, user: str, server: str) -> dict | None:
    return hub.user(user)["servers"].get(server)


def log_of(hub, user: str, server: str) -> Path:
    return hub.data_dir / "logs" / f"{home_name(user)}.{home_name(server)}.log"


def exit_status(hub, user: str, server: str):
    r = hub.api("GET", f"/test-job-exit/{user}/{server}")
    r.raise_for_status()
    return r.json()["exit"]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


A100 = {"gpu": "a100-80g", "gpus": 1, "image": "base", "pricing": "on-demand"}


def test_job_server_runs_the_command_as_the_user_and_reports_its_exit(jhub) -> None:
    """Issue 26 (Jobs: runs a command in the user's account; output kept; exit code): the job
    server runs the command (not JupyterLab) as the user's Unix account in the server's own
    cgroup, its output and the runner's lines land in the server's log, and once it ends the
    spawner's gpulab_exit_status is the command's exit code and the cards are free again."""
    user = jhub.create_user()
    command = "echo hello-from-job; id -un; cat /proc/self/cgroup; exit 3"
    server = file_launch(jhub, user, 101, command)
    free = jhub.free("a100-80g")
    r = start_job_server(jhub, user, server, A100)
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: exit_status(jhub, user, server) == 3, 90, what="the job's exit code")
    wait_for(lambda: server_of(jhub, user, server) is None, 60, what="the job server's stop")
    wait_for(lambda: jhub.free("a100-80g") == free, 30, what="the card to be free")

    log = log_of(jhub, user, server).read_text()
    assert "hello-from-job" in log
    assert f"\n{account_name(user)}\n" in log, log
    hub_id = (jhub.data_dir / "hub-id").read_text().strip()
    assert hub_id in log.split("hello-from-job", 1)[1], "the command ran outside its cgroup"
    assert "[gpulab] job 101 attempt 1" in log
    assert "[gpulab] job 101 exited with code 3" in log
    assert "jupyterhub-singleuser" not in log and "Jupyter Server" not in log


def test_a_detached_process_dies_with_the_job_server(jhub) -> None:
    """Issue 26 (a job that forks a detached process which dies with the job): a process the
    command put in a session of its own outlives the command's group, never the server: the
    platform's stop ends it with the rest of the cgroup."""
    user = jhub.create_user()
    command = (
        "setsid bash -c 'echo $$ > detached.pid; exec sleep 1000' < /dev/null > /dev/null 2>&1 & "
        "exec sleep 1000"
    )
    server = file_launch(jhub, user, 102, command)
    r = start_job_server(jhub, user, server, A100)
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: (server_of(jhub, user, server) or {}).get("ready"), 90, what="ready")
    pid_file = jhub.data_dir / "users" / home_name(user) / "detached.pid"
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30))
    try:
        assert alive(pid)
        r = jhub.api("DELETE", f"/users/{user}/servers/{server}", platform_token(jhub))
        assert r.status_code in (202, 204), r.text
        wait_for(lambda: server_of(jhub, user, server) is None, 60, what="the stop")
        wait_for(lambda: not alive(pid), 30, what="the detached process to end")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_eight_cards_on_one_node(jhub) -> None:
    """Issue 26 (Up to 8 cards in one click): on a node with 8 cards of a type, a job gets all 8,
    CUDA_VISIBLE_DEVICES names 8 cards and LOCAL_WORLD_SIZE is 8 (the catalog's per-server
    limit is 8 now)."""
    user = jhub.create_user()
    command = 'echo "CVD=$CUDA_VISIBLE_DEVICES"; echo "LWS=$LOCAL_WORLD_SIZE WS=$WORLD_SIZE"'
    server = file_launch(jhub, user, 103, command, gpus=8)
    r = start_job_server(jhub, user, server, {**A100, "gpus": 8})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: exit_status(jhub, user, server) == 0, 90, what="the job's end")
    log = log_of(jhub, user, server).read_text()
    cvd = next(line for line in log.splitlines() if line.startswith("CVD="))[4:]
    assert len(set(cvd.split(","))) == 8, cvd
    assert "LWS=8 WS=8" in log
    wait_for(lambda: jhub.free("a100-80g") == 8, 60, what="the 8 cards to be free")


def test_more_cards_than_the_largest_node_has_is_400(jhub) -> None:
    """Issue 26 (the per-server limit raised only where a node has the cards): 8 x RTX 4090
    where the largest node has 4 is refused, 400 naming gpus and saying the most there is;
    nothing is held."""
    user = jhub.create_user()
    options = {"gpu": "rtx-4090", "gpus": 8, "image": "base", "pricing": "on-demand"}
    r = jhub.api("POST", f"/users/{user}/server", json=options)
    assert r.status_code == 400, r.text
    assert "gpus" in r.json()["message"] and "at most 4" in r.json()["message"]
    server = file_launch(jhub, user, 104, "true", gpus=8)
    r = start_job_server(jhub, user, server, options)
    assert r.status_code == 400, r.text
    assert "gpus" in r.json()["message"]
    assert jhub.free("rtx-4090") == 4
    assert jhub.user(user)["servers"] == {}


def test_a_job_server_with_no_launch_is_refused(jhub) -> None:
    """Issue 26 (only the platform starts job servers): a job-* server whose start no job filed
    a launch for is refused by the spawner itself, 403 naming server_name, even with the
    platform's token; nothing is held."""
    user = jhub.create_user()
    free = jhub.free("a100-80g")
    r = start_job_server(jhub, user, "job-105", A100)
    assert r.status_code == 403, r.text
    assert "server_name" in r.json()["message"]
    wait_for(lambda: server_of(jhub, user, "job-105") is None, 30, what="no server")
    assert jhub.free("a100-80g") == free
