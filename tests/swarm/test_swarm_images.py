"""`gpulab images --nodes/--preload` on a real multi-node Docker Swarm (tests/swarm_helpers.py):
three real engines, each in its own network namespace with its own data root, joined into one
swarm. Node 1, the manager, is the hub's node and the source of every copy; no registry is
reachable, so images are streamed from its engine into the others (`docker save | docker load`
through the command, nothing on disk).

The catalog holds the test image (`base`, the image servers run) and a tiny image made with
`docker import` (`tiny`), so that the stale-image and unreachable-engine cases copy megabytes,
not the test image again. Each test makes the state it needs on the nodes itself.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from harness import VENV_BIN
from swarm_helpers import SwarmCluster

from gpulab.catalog import DEFAULT_CATALOG

# The multi-engine test swarm (network namespaces, a bridge, extra dockerds, heavy on a 2-core
# machine): its modules run one after another on one worker of a parallel run.
pytestmark = pytest.mark.xdist_group("swarm")

# Three nodes: the hub's, one to fill, one whose engine is sometimes unreachable.
SWARM_NODES = [("a100-80g", 1), ("a100-80g", 1), ("a100-80g", 1)]
TINY = "gpulab-test-tiny:1"
MB = 2**20


def docker_on(node_url: str, *args: str, stdin: bytes | None = None) -> str:
    r = subprocess.run(
        ["docker", "-H", node_url, *args], input=stdin, capture_output=True, timeout=300
    )
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().strip()


def rootfs_tar(content: bytes) -> bytes:
    """A one-file root file system for `docker import` (the image is never run)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("payload")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def image_id_on(node_url: str, tag: str) -> str | None:
    r = subprocess.run(
        ["docker", "-H", node_url, "image", "inspect", "-f", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def remove_image(node_url: str, tag: str) -> None:
    if image_id_on(node_url, tag):
        docker_on(node_url, "rmi", "-f", tag)
    assert image_id_on(node_url, tag) is None


@pytest.fixture(scope="module")
def cluster(swarm_cluster: SwarmCluster) -> SwarmCluster:
    # The tiny catalog image exists on the hub's node only, as after `gpulab images --build`.
    # 6 MB of random bytes: big enough for several progress lines, small enough to copy often.
    docker_on(swarm_cluster.manager_url, "import", "-", TINY, stdin=rootfs_tar(os.urandom(6 * MB)))
    return swarm_cluster


@pytest.fixture(scope="module")
def catalog(tmp_path_factory, swarm_cluster: SwarmCluster) -> Path:
    """The shipped catalog with the test image as `base` and the tiny image as `tiny`."""
    text, n = re.subn(
        r'(\[images\.base\](?:(?!\n\[).)*?docker_image = )"[^"]*"',
        rf'\1"{swarm_cluster.image}"',
        DEFAULT_CATALOG.read_text(),
        flags=re.DOTALL,
    )
    assert n == 1
    text += f'\n[images.tiny]\ndisplay_name = "Tiny"\ndescription = "A test image"\ndocker_image = "{TINY}"\n'
    path = Path(tmp_path_factory.mktemp("catalog")) / "catalog.toml"
    path.write_text(text)
    return path


def images(
    cluster: SwarmCluster, catalog: Path, *args: str, engines: dict[int, str] | None = None
) -> subprocess.CompletedProcess:
    """`gpulab images` as an operator runs it on the hub's node, for the catalog's `base` and
    `tiny`; ``engines``: node index -> engine URL (default: every other node's real socket)."""
    if engines is None:
        engines = {n.index: n.url for n in cluster.nodes[1:]}
    flags = [f"--node-engine={cluster.nodes[i - 1].node_id}={url}" for i, url in engines.items()]
    return subprocess.run(
        [
            *(str(VENV_BIN / "gpulab"), "images", "--catalog", str(catalog)),
            *("--docker-host", cluster.manager_url, *flags, *args, "base", "tiny"),
        ],
        # Only what the command line says: no engine list or Docker host from the test's shell.
        env={k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "DOCKER_"))},
        capture_output=True,
        text=True,
        timeout=600,
    )


def survey(cluster: SwarmCluster, catalog: Path, **kw) -> dict[int, dict]:
    """Node index -> its row of `gpulab images --nodes --json`."""
    r = images(cluster, catalog, "--nodes", "--json", **kw)
    assert r.returncode in (0, 3), r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert set(rows) == set(cluster.node_ids)
    return {n.index: rows[n.node_id] for n in cluster.nodes}


