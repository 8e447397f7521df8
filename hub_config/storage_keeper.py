"""Homes kept and released on a schedule (issue 23): a home whose user has run nothing for the
catalog's ``storage.keep_days`` is released (deleted through the home store), and only after
every warning of ``storage.warn_days`` was given, each at least its days before.

Why a keeper of its own: "last used" must rest on what the hub itself saw, not on what a user's
server says. JupyterHub's ``last_activity`` moves whenever a server's (or a user's) token calls the
hub, so a user could keep a home forever by pinging; the keeper instead looks at the hub's own
state each round (a server running, starting, stopping or recorded in the database, a spot bid
queued, cards held) and keeps its own durable record, ``DATA_DIR/storage/keeper.json``, written
atomically: per home the last time it saw the user run something and the warnings it gave. A home
it sees for the first time starts its clock then (an upgrade releases nothing early).

Two parts:

- :func:`decide`, pure: ``Keep | Warn | Release`` from the record, the clock and whether the user
  runs something; :func:`observe` moves a record on (running resets the clock and the warnings).
- :class:`StorageKeeper`, a thin jittered loop in the hub (:mod:`.plugin` starts it once the hub
  answers, so restored servers count as running): warnings go to the user's notices
  (:mod:`.billing.notices`; JupyterLab shows them) and to the storage API's ``release`` field
  (:func:`release_schedule`), then the home is released by :meth:`HomeStore.release`, which moves
  it aside in one rename before deleting it, so a crash mid-release never leaves a half-deleted
  home and never deletes a home a server started with afterwards. The activity check runs on the
  event loop right before each release.

A warning is posted before the record says it was given: a crash between the two repeats it at
the next round rather than losing it, so no home is released unwarned.

Private datasets (``DATA_DIR/user-datasets/OWNER/``): a release deletes those of the user shared
with nobody; those shared with a course or other users stay (others rely on them; they stay
counted against the owner's quota, and their owner or an admin deletes them).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from traitlets import Float, Unicode
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.billing.notices import notices_for
from gpulab.spawners.storage.homes import home_name

DAY = 86400.0
STATE_FILE = Path("storage") / "keeper.json"
NOTICE_KIND = "storage-release"
KEEP_RELEASED = 50  # releases remembered for the admins' view


# ---- the pure rule ---------------------------------------------------------------------------


@dataclass
class Record:
    """What the keeper knows of one home: when its user last ran something, which warnings
    (days before release) were given and when (keeper's clock)."""

    last_used: float
    warned: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"last_used": self.last_used, "warned": {str(d): t for d, t in self.warned.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        warned = {int(d): float(t) for d, t in (data.get("warned") or {}).items()}
        return cls(float(data["last_used"]), warned)


@dataclass(frozen=True)
class Keep:
    """Nothing to do now; ``at`` is when the home is due for release (None while in use)."""

    at: float | None


@dataclass(frozen=True)
class Warn:
    """Give the warning of ``days`` now: the home is released at ``at``, in ``days_left`` days."""

    days: int
    at: float
    days_left: int


@dataclass(frozen=True)
class Release:
    """Release the home now (it was due at ``at``)."""

    at: float


Decision = Keep | Warn | Release


def release_at(record: Record, keep_days: float) -> float:
    """When the home is released: ``keep_days`` after its last use, and never sooner than each
    warning's days after that warning was given (a late warning pushes the release)."""
    at = record.last_used + keep_days * DAY
    for days, given in record.warned.items():
        at = max(at, given + days * DAY)
    return at


def observe(record: Record | None, active: bool, now: float) -> Record:
    """The record moved on to ``now``: a user running something resets the clock and the
    warnings; a home seen for the first time starts its clock now."""
    if active or record is None:
        return Record(last_used=now)
    return record


def decide(
    now: float, record: Record, *, active: bool, keep_days: float, warn_days: Iterable[int]
) -> Decision:
    """Keep, warn or release a home. Never releases while the user runs anything, nor before
    every warning of ``warn_days`` was given at least its days before; the largest warning not
    yet given comes first, one per call."""
    if active:
        return Keep(None)
    at = release_at(record, keep_days)
    for days in sorted(set(warn_days), reverse=True):
        if days in record.warned:
            continue
        if now < at - days * DAY:
            return Keep(at)  # smaller warnings are due even later
        at = max(at, now + days * DAY)
        return Warn(days=days, at=at, days_left=math.ceil((at - now) / DAY - 1e-9))
    return Release(at) if now >= at else Keep(at)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def n_days(n: int) -> str:
    return f"{n} day" if n == 1 else f"{n} days"


def warning_text(now: float, decision: Warn, record: Record) -> str:
    idle = max(0, int((now - record.last_used) // DAY))
    return (
        f"Your home and its files will be deleted on {day_of(decision.at)} (UTC), in "
        f"{n_days(decision.days_left)}: none of your servers has run for {n_days(idle)}. Start any "
        "server (a no-GPU one is enough) before then to keep it, or download what you need. "
        "Your private datasets go with it, except those shared with others."
    )


# ---- the loop --------------------------------------------------------------------------------


class StorageKeeper(SingletonConfigurable):
    """Releases the homes of users who no longer run anything, after warning them."""

    interval = Float(
        300.0,
        config=True,
        help="""Seconds between the keeper's rounds (with 10% jitter). Each round notes who runs
        something (which resets their home's clock), gives the warnings due and releases the
        homes due. A server that lives less than a round may go unnoticed; warnings are days
        apart, so a few minutes is plenty.""",
    )
    clock_offset_file = Unicode(
        "",
        config=True,
        help="""For tests and drills only: a file holding a number of seconds added to the
        keeper's clock (read every round), so a test can move the keeper days ahead without
        waiting. Empty (the default): the real clock. Keep it somewhere only root can write.""",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._task: asyncio.Task | None = None
        self.records: dict[str, Record] = {}
        self.owners: dict[str, str] = {}  # home name -> user name
        self.released: list[dict[str, Any]] = []
        self.looked_at: float | None = None  # keeper's clock at the end of the last round
        self.rounds = 0
        self.pool: Any = None
        self.keep_days = 90.0
        self.warn_days: tuple[int, ...] = ()

    # ---- clock and state ---------------------------------------------------------------------

    def now(self) -> float:
        """The keeper's clock: the real one plus the test offset, if configured. Blocking (a
        file read when an offset file is configured)."""
        offset = 0.0
        if self.clock_offset_file:
            try:
                offset = float(Path(self.clock_offset_file).read_text().strip() or 0)
            except (OSError, ValueError) as e:
                self.log.warning("StorageKeeper.clock_offset_file unreadable: %s", e)
        return time.time() + offset

    def state_path(self) -> Path:
        return Path(self.pool.data_dir) / STATE_FILE

    def load(self) -> None:
        try:
            data = json.loads(self.state_path().read_text())
        except FileNotFoundError:
            return
        except ValueError:
            self.log.error("%s is not JSON: starting every home's clock anew", self.state_path())
            return
        self.records = {n: Record.from_json(r) for n, r in data.get("homes", {}).items()}
        self.owners = dict(data.get("owners", {}))
        self.released = list(data.get("released", []))

    def save(self) -> None:
        """Write the state atomically (temporary file, fsync, rename, fsync of the folder)."""
        path = self.state_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "homes": {n: r.to_json() for n, r in sorted(self.records.items())},
            "owners": self.owners,
            "released": self.released[-KEEP_RELEASED:],
            "looked_at": self.looked_at,
        }
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # ---- what the hub itself sees --------------------------------------------------------------

    def active_owners(self, app: Any, market: Any = None) -> set[str]:
        """Home names of users who run something now, as the hub knows it (not as any server
        says): a server active (running, starting, stopping) or recorded in the hub's database,
        cards held by the allocator, a spot request queued. Runs on the event loop."""
        users: set[str] = set()
        for user in list(app.users.values()):
            for spawner in list(user.spawners.values()):
                orm = getattr(spawner, "orm_spawner", None)
                if spawner.active or (orm is not None and orm.server is not None):
                    users.add(user.name)
        if self.pool is not None:
            users.update(a.owner.partition("/")[0] for a in self.pool.allocator.allocations)
        if market is not None:
            users.update(owner.partition("/")[0] for owner in list(market.queue))
        return {home_name(u) for u in users}

    def user_names(self, app: Any) -> dict[str, str]:
        from jupyterhub import orm

        return {home_name(name): name for (name,) in app.db.query(orm.User.name)}

    # ---- the loop ----------------------------------------------------------------------------

    def start(self, app: Any, pool: Any, market: Any = None, after: Any = None) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run(app, pool, market, after))

    async def _run(self, app: Any, pool: Any, market: Any, after: Any) -> None:
        self.pool = pool
        await asyncio.to_thread(self.load)
        if after is not None:
            await after
        while True:
            try:
                await self.tick(app, market)
            except Exception:
                self.log.exception("The storage keeper's round failed")
            await asyncio.sleep(self.interval * random.uniform(0.9, 1.1))

    async def tick(self, app: Any, market: Any = None) -> None:
        """One round: note who runs something, warn, release."""
        homes = self.pool.homes
        storage = self.pool.catalog.storage
        self.keep_days, self.warn_days = float(storage.keep_days), tuple(storage.warn_days)
        now = await asyncio.to_thread(self.now)
        names = await asyncio.to_thread(homes.names)
        await asyncio.to_thread(homes.purge_released)
        self.owners.update(self.user_names(app))
        self.owners = {n: u for n, u in self.owners.items() if n in names}
        notices = notices_for(self.pool.data_dir)
        active = self.active_owners(app, market)
        for gone in set(self.records) - set(names):
            del self.records[gone]
        for name in names:
            before = self.records.get(name)
            record = self.records[name] = observe(before, name in active, now)
            if before is not None and before.warned and name in active:
                # A warned user ran a server: say the warning no longer holds (JupyterLab shows
                # the notices it has not shown yet, the warning among them).
                text = (
                    "Your home is kept: a server of yours ran, so the deletion you were warned "
                    "of is cancelled."
                )
                await asyncio.to_thread(
                    notices.add, self.owners.get(name, name), NOTICE_KIND, text, at=time.time()
                )
            decision = decide(
                now,
                record,
                active=name in active,
                keep_days=self.keep_days,
                warn_days=self.warn_days,
            )
            user = self.owners.get(name, name)
            if isinstance(decision, Warn):
                text = warning_text(now, decision, record)
                # Posted before it is recorded: a crash in between repeats it, never loses it.
                await asyncio.to_thread(notices.add, user, NOTICE_KIND, text, at=time.time())
                record.warned[decision.days] = now
                await asyncio.to_thread(self.save)
                self.log.info("Storage: warned %s (%d days): %s", user, decision.days, text)
            elif isinstance(decision, Release):
                # The hub's own state, looked at again right before (no await in between).
                if name in self.active_owners(app, market):
                    continue
                await self._release(name, user, record, now, notices)
        self.looked_at = now
        self.rounds += 1
        await asyncio.to_thread(self.save)

    async def _release(self, name: str, user: str, record: Record, now: float, notices) -> None:
        self.log.warning(
            "Storage: releasing the home of %s (last used %s, warned %s)",
            user,
            iso(record.last_used),
            {d: iso(t) for d, t in sorted(record.warned.items())},
        )
        try:
            had = await asyncio.to_thread(self.pool.homes.release, name)
        except (OSError, ValueError) as e:  # StorageError: an image still held (409)
            self.log.error("Storage: releasing the home of %s failed: %s", user, e)
            if name in await asyncio.to_thread(self.pool.homes.names):
                return  # not moved aside: the home stays, and the next round tries again
            had = True  # moved aside (HomeStore.release renames first): later rounds finish it
        self.records.pop(name, None)
        dropped = await asyncio.to_thread(self.release_datasets, user)
        if had:
            self.released.append({"name": name, "user": user, "at": now, "datasets": dropped})
            idle = int((now - record.last_used) // DAY)
            text = (
                f"Your home was deleted on {day_of(now)} (UTC): none of your servers had run for "
                f"{n_days(idle)}. Your next server starts with an empty home."
            )
            await asyncio.to_thread(notices.add, user, NOTICE_KIND, text, at=time.time())
        await asyncio.to_thread(self.save)

    def release_datasets(self, user: str) -> list[str]:
        """The user's private datasets shared with nobody go with the home; shared ones stay
        (a course or other users rely on them). Blocking."""
        store = getattr(self.pool, "datasets", None)
        if store is None:
            return []
        dropped = []
        for m in store.owned_by(user):
            if not m.users and not m.courses:
                try:
                    if store.delete(user, m.name):
                        dropped.append(m.slug)
                except OSError as e:
                    self.log.error("Storage: deleting dataset %s failed: %s", m.slug, e)
        return dropped

    # ---- what others read ----------------------------------------------------------------------

    def schedule(self, name: str, now: float | None = None) -> dict[str, Any] | None:
        """The release of home ``name`` once its user was warned, else None. Non-blocking."""
        record = self.records.get(name)
        if record is None or not record.warned:
            return None
        at = release_at(record, self.keep_days)
        now = self.looked_at if now is None else now
        days_left = max(0, math.ceil((at - (now or at)) / DAY - 1e-9))
        return {
            "at": iso(at),
            "days_left": days_left,
            "warned": sorted(record.warned, reverse=True),
        }

    def overview(self) -> dict[str, Any]:
        """Every home's schedule for admins, soonest release first. Non-blocking."""
        homes = []
        for name, record in self.records.items():
            at = release_at(record, self.keep_days)
            homes.append(
                {
                    "name": name,
                    "user": self.owners.get(name, name),
                    "last_used": iso(record.last_used),
                    "release_at": iso(at),
                    "warned": {str(d): iso(t) for d, t in sorted(record.warned.items())},
                }
            )
        homes.sort(key=lambda h: h["release_at"])
        return {
            "keep_days": self.keep_days,
            "warn_days": list(self.warn_days),
            "looked_at": iso(self.looked_at) if self.looked_at is not None else None,
            "rounds": self.rounds,
            "homes": homes,
            "released": [{**r, "at": iso(r["at"])} for r in self.released[-KEEP_RELEASED:]],
        }


def release_schedule(user_name: str) -> dict[str, Any] | None:
    """The storage API's ``release`` field for ``user_name``: ``{"at": ISO-8601 UTC,
    "days_left": int, "warned": [days...]}`` once they were warned that their home will be
    released, else None. Non-blocking."""
    if not StorageKeeper.initialized():
        return None
    return StorageKeeper.instance().schedule(home_name(user_name))
