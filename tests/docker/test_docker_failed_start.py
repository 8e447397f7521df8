"""A container that never listens, on the Docker spawner: its cards go back to the pool only once
the container has stopped (it used to release them on the exception, while the container still
ran until JupyterHub's stop had waited out its SIGTERM)."""

from __future__ import annotations

import io
from pathlib import Path

import docker as docker_sdk
import pytest
from docker_helpers import container_of, start_docker_hub, write_catalog
from harness import wait_for

START_TIMEOUT = 10


@pytest.fixture(scope="module")
def hanging_catalog(docker, tmp_path_factory, test_image: str, broken_image: str) -> Path:
    """The test catalog plus an image whose server never listens (and, as PID 1 without a
    handler, ignores SIGTERM)."""
    tag = f"gpulab-test-hanging:{test_image.rpartition(':')[2]}"
    dockerfile = f'FROM {test_image}\nCMD ["python", "-c", "import time; time.sleep(3600)"]\n'
    docker.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    path = write_catalog(
        Path(tmp_path_factory.mktemp("catalog")) / "catalog.toml", test_image, broken_image
    )
    path.write_text(
        path.read_text()
        + '\n[images.hanging]\ndisplay_name = "Hanging"\ndescription = "Never listens"\n'
        f'docker_image = "{tag}"\n'
    )
    return path


def running(container) -> bool:
    try:
        container.reload()
    except docker_sdk.errors.NotFound:
        return False
    return container.status == "running"


def test_a_failed_start_frees_its_cards_only_once_its_container_stopped(
    hub_factory, docker, hanging_catalog: Path
) -> None:
    hub = start_docker_hub(
        hub_factory,
        docker,
        "hanging",
        hanging_catalog,
        f"--GpuDockerSpawner.start_timeout={START_TIMEOUT}",
    )
    user = hub.create_user()
    r = hub.spawn(user, {"image": "hanging", "gpu": "a100-80g", "gpus": 2})
    assert r.status_code in (201, 202), r.text
    wait_for(lambda: hub.free("a100-80g") == 0, what="the cards to be held")
    container = wait_for(
        lambda: (c := _container(docker, hub, user)) is not None and running(c) and c,
        90,
        what="the container to run (its home image made and mounted first)",
    )
    # The moment the cards are back, the container must have stopped. (The pool is read without
    # pause: before the fix the cards were free for only ~40 ms, until the hub's poll saw the
    # still-running container and claimed them back from its labels, but free they were.)
    wait_for(lambda: hub.free("a100-80g") == 2, timeout=START_TIMEOUT + 60, interval=0.001)
    assert not running(container), "the cards went back while the failed container still ran"
    wait_for(lambda: hub.server(user) is None, what="the failed server to be gone")


def _container(docker, hub, user):
    try:
        return container_of(docker, hub, user)
    except AssertionError:
        return None
