"""Card telemetry on real GPUs (issue 24: "per card: utilisation, memory used, power,
temperature from NVML", per process where NVML gives it). Run on a machine with an NVIDIA driver
(`pytest -m gpu`); skipped elsewhere."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import requests
from gpu_helpers import nvidia_smi_list, this_gpu_catalog
from harness import wait_for
from prometheus_client.parser import text_string_to_metric_families

from gpulab.catalog import DEFAULT_CATALOG, load_catalog
from gpulab.spawners.node.inventory import GpuInventory
from gpulab.spawners.node.telemetry import read_cards

pytestmark = pytest.mark.gpu

# Holds 512 MiB on card 0 through the CUDA driver API until stdin closes.
HOLD_MEMORY = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(512 << 20)) == 0
print("ready", flush=True)
sys.stdin.read()
"""


def smi(fields: str) -> dict[str, list[str]]:
    out = subprocess.check_output(
        ["nvidia-smi", f"--query-gpu=uuid,{fields}", "--format=csv,noheader,nounits"], text=True
    )
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    return {row[0]: row[1:] for row in rows}


def test_nvml_readings_are_nvidia_smis() -> None:
    inventory = GpuInventory(load_catalog(), use_nvml="yes")
    readings = {r.uuid: r for r in read_cards(inventory)}
    assert set(readings) == {u for _, _, u in nvidia_smi_list()}
    truth = smi("memory.total,temperature.gpu,utilization.gpu")
    for dev_uuid, r in readings.items():
        total, temp, _util = truth[dev_uuid]
        assert not r.simulated
        assert abs(r.mem_total_mib - float(total)) <= 1
        assert r.temp_c is not None and abs(r.temp_c - float(temp)) <= 5
        assert r.util_pct is not None and 0 <= r.util_pct <= 100
        assert r.mem_used_mib is not None and 0 <= r.mem_used_mib <= r.mem_total_mib


def test_a_process_holding_card_memory_is_listed_with_it() -> None:
    inventory = GpuInventory(load_catalog(), use_nvml="yes")
    first = next(d for d in inventory.devices if d.index == 0)
    before = next(r for r in read_cards(inventory) if r.uuid == first.uuid).mem_used_mib
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_MEMORY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"

        def holding():
            r = next(r for r in read_cards(inventory) if r.uuid == first.uuid)
            return r if any(used >= 512 for _, used in r.processes) else None

        reading = wait_for(holding, 30, 0.5, "NVML to list the process and its memory")
        assert reading.mem_used_mib >= before + 512
        pids = [pid for pid, _ in reading.processes]
        # NVML names host pids: equal to ours unless the test runs in a pid namespace of its own.
        with open("/proc/self/status") as f:
            own_namespace = any(line.startswith("NSpid:") and len(line.split()) > 2 for line in f)
        if not own_namespace:
            assert proc.pid in pids
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_a_real_card_is_scraped_with_its_holder(tmp_path, hub_factory) -> None:
    """The DCGM families of a real card on a real hub: simulated="false", the holder's labels,
    memory free + used = the card's memory as nvidia-smi says."""
    token = "prom-" + uuid.uuid4().hex
    catalog = this_gpu_catalog(DEFAULT_CATALOG, tmp_path / "catalog.toml")
    hub = hub_factory(
        simulate="none",
        catalog=catalog,
        env={"GPULAB_PROMETHEUS_TOKEN": token},
        extra_args=["--CardSampler.interval=0.5"],
    )
    user = hub.create_user()
    hub.spawn_ready(user, {"gpu": "this-gpu"})
    (card,) = hub.server(user)["state"]["allocation"]["uuids"]

    def scraped():
        r = requests.get(
            f"{hub.url}/hub/metrics", headers={"Authorization": f"token {token}"}, timeout=30
        )
        assert r.status_code == 200
        samples = [s for f in text_string_to_metric_families(r.text) for s in f.samples]
        mine = {s.name: s for s in samples if s.labels.get("UUID") == card}
        return mine if "DCGM_FI_DEV_GPU_UTIL" in mine else None

    mine = wait_for(scraped, 30, 0.5, "the card's first reading")
    util = mine["DCGM_FI_DEV_GPU_UTIL"].labels
    assert (util["simulated"], util["user"], util["server"]) == ("false", user, "")
    (total,) = smi("memory.total")[card]
    fb = mine["DCGM_FI_DEV_FB_USED"].value + mine["DCGM_FI_DEV_FB_FREE"].value
    assert abs(fb - float(total)) <= 2
    assert mine["DCGM_FI_DEV_GPU_TEMP"].value > 0
    hub.stop_server(user)
