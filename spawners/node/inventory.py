"""What GPUs this machine has: real ones from NVML, plus an optional simulated pool.

Real GPUs come from NVML (nvidia-ml-py). Machines without a driver get an empty real inventory and
one clear log line. A simulated pool (``--simulate-gpus "A100-80G:2,RTX-4090:4"``) lets the platform
be tried and tested without GPUs; every simulated card says so in its ``simulated`` flag and name.
NVML calls block, so the async accessors run them in a thread.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import asdict, dataclass

from traitlets import Unicode, validate
from traitlets.config import LoggingConfigurable

from gpulab.catalog import Catalog, slugify

SIM_NAMESPACE = uuid.UUID("6c0b7f0e-2f55-4f7e-9a77-0a9b7c3f5e11")
SIM_SPEC_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9 _.-]*?)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class GpuDevice:
    """One physical (or simulated) card. ``gpu_type`` is a catalog slug, or None if unmatched."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    gpu_type: str | None
    simulated: bool
    # /dev/nvidiaN's N (not always the NVML index); None for simulated cards.
    minor: int | None = None
    # The cluster node holding the card (a Swarm node id); None for this machine's own cards.
    node: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GpuUsage:
    uuid: str
    utilization_percent: int | None
    memory_used_mib: int | None


class SimulateSpecError(ValueError):
    pass


def parse_simulate_spec(spec: str, catalog: Catalog) -> list[tuple[str, int]]:
    """``"A100-80G:2,RTX-4090:4"`` -> ``[("a100-80g", 2), ("rtx-4090", 4)]``."""
    out: list[tuple[str, int]] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = SIM_SPEC_RE.match(part)
        if not m:
            raise SimulateSpecError(
                f"simulate_gpus: {part!r} is not TYPE:COUNT (e.g. 'A100-80G:2,RTX-4090:4')"
            )
        slug, count = slugify(m.group(1)), int(m.group(2))
        if slug not in catalog.gpu_types:
            raise SimulateSpecError(
                f"simulate_gpus: unknown GPU type {m.group(1)!r}; "
                f"allowed: {', '.join(catalog.gpu_types)}"
            )
        if count < 1:
            raise SimulateSpecError(f"simulate_gpus: count for {slug} must be at least 1")
        out.append((slug, count))
    return out


def simulated_devices(
    spec: list[tuple[str, int]], catalog: Catalog, first_index: int
) -> list[GpuDevice]:
    devices = []
    index = first_index
    for slug, count in spec:
        gpu_type = catalog.gpu_types[slug]
        for i in range(count):
            # Stable across restarts so allocations stored by UUID survive a hub restart.
            fake = uuid.uuid5(SIM_NAMESPACE, f"{slug}/{i}")
            devices.append(
                GpuDevice(
                    index=index,
                    uuid=f"GPU-SIM-{fake}",
                    name=f"{gpu_type.display_name} (simulated)",
                    memory_total_mib=gpu_type.vram_gb * 1024,
                    gpu_type=slug,
                    simulated=True,
                )
            )
            index += 1
    return devices


class NvmlUnavailable(RuntimeError):
    pass


