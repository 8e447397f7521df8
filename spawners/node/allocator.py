"""Whole-GPU allocation with a crash-safe ledger.

Every server, GPU or not, gets one ledger record before its process starts. The ledger is a small
JSON file replaced atomically (write, fsync, rename), so a hub killed with SIGKILL finds on restart
exactly which servers held which cards. Records that no restored spawner claims are orphans: their
processes (found by the allocation id in their environment) are killed and their GPUs freed.

All mutations are synchronous and run on the hub's event loop thread, so two coroutines can never
interleave inside one allocation: a card can't go to two servers however many spawns race.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpulab.spawners.node.inventory import GpuDevice
from gpulab.spawners.node.procs import (
    allocation_ids_running,
    kill_allocation_processes,
    kill_recorded_pid,
    process_start_time,
)


@dataclass
class Allocation:
    alloc_id: str
    owner: str  # "user/server-name" ("alice/" for the default server)
    gpu_type: str | None  # None: no-GPU mode
    uuids: list[str]
    created: float
    pid: int | None = None
    pricing: str = "on-demand"
    pid_start: int | None = None  # the process's start time (clock ticks), guards against pid reuse
    expires: float | None = None  # reservations only: when an unclaimed hold lapses

    def to_json(self) -> dict:
        return asdict(self)


class NoCapacity(Exception):
    """The requested GPU type has too few free cards. ``str()`` says what is free instead."""

    def __init__(self, message: str, free: dict[str, int]) -> None:
        super().__init__(message)
        self.free = free


def owner_key(user: str, server: str = "") -> str:
    return f"{user}/{server}"


RESERVED = "#reserved"


@dataclass
class _State:
    allocations: dict[str, Allocation] = field(default_factory=dict)  # by owner


class GpuAllocator:
    """Hands out whole GPUs by UUID and remembers who holds what across hub restarts."""

    def __init__(self, devices: Iterable[GpuDevice], ledger_path: str | Path, log=None) -> None:
        self.devices = [d for d in devices if d.gpu_type is not None]
        self.ledger_path = Path(ledger_path)
        self.log = log or logging.getLogger("gpulab.allocator")
        self.started = time.time()
        self._adopted: set[str] = set()
        # owner -> (the only cluster nodes its cards may come from, why): e.g. the node holding
        # the user's home, where homes don't follow users, or the nodes holding the image.
        self._pins: dict[str, tuple[frozenset[str], str]] = {}
        self._state = self._load()

    # ---- persistence -------------------------------------------------------------------------

    def _load(self) -> _State:
        try:
            raw = json.loads(self.ledger_path.read_text())
        except FileNotFoundError:
            return _State()
        known = {d.uuid for d in self.devices}
        state = _State()
        for rec in raw.get("allocations", []):
            alloc = Allocation(**rec)
            missing = [u for u in alloc.uuids if u not in known]
            if missing:
                # The card vanished (driver change, different --simulate-gpus). Keep the record so
                # the orphan sweep can stop its process, but nothing can be allocated on it anyway.
                self.log.warning(
                    "Ledger record %s for %s names GPUs not on this node: %s",
                    alloc.alloc_id,
                    alloc.owner,
                    ", ".join(missing),
                )
            state.allocations[alloc.owner] = alloc
        return state

    def _save(self) -> None:
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ledger_path.with_suffix(".tmp")
        data = {"allocations": [a.to_json() for a in self._state.allocations.values()]}
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.ledger_path)

    # ---- queries -----------------------------------------------------------------------------

    @property
    def allocations(self) -> list[Allocation]:
        return list(self._state.allocations.values())

    def held_uuids(self) -> dict[str, Allocation]:
        return {u: a for a in self._state.allocations.values() for u in a.uuids}

    def get(self, owner: str) -> Allocation | None:
        return self._state.allocations.get(owner)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per GPU type: total and free cards."""
        held = self.held_uuids()
        out: dict[str, dict[str, int]] = {}
        for d in self.devices:
            c = out.setdefault(d.gpu_type, {"total": 0, "free": 0})
            c["total"] += 1
            if d.uuid not in held:
                c["free"] += 1
        return out

    def describe_free(self, exclude: str | None = None) -> str:
        free = [
            f"{slug} x{c['free']}"
            for slug, c in sorted(self.counts().items())
            if c["free"] and slug != exclude
        ]
        others = ", ".join(free) if free else "no other GPU type has a free card"
        return f'Free now: {others}; no-GPU mode (gpu: "none") is always available.'

    # ---- mutations ---------------------------------------------------------------------------

    def allocate(
        self, owner: str, gpu_type: str | None, count: int, pricing: str = "on-demand"
    ) -> Allocation:
        """Give ``count`` whole cards of ``gpu_type`` (none for no-GPU mode) to ``owner``.

        A matching reservation made for ``owner`` (see :meth:`reserve`) is used first.
        """
        old = self._state.allocations.get(owner)
        if old is not None:
            # The hub only spawns a server it believes stopped, so an old record is stale.
            self.log.warning("Replacing stale allocation %s of %s", old.alloc_id, owner)
            self._evict(old)
        reserved = self._state.allocations.pop(owner + RESERVED, None)
        if reserved is not None:
            if reserved.gpu_type == gpu_type and len(reserved.uuids) == count:
                reserved.owner, reserved.pricing, reserved.expires = owner, pricing, None
                self._state.allocations[owner] = reserved
                self._save()
                return reserved
            self._adopted.discard(reserved.alloc_id)  # reserved for other options: give it back
        return self._take(owner, gpu_type, count, pricing)

    def reserve(
        self, owner: str, gpu_type: str | None, count: int, ttl: float = 120.0
    ) -> Allocation:
        """Hold cards for ``owner``'s next start while its current server is being stopped.

        Raises :class:`NoCapacity` (changing nothing) when too few are free. The reservation
        lapses after ``ttl`` seconds if no start consumes it.
        """
        self._drop_expired_reservations()
        key = owner + RESERVED
        previous = self._state.allocations.pop(key, None)
        try:
            alloc = self._take(key, gpu_type, count, "reservation")
        except NoCapacity:
            if previous is not None:
                self._state.allocations[key] = previous
            raise
        alloc.expires = time.time() + ttl
        self._save()
        return alloc

    def _drop_expired_reservations(self) -> None:
        now = time.time()
        expired = [
            k
            for k, a in self._state.allocations.items()
            if a.expires is not None and a.expires < now
        ]
        for key in expired:
            alloc = self._state.allocations.pop(key)
            self._adopted.discard(alloc.alloc_id)
        if expired:
            self._save()

    def _take(self, owner: str, gpu_type: str | None, count: int, pricing: str) -> Allocation:
        self._drop_expired_reservations()
        uuids: list[str] = []
        if gpu_type is not None:
            held = self.held_uuids()
            candidates = [d for d in self.devices if d.gpu_type == gpu_type and d.uuid not in held]
            pin = self._pins.get(owner.removesuffix(RESERVED))
            if pin is not None:
                candidates = [d for d in candidates if d.node in pin[0]]
            picked = self._pick(candidates, count)
            if picked is None:
                total = sum(1 for d in self.devices if d.gpu_type == gpu_type)
                free = {s: c["free"] for s, c in self.counts().items()}
                split = f" {pin[1]}" if pin else ""
                if len(candidates) >= count:
                    # Enough cards, but not on one node: a server's cards are on one machine.
                    best = max(self._by_node(candidates).values(), key=len)
                    split = f" (at most {len(best)} on one node)"
                raise NoCapacity(
                    f"No {gpu_type} available: {count} requested, {len(candidates)} of {total} "
                    f"free{split}. {self.describe_free(exclude=gpu_type)}",
                    free,
                )
            uuids = [d.uuid for d in picked]
        alloc = Allocation(
            alloc_id=uuid.uuid4().hex,
            owner=owner,
            gpu_type=gpu_type,
            uuids=uuids,
            created=time.time(),
            pricing=pricing,
        )
        self._state.allocations[owner] = alloc
        self._adopted.add(alloc.alloc_id)
        self._save()
        return alloc

    @staticmethod
    def _by_node(devices: list[GpuDevice]) -> dict[str | None, list[GpuDevice]]:
        groups: dict[str | None, list[GpuDevice]] = {}
        for d in sorted(devices, key=lambda d: (d.node or "", d.index)):
            groups.setdefault(d.node, []).append(d)
        return groups

    def _pick(self, candidates: list[GpuDevice], count: int) -> list[GpuDevice] | None:
        """``count`` free cards all on one node, or None. Best fit: the node with the fewest free
        cards that still has enough, so that whole nodes stay free for many-card servers."""
        fitting = [g for g in self._by_node(candidates).values() if len(g) >= count]
        if not fitting:
            return None
        group = min(fitting, key=lambda g: (len(g), g[0].node or ""))
        return group[:count]

    def pin(self, owner: str, nodes: Iterable[str] | None, why: str = "") -> None:
        """Take ``owner``'s cards only from the cluster nodes ``nodes`` from now on (None:
        anywhere). ``why`` ends a refusal's "n of m free" (e.g. "on node X, which holds this
        server's home")."""
        if nodes is None:
            self._pins.pop(owner, None)
        else:
            self._pins[owner] = (frozenset(nodes), why)

    def node_of(self, alloc: Allocation) -> str | None:
        """The node holding ``alloc``'s cards (None: this machine, or no GPU)."""
        nodes = {d.node for d in self.devices if d.uuid in set(alloc.uuids)}
        return next(iter(nodes)) if len(nodes) == 1 else None

    def set_devices(self, devices: Iterable[GpuDevice]) -> None:
        """The rentable cards changed (a cluster node joined, left, went down or was drained).
        Records keep their cards: a card that left is free again only once its server stops."""
        self.devices = [d for d in devices if d.gpu_type is not None]

    def reassign(self, owner: str, uuids: list[str]) -> Allocation:
        """Record that ``owner``'s server got the cards ``uuids`` (same node, same count) rather
        than those the allocator picked: a cluster engine (Swarm) chooses which of a node's
        cards a task gets. A card picked for another record on that node is swapped with it, so
        no card is ever held twice. Raises ValueError when ``uuids`` can't be ``owner``'s."""
        alloc = self._state.allocations.get(owner)
        if alloc is None:
            raise ValueError(f"{owner} holds no allocation")
        if sorted(uuids) == sorted(alloc.uuids):
            return alloc
        by_uuid = {d.uuid: d for d in self.devices}
        node = self.node_of(alloc)
        if len(uuids) != len(alloc.uuids) or any(
            u not in by_uuid or by_uuid[u].node != node for u in uuids
        ):
            raise ValueError(
                f"{owner}: cards {', '.join(uuids)} are not {len(alloc.uuids)} card(s) of node "
                f"{node} (allocated: {', '.join(alloc.uuids)})"
            )
        held = self.held_uuids()
        gained = [u for u in uuids if u not in alloc.uuids]
        given = [u for u in alloc.uuids if u not in uuids]
        for mine, theirs in zip(given, gained, strict=True):
            other = held.get(theirs)
            if other is not None and other.owner != owner:
                other.uuids = [mine if u == theirs else u for u in other.uuids]
                self.log.warning(
                    "%s got card %s that was picked for %s; %s gets %s instead",
                    owner,
                    theirs,
                    other.owner,
                    other.owner,
                    mine,
                )
        alloc.uuids = list(uuids)
        self._save()
        return alloc

    def set_pid(self, owner: str, pid: int) -> None:
        alloc = self._state.allocations.get(owner)
        if alloc is not None and alloc.pid != pid:
            alloc.pid = pid
            alloc.pid_start = process_start_time(pid)
            self._save()

    def release(self, owner: str, alloc_id: str | None = None) -> Allocation | None:
        """Free ``owner``'s cards. With ``alloc_id``, only if it is still that allocation."""
        alloc = self._state.allocations.get(owner)
        if alloc is None or (alloc_id is not None and alloc.alloc_id != alloc_id):
            return None
        del self._state.allocations[owner]
        self._adopted.discard(alloc.alloc_id)
        self._save()
        return alloc

    def adopt(self, owner: str, alloc_id: str) -> Allocation | None:
        """A restored spawner claims its record after a hub restart."""
        alloc = self._state.allocations.get(owner)
        if alloc is None or alloc.alloc_id != alloc_id:
            return None
        self._adopted.add(alloc_id)
        return alloc

    def restore(self, alloc: Allocation) -> bool:
        """Put back a record the ledger lost, found on a still-running server (container labels).

        Refused (False) if the owner holds another allocation or any card is unknown or held by
        someone else: a card is never handed to two servers, whatever the labels claim.
        """
        current = self._state.allocations.get(alloc.owner)
        if current is not None:
            return current.alloc_id == alloc.alloc_id
        known = {d.uuid for d in self.devices}
        held = self.held_uuids()
        if any(u not in known or u in held for u in alloc.uuids):
            return False
        self._state.allocations[alloc.owner] = alloc
        self._save()
        return True

    def orphans(self) -> list[Allocation]:
        return [a for a in self._state.allocations.values() if a.alloc_id not in self._adopted]

    def sweep_orphans(self, hub_id: str) -> list[Allocation]:
        """Stop the processes of unclaimed records and free them. Call once spawners are restored."""
        swept = []
        for alloc in self.orphans():
            killed = kill_allocation_processes(hub_id, alloc.alloc_id) + kill_recorded_pid(
                alloc.pid, alloc.pid_start
            )
            self.log.warning(
                "Orphaned allocation %s of %s (GPUs: %s): no server claims it after restart; "
                "stopped %d process(es) and freed it.",
                alloc.alloc_id,
                alloc.owner,
                ", ".join(alloc.uuids) or "none",
                killed,
            )
            del self._state.allocations[alloc.owner]
            swept.append(alloc)
        known = {a.alloc_id for a in self._state.allocations.values()}
        # Processes carrying an allocation id the ledger never recorded (the hub died between
        # starting them and saving) are orphans too.
        for alloc_id in allocation_ids_running(hub_id) - known:
            n = kill_allocation_processes(hub_id, alloc_id)
            self.log.warning("Stopped %d stray process(es) of unknown allocation %s", n, alloc_id)
        if swept:
            self._save()
        return swept

    def _evict(self, alloc: Allocation) -> None:
        kill_allocation_processes(None, alloc.alloc_id)
        kill_recorded_pid(alloc.pid, alloc.pid_start)
        del self._state.allocations[alloc.owner]
        self._adopted.discard(alloc.alloc_id)
