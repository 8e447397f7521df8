"""Live utilization and memory of this server's GPUs, from NVML (nvidia-ml-py).

Imported only when the GPU panel asks, and every NVML call runs in a worker thread (NVML blocks).
"""

from __future__ import annotations

from typing import Any


def read_devices(visible: tuple[str, ...]) -> dict[str, Any]:
    """NVML readings of the cards in ``CUDA_VISIBLE_DEVICES`` (UUIDs or indices). Blocking."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": False, "error": "nvidia-ml-py is not installed", "devices": []}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"nvml": False, "error": f"NVML unavailable: {e}", "devices": []}
    devices = []
    try:
        for ident in visible:
            try:
                if ident.isdigit():
                    handle = pynvml.nvmlDeviceGetHandleByIndex(int(ident))
                else:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(ident)
                name = pynvml.nvmlDeviceGetName(handle)
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                util = pynvml.nvmlDeviceGetUtilizationRates(handle)
                devices.append(
                    {
                        "id": ident,
                        "name": name.decode() if isinstance(name, bytes) else name,
                        "utilization_percent": int(util.gpu),
                        "memory_used_mib": int(mem.used) // (1024 * 1024),
                        "memory_total_mib": int(mem.total) // (1024 * 1024),
                    }
                )
            except pynvml.NVMLError as e:
                devices.append({"id": ident, "error": str(e)})
    finally:
        pynvml.nvmlShutdown()
    return {"nvml": True, "error": None, "devices": devices}
