"""Swarm servers' scratch and logs (issue 23, part B), on a real one-node swarm: /tmp and
/dev/shm are tmpfs of the catalog's sizes, gone with the task; the task's log is rotated; a
shared home on a filesystem without CephFS quotas gets none and the hub says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Hub, catalog_with
from swarm_helpers import (
    SwarmCluster,
    remove_hub_services,
    service_of,
    shared_homes_dir,
    swarm_hub_settings,
)

pytestmark = pytest.mark.xdist_group("swarm")

SWARM_NODES = [("a100-80g", 2)]
MiB = 2**20
TMP = 32 * MiB  # tmp_gb = 0.03125
SHM = 64 * MiB  # shm_gb = 0.0625

FILL = """
import errno, os
n = 0
try:
    with open({path!r}, 'wb', buffering=0) as f:
        while n < {size}:
            n += f.write(b'x' * 2**20)
    print('wrote', n)
except OSError as e:
    print(errno.errorcode[e.errno], n)
"""


@pytest.fixture(scope="module")
def small_catalog(catalog: Path) -> Path:
    return catalog_with(
        catalog.with_name("swarm-small-storage.toml"), catalog, tmp_gb=0.03125, shm_gb=0.0625
    )


@pytest.fixture(scope="module")
def sthub(
    swarm_cluster: SwarmCluster, module_hub_factory, small_catalog: Path, tmp_path_factory
) -> Hub:
    homes = shared_homes_dir(tmp_path_factory)
    return module_hub_factory(
        "sthub",
        on_stop=lambda h: remove_hub_services(swarm_cluster, h.data_dir),
        **swarm_hub_settings(swarm_cluster, small_catalog, homes),
    )


def test_swarm_scratch_is_bounded_by_the_catalog_and_gone_with_the_task(
    sthub: Hub, swarm_cluster: SwarmCluster
) -> None:
    """Issue 23: "Swarm: /tmp and /dev/shm sized from the catalog" and the attacks "fill the
    node's disk through /tmp, /dev/shm" on a Swarm node. Fails on the old code: /tmp was the
    task container's writable layer on the node's disk (64 MiB went through) and /dev/shm half
    the memory limit."""
    user = sthub.create_user()
    sthub.spawn_ready(user, {"gpu": "none"}, timeout=180)
    with sthub.kernel(user) as k:
        tmp = k.execute(FILL.format(path="/tmp/big", size=2 * TMP)).split()
        shm = k.execute(FILL.format(path="/dev/shm/big", size=2 * SHM)).split()
        k.execute("open('/tmp/scratch.txt', 'w').write('gone'); open('kept.txt', 'w').write('k')")
    assert tmp[0] == "ENOSPC" and int(tmp[1]) <= TMP, tmp
    assert shm[0] == "ENOSPC" and int(shm[1]) <= SHM, shm
    spec = service_of(swarm_cluster, sthub.data_dir, user)["Spec"]["TaskTemplate"]
    assert spec["LogDriver"]["Options"]["max-file"] == "2"
    # The test's shared homes are a plain folder: no quota the hub can set, and it says so.
    assert "Shared homes are NOT bounded by the hub" in sthub.log_path.read_text()

    sthub.stop_server(user)
    sthub.spawn_ready(user, {"gpu": "none"}, timeout=180)
    with sthub.kernel(user) as k:
        seen = k.execute(
            "import os; print(os.path.exists('/tmp/scratch.txt'), open('kept.txt').read())"
        )
    assert seen.split() == ["False", "k"]
    sthub.stop_server(user)
