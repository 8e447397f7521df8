"""Pure parts of the JupyterLab extension's server half: env parsing, cost, billing answers."""

from __future__ import annotations

from decimal import Decimal

import pytest
from jupyterlab_gpulab.billing import normalize_balance
from jupyterlab_gpulab.server_info import ServerInfo

GPU_ENV = {
    "JUPYTERHUB_USER": "ada",
    "GPULAB_MODE": "A100-80G x2 (simulated)",
    "GPULAB_GPU_TYPE": "a100-80g",
    "GPULAB_GPU_COUNT": "2",
    "GPULAB_GPUS_SIMULATED": "1",
    "GPULAB_PRICING": "on-demand",
    "GPULAB_PRICE_PER_HOUR": "4.20",
    "GPULAB_CURRENCY": "CNY",
    "GPULAB_IMAGE": "base",
    "GPULAB_DATASETS": "sklearn-toy,sklearn-images",
    "GPULAB_ALLOCATION_ID": "a-123",
    "CUDA_VISIBLE_DEVICES": "GPU-SIM-1,GPU-SIM-2",
}


def test_server_info_reads_the_spawner_env() -> None:
    info = ServerInfo.from_env(GPU_ENV, started_at=1000.0)
    assert info.in_gpulab
    assert info.visible_devices == ("GPU-SIM-1", "GPU-SIM-2")
    assert info.datasets == ("sklearn-toy", "sklearn-images")
    # 15 minutes at CNY 4.20/h = CNY 1.05, exactly (Decimal, not float).
    assert info.session_cost(now=1000.0 + 900) == Decimal("1.0500")
    data = info.to_json(now=1000.0 + 900)
    assert data["session_cost"] == "1.0500" and data["price_per_hour"] == "4.20"


def test_server_info_outside_gpulab_is_inactive() -> None:
    info = ServerInfo.from_env({"CUDA_VISIBLE_DEVICES": ""}, started_at=0)
    assert not info.in_gpulab
    assert info.mode == "No GPU" and info.visible_devices == ()
    assert info.session_cost() is None
    bad_price = ServerInfo.from_env({**GPU_ENV, "GPULAB_PRICE_PER_HOUR": "cheap"}, started_at=0)
    assert bad_price.price_per_hour is None


def test_billing_answer_is_normalized() -> None:
    # The shape gpulab's billing service answers (money as micro-units, exact and display).
    out = normalize_balance(
        {
            "user": "alice",
            "balance": {"micro": 9500000, "exact": "9.500000", "display": "9.50"},
            "currency": "CNY",
            "burn_rate_per_hour": {"micro": 2100000, "exact": "2.100000", "display": "2.10"},
            "time_left_seconds": 16285.7,
            "warnings": ["Your balance (CNY 9.50) is below CNY 10.00."],
        },
        "XXX",
    )
    assert out == {
        "available": True,
        "balance": "9.500000",
        "currency": "CNY",
        "burn_rate_per_hour": "2.100000",
        "time_left_seconds": 16285.7,
        "warnings": ["Your balance (CNY 9.50) is below CNY 10.00."],
    }
    idle = normalize_balance({"balance": {"exact": "3"}, "time_left_seconds": None}, "CNY")
    assert idle["currency"] == "CNY" and idle["time_left_seconds"] is None


@pytest.mark.parametrize(
    "answer", [None, [], "oops", {}, {"balance": "lots"}, {"balance": True}, {"balance": "NaN"}]
)
def test_unreadable_billing_answers_are_unavailable(answer) -> None:
    out = normalize_balance(answer, "CNY")
    assert out["available"] is False and out["reason"]


@pytest.mark.gpu
def test_gpu_panel_reads_a_real_gpu_from_nvml() -> None:
    """The GPU panel's numbers for a real card (skipped where NVML finds no GPU)."""
    import pynvml
    from jupyterlab_gpulab.gpus import read_devices

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        total_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
    finally:
        pynvml.nvmlShutdown()
    for ident in (uuid, "0"):
        reading = read_devices((ident,))
        assert reading["nvml"] is True, reading
        [device] = reading["devices"]
        assert device["id"] == ident and "error" not in device, device
        assert device["memory_total_mib"] == total_mib
        assert 0 <= device["memory_used_mib"] <= total_mib
        assert 0 <= device["utilization_percent"] <= 100
