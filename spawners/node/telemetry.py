"""What each card is doing right now: utilisation, memory, power, temperature, processes.

The hub's card sampler (``hub_config/metrics/sampler.py``) calls :func:`read_cards` every few
seconds, in a thread (NVML calls block), and keeps the readings; the metrics, the admin console
and each user's GPU view read the sampler's cache, never NVML on a request.

- **Real cards** (this machine's, from NVML through nvidia-ml-py): utilisation, memory used and
  total, power, temperature and the compute processes with their memory, as NVML reports them.
  A value NVML does not support on a card (power on some boards) is None, never a made-up 0.
- **Simulated cards** have no hardware behind them. Their utilisation follows the CPU that the
  holding server uses, as the hub's activity observer measures it (``cpu``: % of one core per
  card's UUID, capped at 100), so a busy kernel shows a busy card and an idle one an idle card;
  memory used is 0 with no processes, power and temperature are derived from the utilisation,
  and every reading says ``simulated=True``.
- Cards of other cluster nodes (Swarm) are not read here: NVML sees only this machine's cards
  (their nodes run their own exporters). Simulated cluster cards are simulated as above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpulab.spawners.node.inventory import GpuDevice, GpuInventory

# A simulated card's power (W) at 0 % and 100 % utilisation, per GB of its memory (a rough
# shape of real boards: a 24 GB card ~200 W, an 80 GB card ~420 W at full load).
SIM_IDLE_W = 30.0
SIM_BASE_MAX_W = 100.0
SIM_W_PER_GB = 4.0
SIM_IDLE_C = 30.0
SIM_C_PER_PCT = 0.5


@dataclass(frozen=True)
class CardReading:
    """One card at one moment. Memory in MiB, power in W, temperature in °C."""

    uuid: str
    index: int
    model: str
    util_pct: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    temp_c: float | None
    simulated: bool
    processes: tuple[tuple[int, float], ...] = ()  # (pid in the host's namespace, used MiB)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["processes"] = [{"pid": pid, "used_mib": used} for pid, used in self.processes]
        return out


def simulated_reading(device: GpuDevice, cpu_pct: float | None) -> CardReading:
    """A simulated card's reading: its utilisation is the holder's CPU use (capped at 100)."""
    util = max(0.0, min(100.0, float(cpu_pct or 0.0)))
    max_w = SIM_BASE_MAX_W + SIM_W_PER_GB * device.memory_total_mib / 1024
    return CardReading(
        uuid=device.uuid,
        index=device.index,
        model=device.name,
        util_pct=round(util, 1),
        mem_used_mib=0.0,
        mem_total_mib=float(device.memory_total_mib),
        power_w=round(SIM_IDLE_W + (max_w - SIM_IDLE_W) * util / 100, 1),
        temp_c=round(SIM_IDLE_C + SIM_C_PER_PCT * util, 1),
        simulated=True,
        processes=(),
    )


def _nvml_value(call: Any, *args: Any) -> Any:
    """``call(*args)``, or None where NVML does not support it on this card."""
    import pynvml

    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def nvml_reading(device: GpuDevice) -> CardReading | None:
    """A real card's reading from NVML (blocking), or None if NVML cannot find the card."""
    import pynvml

    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(device.uuid)
    except pynvml.NVMLError:
        return None
    util = _nvml_value(pynvml.nvmlDeviceGetUtilizationRates, handle)
    mem = _nvml_value(pynvml.nvmlDeviceGetMemoryInfo, handle)
    power_mw = _nvml_value(pynvml.nvmlDeviceGetPowerUsage, handle)
    temp = _nvml_value(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
    procs: dict[int, float] = {}
    for getter in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        for p in _nvml_value(getter, handle) or []:
            used = getattr(p, "usedGpuMemory", None)
            # NVML reports no per-process memory in some setups (None, or a huge sentinel).
            mib = float(used) / (1024 * 1024) if isinstance(used, int) and used < 1 << 60 else 0.0
            procs[int(p.pid)] = procs.get(int(p.pid), 0.0) + round(mib, 1)
    return CardReading(
        uuid=device.uuid,
        index=device.index,
        model=device.name,
        util_pct=float(util.gpu) if util is not None else None,
        mem_used_mib=round(mem.used / (1024 * 1024), 1) if mem is not None else None,
        mem_total_mib=round(mem.total / (1024 * 1024), 1)
        if mem is not None
        else float(device.memory_total_mib),
        power_w=round(power_mw / 1000, 1) if power_mw is not None else None,
        temp_c=float(temp) if temp is not None else None,
        simulated=False,
        processes=tuple(sorted(procs.items())),
    )


def read_cards(
    inventory: GpuInventory, cpu: Mapping[str, float | None] | None = None
) -> list[CardReading]:
    """Readings of the inventory's cards that can be read here (blocking: call in a thread).

    ``cpu``: per UUID of a held simulated card, the holding server's CPU use in % of one core
    (the activity observer's measure); a card not in it reads idle."""
    cpu = cpu or {}
    out: list[CardReading] = []
    for device in list(inventory.devices):
        if device.simulated:
            out.append(simulated_reading(device, cpu.get(device.uuid)))
        elif device.node is None:
            reading = nvml_reading(device)
            if reading is not None:
                out.append(reading)
    return out
