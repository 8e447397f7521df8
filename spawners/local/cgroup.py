"""One cgroup per local server: limits it cannot leave, and a stop that ends every process.

A process can double-fork, call ``setsid`` and scrub its environment, but it cannot leave its
cgroup (only root can move it). So each local server is started inside its own group,
``gpulab/HUBID/NAME``; its pids and memory are limited there, the hub reads its processes from
there, and a stop freezes the group, kills everything in it and waits until it is empty before the
server's cards go back to the pool.

Both cgroup versions are handled: the unified hierarchy (v2, ``cgroup.kill`` or freeze-and-kill)
and the legacy per-controller hierarchies (v1: pids, memory, freezer, devices). On real GPUs with
v1 the devices controller denies the server every ``/dev/nvidia*`` card it was not given (v2 needs
an eBPF program for that; there the driver's ``CUDA_VISIBLE_DEVICES`` pinning is what holds).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
NVIDIA_MAJOR = 195
V1_CONTROLLERS = ("pids", "memory", "freezer", "devices")
CPU_PERIOD_US = 100_000  # the period a CPU quota is counted over (v1 and v2)


class CgroupError(RuntimeError):
    """A cgroup could not be made, joined or emptied; the message says which file failed."""


@dataclass(frozen=True)
class Limits:
    pids: int | None = None
    memory_bytes: int | None = None
    # NVIDIA device minors this server must not open (the node's other cards).
    deny_gpu_minors: tuple[int, ...] = ()
    # Cores' worth of CPU time (0.5: half a core); needs the cpu controller (``controllers``).
    cpu: float | None = None


class Cgroups:
    """The cgroup tree gpulab manages on this node: ``PARENT/`` in one (v2) or each (v1)
    hierarchy."""

    def __init__(self, version: int, paths: dict[str, Path]) -> None:
        # v2: {"": <root>/gpulab}; v1: {controller: <root>/<controller>/gpulab}
        self.version = version
        self.paths = paths

    @classmethod
    def detect(
        cls, root: Path = ROOT, parent: str = "gpulab", controllers: tuple[str, ...] = ()
    ) -> Cgroups | None:
        """The node's cgroups if this process may manage them (root, writable), else None.
        ``controllers``: more than :data:`V1_CONTROLLERS` (``cpu``, for a CPU quota)."""
        if os.geteuid() != 0:
            return None
        try:
            if (root / "cgroup.controllers").exists():
                tree = cls(2, {"": root / parent})
                tree._prepare_v2(root, {"pids", "memory", *controllers})
                return tree
            wanted = (*V1_CONTROLLERS, *controllers)
            paths = {c: root / c / parent for c in wanted if (root / c / "tasks").exists()}
            if "freezer" not in paths:
                return None
            for path in paths.values():
                path.mkdir(exist_ok=True)
            return cls(1, paths)
        except OSError:
            return None

    def _prepare_v2(self, root: Path, controllers: set[str]) -> None:
        base = self.paths[""]
        base.mkdir(exist_ok=True)
        wanted = controllers & set((root / "cgroup.controllers").read_text().split())
        for level in (root, base):
            enabled = set((level / "cgroup.subtree_control").read_text().split())
            for ctrl in wanted - enabled:
                (level / "cgroup.subtree_control").write_text(f"+{ctrl}")

    def group(self, name: str) -> ServerCgroup:
        if not name or "/" in name or name in (".", ".."):
            raise CgroupError(f"bad cgroup name {name!r}")
        return ServerCgroup(self.version, {c: p / name for c, p in self.paths.items()})

    def groups(self) -> list[str]:
        """Names of the server groups that exist now (for the orphan sweep)."""
        any_path = next(iter(self.paths.values()))
        try:
            return sorted(p.name for p in any_path.iterdir() if p.is_dir())
        except OSError:
            return []


class ServerCgroup:
    """The cgroup of one server (the same name in every v1 hierarchy)."""

    def __init__(self, version: int, paths: dict[str, Path]) -> None:
        self.version = version
        self.paths = paths

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes ``0`` to, to join this group (before dropping root)."""
        return [str(p / "cgroup.procs") for p in self.paths.values()]

    def create(self, limits: Limits) -> None:
        for ctrl, path in self.paths.items():
            path.mkdir(exist_ok=True)
            if self.version == 2:
                if limits.pids is not None:
                    _write(path / "pids.max", str(limits.pids))
                if limits.memory_bytes is not None:
                    _write(path / "memory.max", str(limits.memory_bytes))
                    _write_optional(path / "memory.swap.max", "0")
                if limits.cpu is not None:
                    _write_optional(path / "cpu.max", f"{_quota(limits.cpu)} {CPU_PERIOD_US}")
            elif ctrl == "pids" and limits.pids is not None:
                _write(path / "pids.max", str(limits.pids))
            elif ctrl == "memory" and limits.memory_bytes is not None:
                _write(path / "memory.limit_in_bytes", str(limits.memory_bytes))
            elif ctrl == "cpu" and limits.cpu is not None:
                _write(path / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(path / "cpu.cfs_quota_us", str(_quota(limits.cpu)))
            elif ctrl == "devices":
                for minor in limits.deny_gpu_minors:
                    _write(path / "devices.deny", f"c {NVIDIA_MAJOR}:{minor} rwm")

    def join(self, pid: int = 0) -> None:
        """Move ``pid`` (0: the calling process) into this group."""
        for f in self.procs_files:
            _write(Path(f), str(pid))

    def pids(self) -> list[int]:
        path = next(iter(self.paths.values())) / "cgroup.procs"
        try:
            return [int(x) for x in path.read_text().split()]
        except FileNotFoundError:
            return []
        except OSError as e:
            raise CgroupError(f"cannot read {path}: {e}") from None

    def exists(self) -> bool:
        return next(iter(self.paths.values())).is_dir()

    def cpu_seconds(self) -> float | None:
        """CPU seconds everything in this group ever consumed (cgroup v2's ``cpu.stat``, kept
        by the kernel across processes that exited); None where the tree does not count it."""
        if self.version != 2:
            return None
        try:
            text = (self._one() / "cpu.stat").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None

    def kill_all(self, timeout: float = 10.0) -> int:
        """End every process in the group, however it detached; returns how many there were.
        Raises CgroupError if the group is not empty after ``timeout`` seconds."""
        victims = self.pids()
        if not victims:
            return 0
        if self.version == 2 and (self._one() / "cgroup.kill").exists():
            _write(self._one() / "cgroup.kill", "1")
        else:
            # Frozen processes cannot fork, so no child escapes between listing and killing.
            self._freeze(True)
            try:
                for pid in self.pids():
                    _kill(pid)
            finally:
                self._freeze(False)
        deadline = time.monotonic() + timeout
        while self.pids():
            if time.monotonic() > deadline:
                raise CgroupError(f"processes {self.pids()} outlived SIGKILL in {self._one()}")
            for pid in self.pids():
                _kill(pid)
            time.sleep(0.02)
        return len(victims)

    def remove(self) -> None:
        for path in self.paths.values():
            try:
                path.rmdir()
            except FileNotFoundError:
                pass

    def _one(self) -> Path:
        return self.paths.get("", self.paths.get("freezer", next(iter(self.paths.values()))))

    def _freeze(self, frozen: bool) -> None:
        if self.version == 2:
            _write(self._one() / "cgroup.freeze", "1" if frozen else "0")
            return
        state = self.paths["freezer"] / "freezer.state"
        _write(state, "FROZEN" if frozen else "THAWED")
        if frozen:
            deadline = time.monotonic() + 5
            while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
                time.sleep(0.005)


def _quota(cores: float) -> int:
    return max(1000, int(cores * CPU_PERIOD_US))


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise CgroupError(f"cannot write {value!r} to {path}: {e}") from None


def _write_optional(path: Path, value: str) -> None:
    if path.exists():
        _write(path, value)


def parse_memory(limit: str | int | None) -> int | None:
    """``16G`` -> bytes (the catalog's and JupyterHub's ``mem_limit`` notation)."""
    if limit in (None, "", 0):
        return None
    if isinstance(limit, int):
        return limit
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = str(limit).strip().upper()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)
