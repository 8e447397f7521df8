"""Homes as the hub measured them: a user's usage against their quota, the quota they pay for, and
the operator's list of the largest homes.

- ``GET  /hub/api/users/NAME/storage`` (NAME themself, their server's own token, or an admin):
  the home's usage and quota (``home``), the catalog's free size and price per GB-day, what the
  quota costs a day, a ``notice`` at 80 % (warn) and 95 % (critical), the user's published
  datasets (``datasets_bytes``) and unfinished uploads (``uploads_bytes``: what their pending
  files hold on the node's disk, outside the home), both counted with the home in ``percent``
  and in what the quota costs, and the retention schedule (``release``). With
  ``?quota_gb=X`` it also answers what X would cost a day (``quote``), changing nothing.
- ``POST /hub/api/users/NAME/storage`` ``{"quota_gb": number}``: set the quota, between the free
  size and the operator's ``max_gb``. 400 naming ``quota_gb`` for a value that is not such a
  number, 409 below what the home (and its owner's datasets) holds, 402 when raising it and the
  balance cannot pay one day of the new size. Nothing changes on a refusal. It costs money, so
  it is a POST (JupyterHub's XSRF check for cookie callers) and a server's own token cannot.
- ``GET  /hub/api/storage`` (admins, or ``custom:gpulab:read-storage`` unfiltered: billing meters
  storage from it): every home, largest first, each with its ``datasets_bytes`` and
  ``uploads_bytes`` (billing bills max(quota, used + datasets + uploads) - free).

Only the hub measures (:class:`~gpulab.spawners.storage.homes.HomeStore`, in a thread); nothing a
user's server says is asked. A figure is kept ``StorageAPI.cache_seconds`` and says when it was
measured (``measured_at``), so refreshing a page cannot keep the hub walking a big home.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from decimal import Decimal, InvalidOperation
from typing import Any

from jupyterhub import orm
from jupyterhub.scopes import needs_scope
from tornado import web
from traitlets import Any as AnyTrait
from traitlets import Float
from traitlets.config import SingletonConfigurable

from gpulab.catalog.models import GiB, Storage
from gpulab.catalog.pricing import storage_quote
from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.api.uploads import uploads_of
from gpulab.hub_config.home import GpulabHome, StorageAdminPage
from gpulab.hub_config.overrides.errors import http_error
from gpulab.hub_config.scopes import READ_STORAGE_SCOPE, SET_STORAGE_SCOPE
from gpulab.spawners.storage.homes import HomeStore, HomeUsage, StorageError, home_name

WARN_PERCENT = 80.0
CRITICAL_PERCENT = 95.0
FIELDS = ("quota_gb",)
# The catalog's own limit on a size's decimals (catalog/models.py: Storage).
MAX_DECIMALS = 6


class StorageAPI(SingletonConfigurable):
    """How the hub's storage API measures homes."""

    cache_seconds = Float(
        15.0,
        config=True,
        help="""How long a home's measured usage is reused (seconds) before the hub measures it
        again: refreshing a page, or many pages at once, cannot keep the hub walking a big home.
        Answers say when their figure was measured (``measured_at``). 0 measures every time.""",
    )

    meter_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""An async callable() asking billing to read every home's storage now, or None on a
        hub without billing. The storage API calls it before a quota is lowered (refusing the
        change, 503, when billing cannot be asked) and after any change, so a quota raised and
        lowered between two of billing's periodic reads is still billed for the time it was
        held. gpulab's billing sets it.""",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._usage: dict[str, tuple[float, HomeUsage]] = {}
        self._scan: tuple[float, list[HomeUsage]] | None = None
        self._inflight: dict[str, asyncio.Future] = {}

    def _fresh(self, at: float) -> bool:
        return time.monotonic() - at < self.cache_seconds

    async def _once(self, key: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in a thread; callers asking for the same key meanwhile share its answer."""
        running = self._inflight.get(key)
        if running is None:
            running = asyncio.ensure_future(asyncio.to_thread(fn, *args))
            self._inflight[key] = running
            running.add_done_callback(lambda _f: self._inflight.pop(key, None))
        return await asyncio.shield(running)

    async def usage(self, homes: HomeStore, name: str, fresh: bool = False) -> HomeUsage:
        """The home ``name``'s usage: measured at most ``cache_seconds`` ago (now if ``fresh``)."""
        cached = self._usage.get(name)
        if cached is not None and not fresh and self._fresh(cached[0]):
            return cached[1]
        got = await self._once(f"home:{name}", homes.usage, name)
        self.remember(got)
        return got

    def remember(self, usage: HomeUsage) -> None:
        self._usage[usage.name] = (time.monotonic(), usage)

    def changed(self, usage: HomeUsage) -> None:
        """A quota changed: its figure is the new one, and the next scan measures afresh (billing
        reads the scan right after a change)."""
        self.remember(usage)
        self._scan = None

    async def scan(self, homes: HomeStore) -> list[HomeUsage]:
        """Every home, largest first, measured at most ``cache_seconds`` ago."""
        if self._scan is not None and self._fresh(self._scan[0]):
            return self._scan[1]
        got = await self._once("scan", homes.scan)
        self._scan = (time.monotonic(), got)
        for usage in got:
            self.remember(usage)
        return got


def datasets_bytes(pool: Any, owner: str) -> int:
    """What ``owner``'s published private datasets hold (counted against their quota). Blocking."""
    return pool.datasets.datasets_bytes(owner)


def uploads_bytes(pool: Any, owner: str) -> int:
    """What ``owner``'s unfinished uploads hold on the node's disk (outside their home, counted
    like datasets: bytes parked there are not free storage). Blocking."""
    return uploads_of(pool).held_bytes(home_name(owner))


def release_schedule(app_config: Any, user_name: str) -> dict[str, Any] | None:
    """When ``user_name``'s home is to be released (retention): ``{"at", "days_left"}`` or None.

    None until the user was warned (hub_config/storage_keeper.py decides and remembers)."""
    from gpulab.hub_config.storage_keeper import release_schedule as keeper_schedule

    return keeper_schedule(user_name)


def parse_quota_gb(value: Any) -> Decimal:
    """``quota_gb`` as sent (a JSON number of GB, 2**30 bytes): ValueError saying what is allowed."""
    allowed = "a number of GB such as 100 or 62.5 (at most 6 decimals)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be {allowed}, not {json.dumps(value)[:40]}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be {allowed}, not {value}")
    try:
        gb = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    except InvalidOperation:
        raise ValueError(f"must be {allowed}") from None
    if gb <= 0:
        raise ValueError(f"must be more than 0, not {gb}")
    if -gb.normalize().as_tuple().exponent > MAX_DECIMALS:
        raise ValueError(f"must be {allowed}, not {value!r}")
    return gb


