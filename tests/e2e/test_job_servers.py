"""Job servers on a real hub with the local spawner (issue 26): a JobLaunch filed in the hub and
the server ``job-ID`` started through the hub's REST API with the platform's own token (the
``gpulab-market`` service's, as the job scheduler starts them) runs the job runner in
JupyterLab's place, as the user's account in the server's cgroup; its output is the server's
log, its exit code is the spawner's ``gpulab_exit_status``, and what it detached dies with the
server's stop. The hub's config stands in for the scheduler's ``offer``
(tests/job_server_helpers.py)."""

from __future__ import annotations

import os
import pwd
import signal
from pathlib import Path

import pytest
from conftest import require
from harness import wait_for
from job_server_helpers import (
    alive,
    exit_status,
    file_launch,
    job_hub,
    platform_token,
    server_of,
    signal_job,
    start_job_server,
)

from gpulab.spawners.local.accounts import account_name
from gpulab.spawners.storage.homes import home_name


@pytest.fixture(scope="module")
def jhub(tmp_path_factory, chp_installed):
    require(os.geteuid() == 0, "root (job servers run as the users' own accounts)")
    hub = job_hub(
        Path(tmp_path_factory.mktemp("job-servers")),
        GPULAB_SIMULATE_GPUS="A100-80G:8,RTX-4090:4",
    )
    hub.start()
    yield hub
    hub.stop()


def log_of(hub, user: str, server: str) -> Path:
    return hub.data_dir / "logs" / f"{home_name(user)}.{home_name(server)}.log"


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
    # The runner made the checkpoint folder as the user (root never acts in the home).
    folder = jhub.data_dir / "users" / home_name(user) / ".gpulab" / "jobs" / "101" / "checkpoints"
    assert folder.stat().st_uid == pwd.getpwnam(account_name(user)).pw_uid


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


CATCHER = (
    "printf '%s\\n' 'import pathlib, signal, sys, time' 'def h(*a):' "
    "'    print(\"got-usr1\", flush=True); sys.exit(5)' 'signal.signal(signal.SIGUSR1, h)' "
    "'print(\"ready\", flush=True)' 'while True: time.sleep(0.1)' > /tmp/catcher.py; "
    "sleep 1000 & echo $! > /tmp/sleep.pid; exec python3 /tmp/catcher.py"
)


def test_the_checkpoint_signal_reaches_the_job_once(jhub) -> None:
    """Issue 26 (Preemption: the checkpoint signal the job handles): the platform's SIGUSR1
    (the spawner's gpulab_signal_processes, as the market and the checkpoint timer send it)
    goes to the runner, which passes it to the job's process that catches it; the job then
    ends as it chose (exit 5, seen by the hub)."""
    user = jhub.create_user()
    wait_for(lambda: jhub.free("a100-80g") == 8, 60, what="the cards of earlier tests")
    server = file_launch(jhub, user, 106, CATCHER)
    r = start_job_server(jhub, user, server, A100)
    assert r.status_code in (201, 202), r.text
    log = log_of(jhub, user, server)
    wait_for(lambda: log.exists() and "ready" in log.read_text(), 90, what="the catcher")
    sent = signal_job(jhub, user, server)
    assert len(sent["signalled"]) == 1, sent
    wait_for(lambda: exit_status(jhub, user, server) == 5, 60, what="the job's exit")
    text = log.read_text()
    assert text.count("got-usr1") == 1, text
    assert "checkpoint signal (SIGUSR1) sent to" in text
    assert "[gpulab] job 106 exited with code 5" in text
    wait_for(lambda: server_of(jhub, user, server) is None, 60, what="the job server's stop")
    wait_for(lambda: jhub.free("a100-80g") == 8, 30, what="its card to be free")


def test_eight_cards_on_one_node(jhub) -> None:
    """Issue 26 (Up to 8 cards in one click): on a node with 8 cards of a type, a job gets all 8,
    CUDA_VISIBLE_DEVICES names 8 cards and LOCAL_WORLD_SIZE is 8 (the catalog's per-server
    limit is 8 now), with /dev/shm sized for 8 cards' data loaders."""
    user = jhub.create_user()
    command = (
        'echo "CVD=$CUDA_VISIBLE_DEVICES"; echo "LWS=$LOCAL_WORLD_SIZE WS=$WORLD_SIZE"; '
        'echo "SHM=$(df -B1 --output=size /dev/shm | tail -1 | tr -d " ")"'
    )
    server = file_launch(jhub, user, 103, command, gpus=8)
    r = start_job_server(jhub, user, server, {**A100, "gpus": 8})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: exit_status(jhub, user, server) == 0, 90, what="the job's end")
    log = log_of(jhub, user, server).read_text()
    cvd = next(line for line in log.splitlines() if line.startswith("CVD="))[4:]
    assert len(set(cvd.split(","))) == 8, cvd
    assert "LWS=8 WS=8" in log
    # /dev/shm for data loaders: the catalog's shm_gb (2) per card.
    assert "SHM=" + str(8 * 2 * 2**30) in log, log
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
