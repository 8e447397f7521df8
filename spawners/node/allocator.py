"""Whole-GPU allocation with a crash-safe ledger.

Every server, GPU or not, gets one ledger record before its process starts. The ledger is a small
JSON file replaced atomically (write, fsync, rename), so a hub killed with SIGKILL finds on restart
exactly which servers held which cards. Records that no restored spawner claims are orphans: their
processes (found by the allocation id in their environment) are killed and their GPUs freed.

All mutations are synchronous and run on the hub's event loop thread, so two coroutines can never
interleave inside one allocation: a card can't go to two servers however many spawns race. They
also hold the allocator's lock, so a caller on another thread (a test, a tool) cannot interleave
either. A gang (a training job over several nodes, :meth:`GpuAllocator.allocate_gang`) is placed
whole or not at all, under that lock and in one ledger write: a hub killed at any moment leaves
either every rank's record or none.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpulab.catalog import NO_GPU
from gpulab.spawners.node.holds import Hold
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
    # The type of the cards held; None: holds no cards (a no-GPU server). A fact about cards, not
    # the user's choice (``ServerOptions.gpu``, NO_GPU for no GPU): the two cross only through
    # ``gpulab.catalog.card_type`` and ``gpu_choice``. Ledgers keep null for it, old and new.
    gpu_type: str | None
    uuids: list[str]
    created: float
    pid: int | None = None
    pricing: str = "on-demand"
    pid_start: int | None = None  # the process's start time (clock ticks), guards against pid reuse
    expires: float | None = None  # reservations only: when an unclaimed hold lapses
    hold_id: str | None = None  # the account's hold (reservation, booking) its cards came from

    def to_json(self) -> dict:
        return asdict(self)


class NoCapacity(Exception):
    """The requested GPU type has too few free cards. ``str()`` says what is free instead, in
    the API's words; ``human`` says it in plain words for a page (the message when not given)."""

    def __init__(self, message: str, free: dict[str, int], human: str = "") -> None:
        super().__init__(message)
        self.free = free
        self.human = human or message


def owner_key(user: str, server: str = "") -> str:
    return f"{user}/{server}"


RESERVED = "#reserved"


