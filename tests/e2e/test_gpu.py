"""Real GPUs (run on a machine with an NVIDIA driver: `pytest -m gpu`; skipped elsewhere)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from harness import Hub

from gpulab.hub_config.catalog import DEFAULT_CATALOG, load_catalog
from gpulab.spawners.node.inventory import GpuInventory

pytestmark = pytest.mark.gpu

CUDA_UUID_CODE = r"""
import ctypes, os
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
n = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(n)) == 0
uuids = []
for i in range(n.value):
    dev = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    raw = (ctypes.c_ubyte * 16)()
    assert cuda.cuDeviceGetUuid(raw, dev) == 0
    h = bytes(raw).hex()
    uuids.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
print(",".join(uuids))
"""


def nvidia_smi_list() -> list[tuple[int, str, str]]:
    out = subprocess.check_output(["nvidia-smi", "-L"], text=True)
    rows = []
    for line in out.splitlines():
        m = re.match(r"GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)", line.strip())
        if m:
            rows.append((int(m.group(1)), m.group(2), m.group(3)))
    return rows


def this_gpu_catalog(base: Path, out: Path) -> Path:
    """``base`` with this machine's GPU model rented as its own type ``this-gpu`` (whatever the
    model: H100, H200, A10...) and no other type matching real cards."""
    _, name, _ = nvidia_smi_list()[0]
    text = re.sub(r"nvml_names = \[.*\]", "nvml_names = []", base.read_text())
    text += (
        '\n[gpu_types.this-gpu]\ndisplay_name = "This GPU"\nvram_gb = 1\n'
        'on_demand_price = "1.00"\nspot_floor_price = "0.50"\ncpus_per_card = 1\n'
        f'mem_per_card = "1G"\nnvml_names = ["{name}"]\n'
    )
    out.write_text(text)
    return out


def test_inventory_matches_nvidia_smi() -> None:
    inv = GpuInventory(load_catalog(), use_nvml="yes")
    assert [(d.index, d.name, d.uuid) for d in inv.devices] == nvidia_smi_list()
    assert not any(d.simulated for d in inv.devices)


def test_a_server_sees_exactly_its_allocated_gpu(tmp_path, chp_installed) -> None:
    catalog = this_gpu_catalog(DEFAULT_CATALOG, tmp_path / "catalog.toml")
    hub = Hub(tmp_path / "data", simulate="none", catalog=catalog).start()
    try:
        user = hub.create_user()
        hub.spawn_ready(user, {"gpu": "this-gpu"})
        allocated = hub.server(user)["state"]["allocation"]["uuids"]
        assert len(allocated) == 1
        with hub.kernel(user) as k:
            seen = k.execute(CUDA_UUID_CODE).strip().split(",")
        assert seen == allocated
        hub.stop_server(user)
    finally:
        hub.stop()