def _nvml_devices(catalog: Catalog) -> list[GpuDevice]:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(str(e)) from None
    devices = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        dev_uuid = pynvml.nvmlDeviceGetUUID(handle)
        dev_uuid = dev_uuid.decode() if isinstance(dev_uuid, bytes) else dev_uuid
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
        except pynvml.NVMLError:
            minor = None
        matched = catalog.gpu_type_for_nvml_name(name)
        devices.append(
            GpuDevice(
                index=i,
                uuid=dev_uuid,
                name=name,
                memory_total_mib=int(mem.total // (1024 * 1024)),
                gpu_type=matched.slug if matched else None,
                simulated=False,
                minor=minor,
            )
        )
    return devices


def nvml_compute_pids(uuids: list[str]) -> list[int]:
    """Pids (host namespace) of the compute and graphics processes on these real cards; blocking.
    Empty where NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    pids: set[int] = set()
    for dev_uuid in uuids:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(dev_uuid)
            for getter in (
                pynvml.nvmlDeviceGetComputeRunningProcesses,
                pynvml.nvmlDeviceGetGraphicsRunningProcesses,
            ):
                pids.update(int(p.pid) for p in getter(handle))
        except pynvml.NVMLError:
            continue
    return sorted(pids)


def _nvml_usage(uuids: list[str]) -> list[GpuUsage]:
    import pynvml

    out = []
    for dev_uuid in uuids:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(dev_uuid)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(GpuUsage(dev_uuid, int(util.gpu), int(mem.used // (1024 * 1024))))
        except pynvml.NVMLError:
            out.append(GpuUsage(dev_uuid, None, None))
    return out


class GpuInventory(LoggingConfigurable):
    """The GPUs of this node: NVML's, then the simulated ones."""

    simulate_gpus = Unicode(
        "",
        config=True,
        help="""A simulated GPU pool for machines without GPUs, e.g. "A100-80G:2,RTX-4090:4".

        Types are catalog GPU types (any case; "A100-80G" means "a100-80g"). Simulated cards get
        stable fake UUIDs (GPU-SIM-...) and are labelled simulated in the form, the APIs and logs.
        Only GPUs are simulated: servers, kernels and billing stay real.
        """,
    )

    use_nvml = Unicode(
        "auto",
        config=True,
        help="""Read real GPUs from NVML: 'auto' (if a driver is present), 'yes' (fail if none), 'no'.""",
    )

    @validate("use_nvml")
    def _check_use_nvml(self, proposal: dict) -> str:
        value = str(proposal["value"]).lower()
        if value not in {"auto", "yes", "no"}:
            raise ValueError(f"use_nvml: {value!r} is not allowed; allowed: auto, yes, no")
        return value

    def __init__(self, catalog: Catalog, **kwargs) -> None:
        super().__init__(**kwargs)
        self.catalog = catalog
        self.nvml_error: str | None = None
        self._local: list[GpuDevice] = self._discover()
        self.devices: list[GpuDevice] = list(self._local)

    def set_cluster_devices(self, devices: list[GpuDevice]) -> None:
        """Replace the cards of the cluster's nodes (those with a ``node``) by ``devices``: the
        cards of nodes that can take servers now. This machine's own cards stay."""
        self.devices = self._local + [d for d in devices if d.node is not None]

    def _discover(self) -> list[GpuDevice]:
        real: list[GpuDevice] = []
        if self.use_nvml != "no":
            try:
                real = _nvml_devices(self.catalog)
            except NvmlUnavailable as e:
                self.nvml_error = str(e)
                if self.use_nvml == "yes":
                    raise
                self.log.warning(
                    "No NVIDIA driver found (NVML: %s): the real GPU inventory is empty.", e
                )
        for dev in real:
            if dev.gpu_type is None:
                self.log.warning(
                    "GPU %d (%s, %s) matches no catalog GPU type; it will not be offered. "
                    "Add its name to a gpu_types.*.nvml_names entry to rent it out.",
                    dev.index,
                    dev.name,
                    dev.uuid,
                )
            else:
                self.log.info("GPU %d: %s %s -> %s", dev.index, dev.name, dev.uuid, dev.gpu_type)
        simulated: list[GpuDevice] = []
        if self.simulate_gpus:
            spec = parse_simulate_spec(self.simulate_gpus, self.catalog)
            simulated = simulated_devices(spec, self.catalog, first_index=len(real))
            self.log.warning(
                "SIMULATED GPUs (no real hardware behind them): %s",
                ", ".join(f"{slug} x{n}" for slug, n in spec),
            )
        return real + simulated

    @property
    def rentable(self) -> list[GpuDevice]:
        return [d for d in self.devices if d.gpu_type is not None]

    def by_uuid(self, dev_uuid: str) -> GpuDevice | None:
        return next((d for d in self.devices if d.uuid == dev_uuid), None)

    async def usage(self) -> dict[str, GpuUsage]:
        """Live utilization and memory of the real GPUs (simulated ones report None)."""
        real = [d.uuid for d in self.devices if not d.simulated]
        usage = {d.uuid: GpuUsage(d.uuid, None, None) for d in self.devices if d.simulated}
        if real:
            for u in await asyncio.to_thread(_nvml_usage, real):
                usage[u.uuid] = u
        return usage
