"""A job server in a Docker container (issue 26): the container runs the job runner, sent with
its command, in the image's own init; the hub's checkpoint signal reaches the job's process that
catches it once, through the runner; the exit code is the engine's. Real Engine and test image;
the hub's config stands in for the job scheduler's ``offer`` (tests/job_server_helpers.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from docker_helpers import cleanup, container_of
from harness import wait_for
from job_server_helpers import (
    exit_status,
    file_launch,
    job_hub,
    server_of,
    signal_job,
    start_job_server,
)

from gpulab.spawners.docker.jobs import JOBRUNNER_SOURCE

CATCHER = (
    "printf '%s\\n' 'import signal, sys, time' 'def h(*a):' "
    "'    print(\"got-usr1\", flush=True); sys.exit(5)' 'signal.signal(signal.SIGUSR1, h)' "
    "'print(\"ready\", flush=True)' 'while True: time.sleep(0.1)' > /tmp/catcher.py; "
    'echo "uid=$(id -u) lws=$LOCAL_WORLD_SIZE home=$HOME"; '
    "sleep 1000 & exec python3 /tmp/catcher.py"
)


@pytest.fixture(scope="module")
def djhub(tmp_path_factory, chp_installed, docker, catalog: Path):
    hub = job_hub(
        Path(tmp_path_factory.mktemp("docker-jobs")),
        GPULAB_SPAWNER="docker",
        GPULAB_CATALOG=str(catalog),
        GPULAB_SIMULATE_GPUS="A100-80G:2",
    )
    try:
        yield hub.start()
    finally:
        hub.stop()
        cleanup(docker, hub)


def follow_logs(container) -> list[str]:
    """The container's output as it comes (the container is removed once its end is seen)."""
    lines: list[str] = []

    def read() -> None:
        for chunk in container.logs(stream=True, follow=True):
            lines.extend(chunk.decode(errors="replace").splitlines())

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_a_job_runs_in_a_container_and_takes_the_checkpoint_signal(djhub, docker) -> None:
    """Issue 26 (Jobs on the Docker spawner; Preemption: the checkpoint signal the job
    handles): the job server's container runs the runner (not JupyterLab) as the image's user,
    with the job's environment; the platform's SIGUSR1 (the spawner's gpulab_signal_processes)
    reaches the process that catches it exactly once; its exit code (5) is what the hub sees,
    and the container and card are gone after."""
    user = djhub.create_user()
    server = file_launch(djhub, user, 201, CATCHER)
    r = start_job_server(djhub, user, server, {"gpu": "a100-80g", "gpus": 1, "image": "base"})
    assert r.status_code in (201, 202), r.text
    container = container_of(docker, djhub, user)
    assert container.attrs["Config"]["Cmd"][1:4] == ["-I", "-c", JOBRUNNER_SOURCE]
    lines = follow_logs(container)
    wait_for(lambda: "ready" in lines, 90, what="the job's catcher")
    assert "uid=1000 lws=1 home=/home/jovyan" in lines, lines

    sent = signal_job(djhub, user, server)
    assert sent == {"signalled": [1], "skipped": []}
    wait_for(lambda: exit_status(djhub, user, server) == 5, 60, what="the job's exit code")
    wait_for(lambda: "[gpulab] job 201 exited with code 5" in lines, 30, what="the runner's end")
    assert lines.count("got-usr1") == 1, lines
    assert any(line.startswith("[gpulab] checkpoint signal (SIGUSR1) sent to") for line in lines)
    wait_for(lambda: server_of(djhub, user, server) is None, 60, what="the job server's stop")
    wait_for(lambda: djhub.free("a100-80g") == 2, 30, what="the card to be free")