def _locked(method):
    """Run ``method`` holding the allocator's lock (see the module docstring)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


@dataclass
class _State:
    allocations: dict[str, Allocation] = field(default_factory=dict)  # by owner
    holds: dict[str, Hold] = field(default_factory=dict)  # by id


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
        # Reentrant: allocate() takes it and calls _take(), which takes it too.
        self._lock = threading.RLock()
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
        for rec in raw.get("holds", []):
            hold = Hold(**rec)
            state.holds[hold.hold_id] = hold
        return state

    def _save(self) -> None:
        self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ledger_path.with_suffix(".tmp")
        data = {
            "allocations": [a.to_json() for a in self._state.allocations.values()],
            "holds": [h.to_json() for h in self._state.holds.values()],
        }
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

    def counts(self, accounts: Iterable[str] = ()) -> dict[str, dict[str, int]]:
        """Per GPU type: total cards, free cards, and of those ``held`` for reservations and
        bookings (not counted as free: free is what a new server of ``accounts``, by default
        anyone without a hold, can take)."""
        held = self.held_uuids()
        out: dict[str, dict[str, int]] = {}
        for d in self.devices:
            c = out.setdefault(d.gpu_type, {"total": 0, "free": 0, "held": 0})
            c["total"] += 1
            if d.uuid not in held:
                c["free"] += 1
        now = time.time()
        for slug, c in out.items():
            c["held"] = min(c["free"], self.held_out(slug, now, accounts=accounts))
            c["free"] -= c["held"]
        return out

    # ---- holds (reservations, bookings) --------------------------------------------------------

    @property
    def holds(self) -> list[Hold]:
        return list(self._state.holds.values())

    def hold_used(self, hold_id: str) -> int:
        return sum(len(a.uuids) for a in self._state.allocations.values() if a.hold_id == hold_id)

    def _claims(self, gpu_type: str, now: float, skip: Iterable[str] = ()) -> list[tuple]:
        """(from, end, unused cards) of the active holds of ``gpu_type`` besides ``skip``."""
        skipped = set(skip)
        return [
            (max(h.reclaim_from, now), h.end, max(h.cards - self.hold_used(h.hold_id), 0))
            for h in self._state.holds.values()
            if h.gpu_type == gpu_type and h.active(now) and h.hold_id not in skipped
        ]

    @staticmethod
    def _peak(claims: list[tuple], start: float, end: float) -> int:
        """The most cards ``claims`` hold at once at any time in [start, end)."""
        points = {start, *(f for f, _, _ in claims if start <= f < end)}
        return max(
            (sum(n for f, e, n in claims if f <= t < e) for t in points),
            default=0,
        )

    def held_out(self, gpu_type: str, now: float, accounts: Iterable[str] = ()) -> int:
        """Free cards of ``gpu_type`` that a new server without a hold must leave alone: what the
        holds (other than ``accounts``' usable ones) claim NOW. A hold claims cards only from its
        ``reclaim_from`` (a booking: the keeper's prestart plus a margin before its window; a
        reservation: its month's start), so a booking far ahead denies nobody service today."""
        mine = [
            h.hold_id
            for h in self._state.holds.values()
            if h.account in set(accounts) and h.usable(now)
        ]
        claims = self._claims(gpu_type, now, skip=mine)
        return sum(n for f, e, n in claims if f <= now < e)

    def hold_deficit(self, gpu_type: str, now: float) -> int:
        """Cards the holds claiming now need beyond the free ones: what spot servers occupy."""
        held = self.held_uuids()
        free = sum(1 for d in self.devices if d.gpu_type == gpu_type and d.uuid not in held)
        claims = self._claims(gpu_type, now)
        need = sum(n for f, e, n in claims if f <= now < e)
        return max(need - free, 0)

    def usable_hold(self, accounts: Iterable[str], gpu_type: str, count: int) -> Hold | None:
        """The first hold of ``accounts`` (in that order) usable now with ``count`` unused cards."""
        now = time.time()
        for account in accounts:
            for h in sorted(self._state.holds.values(), key=lambda h: h.created):
                if (
                    h.account == account
                    and h.gpu_type == gpu_type
                    and h.usable(now)
                    and h.cards - self.hold_used(h.hold_id) >= count
                ):
                    return h
        return None

    def hold_problem(self, hold: Hold, now: float | None = None) -> str | None:
        """Why ``hold`` cannot be promised (None: it can): the cards of its type, less those
        on-demand servers hold now (they have no end time; spot ones are reclaimed), less the
        peak the other holds claim during its window."""
        now = time.time() if now is None else now
        total = sum(1 for d in self.devices if d.gpu_type == hold.gpu_type)
        fixed = sum(
            len(a.uuids)
            for a in self._state.allocations.values()
            if a.gpu_type == hold.gpu_type and a.hold_id is None and a.pricing not in ("spot",)
        )
        # Other holds at their full size: their servers may stop and start again.
        full = [
            (max(h.reclaim_from, now), h.end, h.cards)
            for h in self._state.holds.values()
            if h.gpu_type == hold.gpu_type and h.active(now) and h.hold_id != hold.hold_id
        ]
        peak = self._peak(full, max(hold.reclaim_from, now), hold.end)
        left = total - fixed - peak
        if left >= hold.cards:
            return None
        return (
            f"{hold.cards} {hold.gpu_type} card(s) requested, at most {max(left, 0)} can be "
            f"promised: {total} on this platform, {fixed} held by running on-demand servers, "
            f"{peak} already held for other reservations or lab sessions at that time"
        )

    @_locked
    def add_hold(
        self, hold: Hold, limit: Callable[[list[Hold], Hold], str | None] | None = None
    ) -> None:
        """Record ``hold`` (idempotent by id). Raises :class:`NoCapacity`, changing nothing, when
        it cannot be promised, or (checked next) when ``limit`` (e.g. the account's
        :class:`~gpulab.spawners.node.holds.HoldLimits`) names a reason against it."""
        if hold.hold_id in self._state.holds:
            return
        problem = self.hold_problem(hold)
        if problem is None and limit is not None:
            problem = limit(list(self._state.holds.values()), hold)
        if problem is not None:
            raise NoCapacity(problem, {s: c["free"] for s, c in self.counts().items()})
        self._state.holds[hold.hold_id] = hold
        self._save()

    @_locked
    def drop_hold(self, hold_id: str) -> Hold | None:
        """Forget a hold (ended or cancelled); servers that took its cards keep them."""
        hold = self._state.holds.pop(hold_id, None)
        if hold is not None:
            self._save()
        return hold

    def describe_free(self, exclude: str | None = None, plain: bool = False) -> str:
        """What else is free, in the API's words (field names), or ``plain`` ones for a page."""
        free = [
            f"{slug} x{c['free']}"
            for slug, c in sorted(self.counts().items())
            if c["free"] and slug != exclude
        ]
        others = ", ".join(free) if free else "no other GPU type has a free card"
        if plain:
            return f"Free now: {others}. You can always start without a GPU (no-GPU mode)."
        return f'Free now: {others}; no-GPU mode (gpu: "{NO_GPU}") is always available.'

    # ---- mutations ---------------------------------------------------------------------------

    @_locked
    def allocate(
        self,
        owner: str,
        gpu_type: str | None,
        count: int,
        pricing: str = "on-demand",
        accounts: Iterable[str] = (),
        hold_id: str | None = None,
    ) -> Allocation:
        """Give ``count`` whole cards of ``gpu_type`` (none for no-GPU mode) to ``owner``, from
        a usable hold of one of ``accounts`` (the user's, the course's) when there is one; from
        the hold ``hold_id`` only, when given (billing was told the server runs on it).

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
        return self._take(owner, gpu_type, count, pricing, accounts, hold_id)

    @_locked
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

    @_locked
    def _take(
        self,
        owner: str,
        gpu_type: str | None,
        count: int,
        pricing: str,
        accounts: Iterable[str] = (),
        hold_id: str | None = None,
    ) -> Allocation:
        self._drop_expired_reservations()
        uuids: list[str] = []
        hold = None
        if gpu_type is not None:
            accounts = list(accounts)
            hold = self.usable_hold(accounts, gpu_type, count)
            if hold_id is not None and (hold is None or hold.hold_id != hold_id):
                hold = self._state.holds.get(hold_id)
                if hold is None or not (
                    hold.account in accounts
                    and hold.gpu_type == gpu_type
                    and hold.usable(time.time())
                    and hold.cards - self.hold_used(hold_id) >= count
                ):
                    raise NoCapacity(
                        f"The reservation {hold_id} has no {count} unused {gpu_type} card(s) "
                        "now: its other servers hold them. Stop one, or start this one without "
                        "a GPU.",
                        {s: c["free"] for s, c in self.counts().items()},
                    )
            held = self.held_uuids()
            candidates = [d for d in self.devices if d.gpu_type == gpu_type and d.uuid not in held]
            held_out = 0 if hold is not None else self.held_out(gpu_type, time.time(), accounts)
            if held_out and len(candidates) - held_out < count:
                total = sum(1 for d in self.devices if d.gpu_type == gpu_type)
                raise NoCapacity(
                    f"No {gpu_type} available: {count} requested, {len(candidates)} of {total} "
                    f"free, of which {min(held_out, len(candidates))} held for reservations or "
                    f"lab sessions. {self.describe_free(exclude=gpu_type)}",
                    {s: c["free"] for s, c in self.counts().items()},
                    f"Not enough {gpu_type} cards are free right now: you asked for {count}, "
                    f"{max(len(candidates) - held_out, 0)} of {total} can be used (others are "
                    "held for reservations or lab sessions). "
                    f"{self.describe_free(exclude=gpu_type, plain=True)}",
                )
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
                    f"Not enough {gpu_type} cards are free right now: you asked for {count}, "
                    f"{len(candidates)} of {total} are free{split}. "
                    f"{self.describe_free(exclude=gpu_type, plain=True)}",
                )
            uuids = [d.uuid for d in picked]
        alloc = Allocation(
            alloc_id=uuid.uuid4().hex,
            owner=owner,
            gpu_type=gpu_type,
            uuids=uuids,
            created=time.time(),
            pricing=pricing,
            hold_id=hold.hold_id if hold is not None else None,
        )
        self._state.allocations[owner] = alloc
        self._adopted.add(alloc.alloc_id)
        self._save()
        return alloc

    @_locked
    def allocate_gang(
        self,
        owners: list[str],
        gpu_type: str,
        gpus_per_node: int,
        pricing: str = "on-demand",
        accounts: Iterable[str] = (),
        nodes: Sequence[str] | None = None,
    ) -> list[Allocation]:
        """Cards for a gang: ``gpus_per_node`` cards of ``gpu_type`` on each of ``len(owners)``
        distinct nodes, one allocation per owner (rank order), all or nothing. ``nodes``: the
        nodes a planner chose, taken when they still fit (else any that fit). Raises
        :class:`NoCapacity`, changing nothing, when the gang cannot be placed whole; otherwise
        every record is written in one ledger write. Cards held for others' reservations and
        lab sessions are left alone, as for one server."""
        if not owners or len(set(owners)) != len(owners):
            raise ValueError(f"allocate_gang: owners must be distinct and not empty: {owners}")
        if gpus_per_node < 1:
            raise ValueError(f"allocate_gang: gpus_per_node must be >= 1, not {gpus_per_node}")
        self._drop_expired_reservations()
        want = len(owners)
        held = {u: a for u, a in self.held_uuids().items() if a.owner not in set(owners)}
        candidates = [d for d in self.devices if d.gpu_type == gpu_type and d.uuid not in held]
        held_out = self.held_out(gpu_type, time.time(), accounts)
        by_node = {
            n: g
            for n, g in self._by_node(candidates).items()
            if n is not None and len(g) >= gpus_per_node
        }
        usable = len(candidates) - held_out
        chosen: list[str] = []
        if nodes is not None and len(set(nodes)) == want and all(n in by_node for n in nodes):
            chosen = list(nodes)
        elif len(by_node) >= want:
            # Best fit, as for one server: the nodes with the fewest free cards that still fit.
            chosen = sorted(by_node, key=lambda n: (len(by_node[n]), n))[:want]
        if len(chosen) < want or usable < want * gpus_per_node:
            total = len({d.node for d in self.devices if d.gpu_type == gpu_type})
            why = f"{len(by_node)} of {total} node(s) have {gpus_per_node} free"
            if held_out:
                why += f"; {held_out} free card(s) are held for reservations or lab sessions"
            raise NoCapacity(
                f"No gang of {want} node(s) x {gpus_per_node} {gpu_type}: {why}. "
                f"{self.describe_free(exclude=gpu_type)}",
                {s: c["free"] for s, c in self.counts().items()},
                f"waiting for {want} nodes with {gpus_per_node} x {gpu_type} free each ({why})",
            )
        allocs = []
        for owner, node in zip(owners, chosen, strict=True):
            old = self._state.allocations.get(owner)
            if old is not None:
                self.log.warning("Replacing stale allocation %s of %s", old.alloc_id, owner)
                self._evict(old)
            alloc = Allocation(
                alloc_id=uuid.uuid4().hex,
                owner=owner,
                gpu_type=gpu_type,
                uuids=[d.uuid for d in by_node[node][:gpus_per_node]],
                created=time.time(),
                pricing=pricing,
            )
            self._state.allocations[owner] = alloc
            self._adopted.add(alloc.alloc_id)
            allocs.append(alloc)
        self._save()
        return allocs

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

    @_locked
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

    @_locked
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

    @_locked
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
