"""Real GPUs (run on a machine with an NVIDIA driver: `pytest -m gpu`; skipped elsewhere)."""

from __future__ import annotations

import pytest
from gpu_helpers import CUDA_UUID_CODE, nvidia_smi_list, this_gpu_catalog

from gpulab.catalog import DEFAULT_CATALOG, load_catalog
from gpulab.spawners.node.inventory import GpuInventory

pytestmark = pytest.mark.gpu


def test_inventory_matches_nvidia_smi() -> None:
    inv = GpuInventory(load_catalog(), use_nvml="yes")
    assert [(d.index, d.name, d.uuid) for d in inv.devices] == nvidia_smi_list()
    assert not any(d.simulated for d in inv.devices)


def test_a_server_sees_exactly_its_allocated_gpu(tmp_path, hub_factory) -> None:
    catalog = this_gpu_catalog(DEFAULT_CATALOG, tmp_path / "catalog.toml")
    hub = hub_factory(simulate="none", catalog=catalog)
    user = hub.create_user()
    hub.spawn_ready(user, {"gpu": "this-gpu"})
    allocated = hub.server(user)["state"]["allocation"]["uuids"]
    assert len(allocated) == 1
    with hub.kernel(user) as k:
        seen = k.execute(CUDA_UUID_CODE).strip().split(",")
    assert seen == allocated
    hub.stop_server(user)