def name(cluster: SwarmCluster, index: int) -> str:
    """How the command names a node: its gpulab.node label (the test nodes share a hostname)
    and its id."""
    node_id = cluster.nodes[index - 1].node_id
    label = cluster.manager.client().inspect_node(node_id)["Spec"]["Labels"]["gpulab.node"]
    return f"{label} ({node_id[:12]})"


def test_preload_streams_the_catalog_image_to_a_node_that_lacks_it(
    cluster: SwarmCluster, catalog: Path
) -> None:
    remove_image(cluster.nodes[1].url, cluster.image)
    before = survey(cluster, catalog)
    assert before[1]["hub"] and before[1]["images"] == {"base": "present", "tiny": "present"}
    assert before[2]["images"]["base"] == "missing"
    assert before[2]["labels"]["gpulab.gpu-type"] == "a100-80g"

    r = images(cluster, catalog, "--preload")

    assert r.returncode == 0, r.stdout + r.stderr
    node2 = name(cluster, 2)
    assert "preloading base, tiny on 3 nodes by streaming from the hub's node" in r.stdout
    assert f"{node2}: base missing ({cluster.image}, " in r.stdout
    # The progress of the copy: a line at each quarter of the image, then the total.
    sent = [
        float(mb) for mb in re.findall(rf"  {re.escape(node2)}: base ([\d.]+) of about", r.stdout)
    ]
    assert len(sent) >= 3 and sent == sorted(sent), r.stdout
    assert re.search(rf"{re.escape(node2)}: base copied: [\d.]+ MB in [\d.]+ s", r.stdout)
    assert f"{name(cluster, 3)}: base present" in r.stdout
    # The tiny image was on the hub's node only: it goes to both others.
    for index in (2, 3):
        assert f"{name(cluster, index)}: tiny missing ({TINY}, 6.0 MB), streaming" in r.stdout
    assert "gpulab images: 3 copied, 0 failed" in r.stdout

    after = survey(cluster, catalog)
    for index in (1, 2, 3):
        assert after[index]["images"] == {"base": "present", "tiny": "present"}, after[index]
    hub_id = image_id_on(cluster.manager_url, cluster.image)
    assert image_id_on(cluster.nodes[1].url, cluster.image) == hub_id


def test_a_stale_image_is_copied_again(cluster: SwarmCluster, catalog: Path) -> None:
    """Node 3 holds another build under the catalog's tag: a spawn there would run it."""
    node3 = cluster.nodes[2].url
    remove_image(node3, TINY)
    docker_on(node3, "import", "-", TINY, stdin=rootfs_tar(b"an older build"))
    hub_id = image_id_on(cluster.manager_url, TINY)
    assert image_id_on(node3, TINY) not in (None, hub_id)
    listing = images(cluster, catalog, "--nodes")
    assert listing.returncode == 3, listing.stdout + listing.stderr
    assert re.search(rf"  tiny +STALE +{re.escape(TINY)}", listing.stdout), listing.stdout

    r = images(cluster, catalog, "--preload")

    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{name(cluster, 3)}: tiny stale ({TINY}, " in r.stdout
    assert f"{name(cluster, 2)}: tiny present" in r.stdout
    assert image_id_on(node3, TINY) == hub_id
    assert survey(cluster, catalog)[3]["images"]["tiny"] == "present"


def test_a_node_whose_engine_does_not_answer_is_named_and_the_rest_done(
    cluster: SwarmCluster, catalog: Path
) -> None:
    """Node 3 is up in the swarm, but nothing answers at the address the operator gave for its
    engine (say, its dockerd does not listen on TCP): node 2 is still filled."""
    remove_image(cluster.nodes[1].url, TINY)
    dead = f"tcp://{cluster.nodes[2].address}:2376"
    engines = {2: cluster.nodes[1].url, 3: dead}

    r = images(cluster, catalog, "--preload", engines=engines)

    assert r.returncode == 1, r.stdout + r.stderr
    node3 = name(cluster, 3)
    failed = [line for line in r.stdout.splitlines() if line.startswith(f"{node3}: FAILED")]
    assert len(failed) == 1 and f"engine {dead}:" in failed[0], r.stdout
    assert "Connection refused" in failed[0]
    assert re.search(rf"{re.escape(name(cluster, 2))}: tiny copied: ", r.stdout)
    assert "gpulab images: 1 copied, 2 failed" in r.stdout
    assert f"node {node3}: worker, ready, active, gpu-type a100-80g, engine {dead}" in r.stdout
    assert "  images unknown: engine does not answer: " in r.stdout
    assert image_id_on(cluster.nodes[1].url, TINY) == image_id_on(cluster.manager_url, TINY)
