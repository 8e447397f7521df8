"""GPU inventory: the simulated pool and the no-driver path."""

from __future__ import annotations

import logging

import pynvml
import pytest

from gpulab.catalog import load_catalog
from gpulab.spawners.node.inventory import GpuInventory, SimulateSpecError, parse_simulate_spec

CATALOG = load_catalog()


def test_simulate_spec_accepts_display_names_in_any_case() -> None:
    assert parse_simulate_spec("A100-80G:2, rtx 4090:4", CATALOG) == [
        ("a100-80g", 2),
        ("rtx-4090", 4),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("A100-80G", "is not TYPE:COUNT"),
        ("TPU:2", "unknown GPU type 'TPU'; allowed: rtx-4090, rtx-3090-ti, a100-80g, h100-80g"),
        ("A100-80G:0", "at least 1"),
    ],
)
def test_bad_simulate_spec(spec: str, message: str) -> None:
    with pytest.raises(SimulateSpecError, match=message):
        parse_simulate_spec(spec, CATALOG)


def test_simulated_cards_are_labelled_and_stable() -> None:
    one = GpuInventory(CATALOG, simulate_gpus="A100-80G:2", use_nvml="no").devices
    two = GpuInventory(CATALOG, simulate_gpus="A100-80G:2", use_nvml="no").devices
    assert [d.uuid for d in one] == [d.uuid for d in two]
    assert all(
        d.simulated and "(simulated)" in d.name and d.uuid.startswith("GPU-SIM-") for d in one
    )
    assert len({d.uuid for d in one}) == 2


def test_no_driver_means_empty_inventory_and_one_clear_log_line(monkeypatch, caplog) -> None:
    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    caplog.set_level(logging.WARNING)
    inv = GpuInventory(CATALOG)
    assert inv.devices == []
    assert inv.nvml_error
    lines = [r.getMessage() for r in caplog.records if "NVIDIA" in r.getMessage()]
    assert len(lines) == 1 and "No NVIDIA driver found" in lines[0] and "empty" in lines[0]


def test_use_nvml_is_validated() -> None:
    with pytest.raises(Exception, match="allowed: auto, yes, no"):
        GpuInventory(CATALOG, use_nvml="maybe")