def gb(value_bytes: int) -> str:
    """Bytes as GB for messages: up to 3 decimals, no trailing zeros."""
    text = f"{Decimal(value_bytes) / GiB:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def notice(percent: float, enforced: bool) -> dict[str, str] | None:
    """The plain-words notice a home at ``percent`` of its quota gets, or None below 80 %."""
    if percent >= CRITICAL_PERCENT:
        what = (
            "writes will soon fail with 'No space left on device'"
            if enforced
            else "you are about to pass your quota"
        )
        return {
            "level": "critical",
            "text": f"Your home is {percent:.0f} % full: {what}. Delete files you no longer "
            "need, or raise your quota.",
        }
    if percent >= WARN_PERCENT:
        return {
            "level": "warn",
            "text": f"Your home is {percent:.0f} % full. Delete files you no longer need, or "
            "raise your quota before it fills up.",
        }
    return None


def money(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.0001")))


def quote_json(storage: Storage, quota_bytes: int, held_bytes: int) -> dict[str, Any]:
    q = storage_quote(storage, quota_bytes, held_bytes)
    return {
        "quota_gb": gb(quota_bytes),
        "quota_bytes": quota_bytes,
        "billable_bytes": q.billable_bytes,
        "per_day": money(q.per_day),
    }


class _StorageHandler(GpulabAPIHandler):
    @property
    def homes(self) -> HomeStore:
        return self.pool.homes

    @property
    def api(self) -> StorageAPI:
        return StorageAPI.instance(config=self.settings["config"])

    async def header(self) -> dict[str, Any]:
        catalog = self.pool.catalog
        s = catalog.storage
        # The store may probe its backend (a loop mount) the first time it is asked: a thread.
        backend = await asyncio.to_thread(lambda: self.homes.backend)
        return {
            "enforced": backend == "image",
            "backend": backend,
            "free_gb": str(s.free_gb),
            "max_gb": str(s.max_gb),
            "price_per_gb_day": str(s.price_per_gb_day),
            "currency": catalog.currency,
        }

    def bytes_asked(self, value: Any) -> tuple[Decimal, int]:
        """``quota_gb`` as sent, in GB and bytes, within this hub's free size and limit (the
        POST and the GET's price ask the same): a 400 naming ``quota_gb`` otherwise."""
        storage = self.pool.catalog.storage
        try:
            wanted = parse_quota_gb(value)
        except ValueError as e:
            raise self.refuse(400, str(e)) from None
        quota = storage.bytes_of(wanted)
        if not storage.free_bytes <= quota <= storage.max_bytes:
            raise self.refuse(
                400,
                f"must be between {storage.free_gb} (free) and {storage.max_gb} (this hub's "
                f"limit) GB, not {wanted}",
            )
        return wanted, quota

    def refuse(self, status: int, message: str, human: str = "") -> web.HTTPError:
        error = http_error(status, f"quota_gb: {message}", field="quota_gb")
        error.human = human or message[:1].upper() + message[1:]  # type: ignore[attr-defined]
        return error


class UserStorageHandler(_StorageHandler):
    def user_or_404(self, user_name: str) -> Any:
        user = self.find_user(user_name)
        if user is None:
            raise web.HTTPError(404, f"No such user: {user_name}")
        return user

    async def view(self, user: Any, usage: HomeUsage) -> dict[str, Any]:
        name = home_name(user.name)
        held = await asyncio.to_thread(datasets_bytes, self.pool, user.name)
        pending = await asyncio.to_thread(uploads_bytes, self.pool, user.name)
        storage = self.pool.catalog.storage
        # The quota counts the home, its owner's published datasets and unfinished uploads.
        total = usage.used_bytes + held + pending
        percent = 100.0 * total / usage.quota_bytes if usage.quota_bytes else 0
        return {
            **(await self.header()),
            "user": user.name,
            "home": {**usage.as_json(), "name": name},
            "datasets_bytes": held,
            "uploads_bytes": pending,
            "percent": round(percent, 2),
            "notice": notice(percent, usage.enforced),
            "cost": quote_json(storage, usage.quota_bytes, total),
            "release": release_schedule(self.settings["config"], user.name),
        }

    @needs_scope(READ_STORAGE_SCOPE, "admin:users")
    async def get(self, user_name: str) -> None:
        user = self.user_or_404(user_name)
        asked = self.get_argument("quota_gb", None)
        usage = await self.api.usage(self.homes, home_name(user.name))
        out = await self.view(user, usage)
        if asked is not None:
            try:
                value = json.loads(asked)
            except ValueError:
                value = asked
            quota = self.bytes_asked(value)[1]
            held = usage.used_bytes + out["datasets_bytes"] + out["uploads_bytes"]
            out["quote"] = quote_json(self.pool.catalog.storage, quota, held)
        self.write(json.dumps(out))

    @needs_scope(SET_STORAGE_SCOPE, "admin:users")
    async def post(self, user_name: str) -> None:
        user = self.user_or_404(user_name)
        body = self.json_object_body()
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            error = http_error(
                400, f"{unknown[0]}: unknown field; allowed: quota_gb", field=unknown[0]
            )
            raise error
        if "quota_gb" not in body:
            raise self.refuse(400, "required: the new quota in GB")
        wanted, quota = self.bytes_asked(body["quota_gb"])
        storage = self.pool.catalog.storage
        name = home_name(user.name)
        # What it holds now, measured now: a cached figure could be older than the last write.
        now = await self.api.usage(self.homes, name, fresh=True)
        held = await asyncio.to_thread(datasets_bytes, self.pool, user.name)
        if quota < now.used_bytes + held:
            raise self.refuse(
                409,
                f"your home and datasets hold {gb(now.used_bytes + held)} GB, more than "
                f"{wanted} GB: delete files first, or choose a larger quota",
            )
        new_cost = storage_quote(storage, quota, now.used_bytes + held).per_day
        if quota > now.quota_bytes and new_cost > 0:
            await self.check_balance(user.name, wanted, new_cost)
        meter = self.api.meter_hook
        if meter is not None and quota < now.quota_bytes:
            # The time at the old, larger quota is read by billing before it ends.
            try:
                await meter()
            except Exception as e:
                self.log.warning("Quota of %s not lowered: billing not asked: %s", user.name, e)
                raise http_error(
                    503,
                    "Billing is unavailable right now, so the quota cannot be changed; try "
                    "again in a minute.",
                ) from None
        try:
            done = await asyncio.to_thread(self.homes.set_quota, name, quota)
        except StorageError as e:
            error = http_error(e.status, str(e), field=e.field)
            raise error from None
        self.api.changed(done)
        if meter is not None:
            try:
                await meter()
            except Exception as e:  # the change stands; billing's next periodic read sees it
                self.log.warning("Billing not told of %s's new quota: %s", user.name, e)
        self.log.info("Quota of %s set to %s GB by %s", user.name, wanted, self.current_user.name)
        self.write(json.dumps(await self.view(user, done)))

    async def check_balance(self, user_name: str, wanted: Decimal, per_day: Decimal) -> None:
        """402 when billing says the balance cannot pay one day of the new size (503 when billing
        cannot be asked); nothing to check on a hub without billing."""
        hook = GpulabHome.instance(config=self.settings["config"]).balance_hook
        if hook is None:
            return
        cur = self.pool.catalog.currency
        try:
            info = await hook(user_name)
            balance = Decimal(info["balance"]["exact"])
        except Exception as e:
            self.log.warning("Quota change of %s refused: billing not asked: %s", user_name, e)
            raise http_error(
                503,
                "Billing is unavailable right now, so the quota cannot be raised; try again in "
                "a minute.",
            ) from None
        if balance < per_day:
            raise self.refuse(
                402,
                f"your balance ({cur} {balance:.2f}) cannot pay one day of {wanted} GB "
                f"({cur} {per_day:.2f} a day above the free {self.pool.catalog.storage.free_gb} "
                "GB); top up, or choose a smaller quota",
            )


class StorageListHandler(_StorageHandler):
    @needs_scope(READ_STORAGE_SCOPE, "admin:users")
    async def get(self) -> None:
        homes = await self.api.scan(self.homes)
        users = {home_name(n): n for (n,) in self.db.query(orm.User.name)}
        owners = [users.get(u.name) for u in homes]
        # One thread for every home's datasets (a thousand homes are a thousand manifests' sums).
        held = await asyncio.to_thread(
            lambda: [
                (datasets_bytes(self.pool, o), uploads_bytes(self.pool, o)) if o else (0, 0)
                for o in owners
            ]
        )
        rows = [
            {
                "user": owner,
                **usage.as_json(),
                "datasets_bytes": h[0],
                "uploads_bytes": h[1],
                # The retention schedule once the user was warned (hub_config/storage_keeper.py).
                "release": release_schedule(self.settings["config"], owner) if owner else None,
            }
            for owner, usage, h in zip(owners, homes, held, strict=True)
        ]
        header = await self.header()
        header.pop("max_gb")
        measured = min((u.measured_at for u in homes), default=time.time())
        self.write(json.dumps({**header, "measured_at": measured, "homes": rows}))


ROUTES = [
    (r"/api/users/([^/]+)/storage", UserStorageHandler),
    (r"/api/storage", StorageListHandler),
    (r"/gpulab/storage/?", StorageAdminPage),
]
