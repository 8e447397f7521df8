"""Helpers for the tests that need a real NVIDIA GPU (the `gpu` marker): the e2e and Docker ones."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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
