"""The preemption protocol for a spot server in a container, against a real Docker Engine.

A Docker hub with a 3 s warning; the price is pinned above the bid through the admin API. What the
user would notice: their kernel's SIGUSR1 handler ran in the container (a kernel without one was
left alone), their checkpoint command ran *in the container* (its hostname is the container's) as
their user in their home with its log in ~/.gpulab/checkpoints, the record says so, and at the
deadline the container is gone, the GPU free and the server's billing closed.
"""

from __future__ import annotations

import json
import socket
import time
from datetime import datetime
from pathlib import Path

import pytest
from billing.client import Billing
from docker_helpers import container_of, start_docker_hub
from harness import Hub, wait_for

from gpulab.spawners.docker.agent import AGENT_SOURCE

WARNING = 3
HOME = Path("/home/jovyan")


@pytest.fixture(scope="module")
def spot_dhub(module_hub_factory, docker, catalog: Path) -> Hub:
    return start_docker_hub(
        module_hub_factory,
        docker,
        "spot-docker",
        catalog,
        f"--SpotMarket.warning_seconds={WARNING}",
        "--SpotMarket.tick_interval=0.5",
    )


def in_home(docker, user: str, path: str | Path) -> Path:
    """A file of the user's home as the host sees it (the hub may not: see docker.py): their
    bounded home (a mounted image at DATA_DIR/users/NAME) where the hub enforces quotas, else
    their home volume."""
    relative = Path(path).relative_to(HOME)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = Path(line.split()[4])
        if mount_point.name == user and mount_point.parent.name == "users":
            return mount_point / relative
    volume = docker.volumes.get(f"gpulab-home-{user}")
    return Path(volume.attrs["Mountpoint"]) / relative


def status(hub: Hub, user: str) -> dict:
    r = hub.api("GET", f"/gpulab/spot/status/{user}")
    assert r.status_code == 200, r.text
    return r.json()


