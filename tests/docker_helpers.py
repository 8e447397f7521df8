"""Docker fixtures and helpers shared by the Docker test modules (a real Engine, the test image).

conftest.py loads this module as a plugin, so a test asks for the fixtures by name; module-scoped
fixtures are set up once per module that uses them.
"""

from __future__ import annotations

import fcntl
import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import require
from harness import REPO, VENV_BIN, Hub, HubFactory

from gpulab.catalog import DEFAULT_CATALOG

GPULAB = str(VENV_BIN / "gpulab")
LABEL_HUB = "org.gpulab.hub-id"
BROKEN_MESSAGE = "gpulab-test: this server refuses to start"
IMAGE_LOCK = "/tmp/gpulab-test-image.lock"


def docker_client():
    import docker

    try:
        client = docker.from_env(version="auto")
        client.ping()
        return client
    except docker.errors.DockerException:
        return None


@pytest.fixture(scope="module")
def docker():
    client = docker_client()
    require(client is not None, "a running Docker Engine (dockerd)")
    return client


@pytest.fixture(scope="module")
def test_image(docker) -> str:
    require(shutil.which("mmdebstrap") is not None, "mmdebstrap (to build the test image)")
    # One build at a time on this machine: the workers of a parallel run (and other sessions)
    # that ask together wait for the first, then find its image (the script's cache).
    with open(IMAGE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run(
            [str(REPO / "images" / "build-test-image.sh")],
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def broken_image(docker, test_image: str) -> str:
    """The test image with a server that prints a reason and exits, as a misconfigured one does."""
    tag = f"gpulab-test-broken:{test_image.rpartition(':')[2]}"
    dockerfile = (
        f"FROM {test_image}\n"
        f'CMD ["python", "-c", "import sys; print({BROKEN_MESSAGE!r}); sys.exit(3)"]\n'
    )
    docker.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    return tag


def write_catalog(path: Path, image: str, broken: str) -> Path:
    """The shipped catalog with the test image as `base` and `teaching`, plus a broken image."""
    text = DEFAULT_CATALOG.read_text()
    for slug in ("base", "teaching"):
        text, n = re.subn(
            rf'(\[images\.{slug}\](?:(?!\n\[).)*?docker_image = )"[^"]*"',
            rf'\1"{image}"',
            text,
            flags=re.DOTALL,
        )
        assert n == 1, slug
    text += (
        '\n[images.broken]\ndisplay_name = "Broken"\ndescription = "Exits at start"\n'
        f'docker_image = "{broken}"\n'
        '\n[datasets.gone]\ndisplay_name = "Gone"\ndescription = "Its directory is missing"\n'
        f'size = "0"\nlicense = "none"\nsource = "{path.parent / "no-such-dataset"}"\n'
    )
    path.write_text(text)
    return path


def hub_id(hub: Hub) -> str:
    return (hub.data_dir / "hub-id").read_text().strip()


def cleanup(docker, hub: Hub) -> None:
    try:
        ident = hub_id(hub)
    except OSError:
        return
    for c in docker.containers.list(all=True, filters={"label": f"{LABEL_HUB}={ident}"}):
        c.remove(force=True)
    for v in docker.volumes.list(filters={"label": f"{LABEL_HUB}={ident}"}):
        v.remove(force=True)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory, test_image: str, broken_image: str) -> Path:
    return write_catalog(
        Path(tmp_path_factory.mktemp("catalog")) / "catalog.toml", test_image, broken_image
    )


def docker_hub_settings(catalog: Path, *extra: str) -> dict:
    """``Hub`` settings for a hub with the Docker spawner and ``catalog``; ``extra`` hub args."""
    cli = [GPULAB, "up", "--spawner", "docker", "--catalog", str(catalog)]
    # A 1 s reporter heartbeat, so that billing of a container's kernel is checked quickly.
    env = {"GPULAB_REPORTER_HEARTBEAT": "1"}
    return {"simulate": "A100-80G:2,RTX-4090:2", "cli": cli, "extra_args": extra, "env": env}


def docker_hub(data: Path, catalog: Path, *extra: str) -> Hub:
    return Hub(data, **docker_hub_settings(catalog, *extra))


def start_docker_hub(factory: HubFactory, docker, name: str, catalog: Path, *extra: str) -> Hub:
    """A started Docker-spawner hub from a hub factory; its containers and volumes are removed
    once the factory has stopped it."""
    return factory(
        name, on_stop=lambda h: cleanup(docker, h), **docker_hub_settings(catalog, *extra)
    )


def container_of(docker, hub: Hub, user: str):
    found = docker.containers.list(
        all=True, filters={"label": [f"{LABEL_HUB}={hub_id(hub)}", f"org.gpulab.user={user}"]}
    )
    assert len(found) == 1, [c.name for c in found]
    return found[0]