def test_container_server_gets_the_warning_checkpoint_and_stop(spot_dhub: Hub, docker) -> None:
    hub, user = spot_dhub, spot_dhub.create_user()
    command = (
        'echo "saving on $GPULAB_GPU_TYPE in $PWD as uid $UID: $GPULAB_PREEMPTION_REASON"; '
        "cat /etc/hostname > ckpt-host.txt; sleep 1; echo saved"
    )
    r = hub.api("PUT", f"/gpulab/spot/settings/{user}", json={"checkpoint_command": command})
    assert r.status_code == 200, r.text
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.30"})
    assert r.status_code == 200, r.text

    free_before = hub.free("rtx-4090")
    hub.spawn_ready(user, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.40"})
    assert hub.free("rtx-4090") == free_before - 1
    container = container_of(docker, hub, user)
    opted_in = hub.kernel(user)
    opted_in_pid = int(
        opted_in.execute(
            "import json, os, gpulab_spot\n"
            "gpulab_spot.on_preempt(lambda info: open(os.path.expanduser('~/preempted.txt'), 'w')"
            ".write(json.dumps(info)))\n"
            "print(os.getpid())"
        )
    )
    bystander = hub.kernel(user)  # no handler: SIGUSR1 would kill it, so it must not get one
    bystander_pid = int(bystander.execute("import os; print(os.getpid())"))

    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.60"})
    assert r.status_code == 200, r.text
    warned = time.time()

    # The checkpoint's progress is on record while it runs in the container, with its log path.
    running = wait_for(
        lambda: (
            ((status(hub, user)["preemption"] or {}).get("checkpoint") or {}).get("log")
            and status(hub, user)["preemption"]["checkpoint"]
        ),
        timeout=WARNING,
        interval=0.05,
        what="the checkpoint command's start",
    )
    assert running["state"] == "running" and running.get("exit_code") is None
    log = Path(running["log"])
    assert log.parent == HOME / ".gpulab" / "checkpoints"

    # SIGUSR1 reached the kernel that opted in, inside the container.
    marker = in_home(docker, user, HOME / "preempted.txt")
    wait_for(marker.exists, timeout=WARNING, interval=0.05, what="the kernel's SIGUSR1 handler")
    info = json.loads(wait_for(lambda: marker.read_text(), timeout=5, what="the handler's file"))
    assert info["signal"] == "SIGUSR1" and info["reason"] == "price-above-max"
    # The kernel that did not opt in is alive and answering; pids are the container's own.
    assert bystander.execute("print(6 * 7)").strip() == "42"
    record = status(hub, user)["preemption"]
    assert opted_in_pid in record["signalled_pids"]
    assert bystander_pid in record["skipped_pids"]
    assert bystander_pid not in record["signalled_pids"]

    # At the deadline: the container is stopped and removed, the GPU free, the record closed.
    wait_for(lambda: hub.server(user) is None, timeout=WARNING + 15, what="the stop")
    stopped = time.time()
    assert stopped >= warned + WARNING - 0.5
    assert not docker.containers.list(all=True, filters={"id": container.id})
    assert hub.free("rtx-4090") == free_before
    r = hub.api("GET", "/gpulab/spot/preemptions")
    [record] = [p for p in r.json()["preemptions"] if p["user"] == user]
    assert record["status"] == "stopped" and record["reason"] == "price-above-max"
    assert record["deadline"] <= record["stopped_at"] <= stopped + 1
    checkpoint = record["checkpoint"]
    assert checkpoint["state"] == "done" and checkpoint["exit_code"] == 0, checkpoint
    assert checkpoint["log"] == str(log) and checkpoint["command"] == command

    # Billing closed the server at the deadline (the stop the market made).
    def closed() -> dict | None:
        servers = Billing(hub).usage(user)["servers"]
        return servers[0] if servers and servers[0]["stopped"] else None

    billed = wait_for(closed, timeout=30, interval=0.5, what="the stop in the statement")
    assert billed["pricing"] == "spot"
    billed_stop = datetime.fromisoformat(billed["stopped"].replace("Z", "+00:00")).timestamp()
    assert record["deadline"] - 0.01 <= billed_stop <= record["stopped_at"] + 0.01

    # It ran in the container (its hostname is the container's, not this machine's), as the
    # server's user, in the home, with the server's and the preemption's environment.
    hostname = in_home(docker, user, HOME / "ckpt-host.txt").read_text().strip()
    assert hostname == container.id[:12] and hostname != socket.gethostname()
    text = in_home(docker, user, log).read_text()
    assert text.startswith(f"$ {command}\n"), text
    assert f"saving on rtx-4090 in {HOME} as uid 1000: price-above-max\n" in text, text
    assert text.rstrip().endswith("saved"), text


def test_checkpoint_cut_off_at_the_deadline_is_recorded_as_failed(spot_dhub: Hub, docker) -> None:
    hub, user = spot_dhub, spot_dhub.create_user()
    command = "echo started; sleep 60"
    r = hub.api("PUT", f"/gpulab/spot/settings/{user}", json={"checkpoint_command": command})
    assert r.status_code == 200, r.text
    hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.30"})
    hub.spawn_ready(user, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.40"})
    hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.60"})

    wait_for(lambda: hub.server(user) is None, timeout=WARNING + 15, what="the stop")

    def finished() -> dict | None:
        r = hub.api("GET", "/gpulab/spot/preemptions")
        [record] = [p for p in r.json()["preemptions"] if p["user"] == user]
        checkpoint = record["checkpoint"] or {}
        return checkpoint if checkpoint.get("state") not in (None, "running") else None

    checkpoint = wait_for(finished, timeout=10, what="the checkpoint's end on record")
    assert checkpoint["state"] == "failed" and checkpoint["exit_code"] is None, checkpoint
    assert "did not finish: the container" in checkpoint["error"], checkpoint
    assert "stopped first" in checkpoint["error"], checkpoint
    # What it wrote before the stop is kept in the home volume.
    assert in_home(docker, user, checkpoint["log"]).read_text() == f"$ {command}\nstarted\n"


def test_checkpoint_agent_kills_a_slow_command_in_the_image(docker, test_image: str) -> None:
    """The agent as `docker exec` runs it, on the image's own Python: a command past its limit is
    killed with its children, and the result says so."""
    spec = {
        "command": "echo started; sleep 60 & sleep 60",
        "home": str(HOME),
        "log": str(HOME / ".gpulab" / "checkpoints" / "slow.log"),
        "limit": 1,
    }
    # The agent, then a count of the `sleep`s still alive in the container.
    script = 'python3 -c "$0" checkpoint "$1"; cat /proc/[0-9]*/comm | grep -cx sleep || true'
    t0 = time.monotonic()
    out = docker.containers.run(
        test_image,
        ["bash", "-c", script, AGENT_SOURCE, json.dumps(spec)],
        user="1000",
        working_dir=str(HOME),
        remove=True,
    )
    elapsed = time.monotonic() - t0
    *_, report, sleeps_left = out.decode().strip().splitlines()
    result = json.loads(report)
    assert result["exit_code"] is None and result["error"] == "timed out after 1s", result
    assert sleeps_left == "0"
    # Killed at the limit rather than waited for (the sleeps would take a minute).
    assert elapsed < 30, elapsed
