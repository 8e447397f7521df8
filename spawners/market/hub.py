"""The spot market inside the hub: prices every few seconds, the queue, and preemptions.

Runs on the hub's event loop next to the allocator (whose mutations are synchronous there too, so
the market and spawns never interleave inside one decision). The matching itself is the pure
:func:`gpulab.spawners.market.decide`; this module feeds it from the allocator and carries out
what it decides:

- starting a queued request: its cards are reserved in the allocator for the owner, then the
  server is started through the hub's own REST API with the ``gpulab-market`` service token;
- preempting: SIGUSR1 to the server's opted-in processes, a signed webhook, the user's checkpoint
  command, and at the deadline a normal stop through the REST API (billing closes there);
- cancelling a preemption when the price falls back under the bid before the deadline.

State that must survive a hub crash lives in ``DATA_DIR/spot/``: the price history (append-only,
fsynced), the queue and bids (``state.json``), preemption records (``preemptions.jsonl``) and
per-user settings with webhook secrets (``settings.json``, mode 0600).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import random
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from traitlets import Bool, Float, Instance, List, Unicode, default, validate
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.catalog.price_history import history_for, market_dir
from gpulab.spawners.market.core import (
    Order,
    Schedule,
    TypeBook,
    decide,
    spot_price,
    utilization,
)
from gpulab.spawners.market.preemption import Preemption, checkpoint_state, send_webhook
from gpulab.spawners.market.store import (
    append_jsonl,
    read_json,
    read_jsonl,
    write_json_atomic,
)
from gpulab.spawners.node.allocator import RESERVED, NoCapacity
from gpulab.spawners.node.pool import GpuPool


class MarketAnswer(Exception):
    """A spawn that the market does not start now. ``status`` 202: queued; 409: refused."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SpotMarket(SingletonConfigurable):
    """Spot prices, bids, the wait queue and preemptions for this node's GPU pool."""

    timezone = Unicode(
        "",
        config=True,
        help="""The operator's time zone for the low-price windows (an IANA name such as
        'Asia/Shanghai'). Empty: the hub machine's local time zone.""",
    )

    low_price_windows = List(
        Unicode(),
        ["18:00-09:00"],
        config=True,
        help="""Daily low-price windows as 'HH:MM-HH:MM' (or 'HH:MM:SS-HH:MM:SS') in
        `timezone`; a window may cross midnight. Window-only spot requests run only inside
        them and are reclaimed, after the warning, when their window ends.""",
    )

    weekends_low = Bool(
        True, config=True, help="Whether Saturdays and Sundays are low-price all day."
    )

    window_factor = Unicode(
        "0.5",
        config=True,
        help="""Inside a low-price window the premium above the spot floor is multiplied by
        this factor (a decimal between 0 and 1).""",
    )

    tick_interval = Float(
        5.0,
        config=True,
        help="""Seconds between market ticks (price recomputation, matching, preemption
        checks); at most 10. A random jitter of up to 10% is added.""",
    )

    warning_seconds = Float(
        300.0,
        config=True,
        help="""Seconds between the preemption warning (SIGUSR1, webhook, checkpoint command)
        and the stop of a reclaimed spot server.""",
    )

    save_interval = Float(
        900.0,
        config=True,
        help="""Seconds between saves of a spot server's open documents with unsaved changes,
        done by the JupyterLab extension while the server runs on spot (besides the save at a
        preemption warning). 0 turns the periodic save off.""",
    )

    checkpoint_timeout = Float(
        240.0,
        config=True,
        help="Seconds a user's checkpoint command may run before it is killed.",
    )

    reservation_ttl = Float(
        120.0,
        config=True,
        help="Seconds the cards matched to a queued request stay reserved for its start.",
    )

    hub_api_url = Unicode(
        "",
        config=True,
        help="""The hub's REST API as seen from the hub, e.g. http://127.0.0.1:8081/hub/api.
        The market starts queued servers and stops reclaimed ones through it.""",
    )

    api_token = Unicode(
        "",
        config=True,
        help="""API token of the `gpulab-market` service (needs admin:servers). Without it the
        market cannot start queued servers or stop reclaimed ones.""",
    )

    pool = Instance(GpuPool)

    @default("pool")
    def _default_pool(self) -> GpuPool:
        return GpuPool.instance(config=self.config)

    @validate("tick_interval")
    def _check_tick(self, proposal: dict) -> float:
        if not 0 < proposal["value"] <= 10:
            raise ValueError(f"tick_interval must be in (0, 10] seconds, not {proposal['value']}")
        return proposal["value"]

    @validate("save_interval")
    def _check_save_interval(self, proposal: dict) -> float:
        if proposal["value"] < 0:
            raise ValueError(f"save_interval must be >= 0 seconds, not {proposal['value']}")
        return proposal["value"]

    @validate("window_factor")
    def _check_factor(self, proposal: dict) -> str:
        try:
            value = Decimal(proposal["value"])
        except InvalidOperation:
            value = Decimal(-1)
        if not 0 <= value <= 1:
            raise ValueError(
                f"window_factor must be a decimal in [0, 1], not {proposal['value']!r}"
            )
        return proposal["value"]

    @validate("timezone")
    def _check_timezone(self, proposal: dict) -> str:
        if proposal["value"]:
            try:
                ZoneInfo(proposal["value"])
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(
                    f"timezone {proposal['value']!r} is not a known IANA time zone"
                ) from None
        return proposal["value"]

    @validate("low_price_windows")
    def _check_windows(self, proposal: dict) -> list[str]:
        Schedule.parse(proposal["value"])
        return proposal["value"]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dir = market_dir(self.pool.data_dir)
        self.history = history_for(self.pool.data_dir)
        self.schedule = Schedule.parse(self.low_price_windows, self.weekends_low)
        self.books: dict[str, TypeBook] = {slug: TypeBook() for slug in self.pool.catalog.gpu_types}
        self.queue: dict[str, dict[str, Any]] = {}  # owner -> {id, options, order}
        self.bids: dict[str, Order] = {}  # owner -> the order of a running spot server
        self.pins: dict[str, Decimal] = {}
        self.preemptions: dict[str, Preemption] = {}
        self.active: dict[str, str] = {}  # owner -> id of its preemption in its warning period
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Preemption id -> set once its warning webhook went out (or there was none to send).
        self._warnings: dict[str, asyncio.Event] = {}
        self._spawners: dict[str, Any] = {}
        # owner -> the hub's spawner of that server, or None; set by the hub's plugin (the market
        # sees only spawners that asked it for admission until then).
        self.find_spawner: Callable[[str], Any] = lambda owner: None
        self._task: asyncio.Task | None = None
        self.last_tick_seconds: float | None = None
        self._load()

    # ---- persistence -------------------------------------------------------------------------

    def _load(self) -> None:
        state = read_json(self.dir / "state.json", {})
        self.pins = {k: Decimal(v) for k, v in state.get("pins", {}).items()}
        for rec in state.get("bids", []):
            order = _order_from_json(rec)
            self.bids[order.owner] = order
        for entry in state.get("queue", []):
            order = _order_from_json(entry["order"])
            if order.gpu_type in self.books:
                self.queue[order.owner] = {**entry, "order": order}
                self.books[order.gpu_type].add_queued(order)
        for rec in read_jsonl(self.dir / "preemptions.jsonl"):
            p = Preemption(**rec)
            self.preemptions[p.id] = p
        for p in self.preemptions.values():
            if p.status == "warning":
                self.active[p.owner] = p.id

    def _save_state(self) -> None:
        write_json_atomic(
            self.dir / "state.json",
            {
                "pins": {k: str(v) for k, v in self.pins.items()},
                "bids": [_order_to_json(o) for o in self.bids.values()],
                "queue": [
                    {**entry, "order": _order_to_json(entry["order"])}
                    for entry in self.queue.values()
                ],
            },
        )

    def _save_preemption(self, p: Preemption) -> None:
        self.preemptions[p.id] = p
        append_jsonl(self.dir / "preemptions.jsonl", p.model_dump())

    # ---- settings (webhook, checkpoint command) ----------------------------------------------

    def user_settings(self, user: str, create_secret: bool = True) -> dict[str, Any]:
        all_settings = read_json(self.dir / "settings.json", {})
        mine = all_settings.get(user, {})
        if create_secret and not mine.get("webhook_secret"):
            mine["webhook_secret"] = secrets.token_hex(32)
            all_settings[user] = mine
            write_json_atomic(self.dir / "settings.json", all_settings)
        return {"webhook_url": None, "checkpoint_command": None, **mine}

    def update_settings(self, user: str, changes: dict[str, Any]) -> dict[str, Any]:
        all_settings = read_json(self.dir / "settings.json", {})
        mine = {**self.user_settings(user), **changes}
        all_settings[user] = mine
        write_json_atomic(self.dir / "settings.json", all_settings)
        return mine

    # ---- prices ------------------------------------------------------------------------------

    def local_now(self, t: float) -> datetime:
        tz = ZoneInfo(self.timezone) if self.timezone else None
        return datetime.fromtimestamp(t, tz) if tz else datetime.fromtimestamp(t).astimezone()

    def in_low_window(self, t: float | None = None) -> bool:
        return self.schedule.is_low(self.local_now(time.time() if t is None else t))

    def compute_price(self, slug: str, t: float) -> Decimal:
        gt = self.pool.catalog.gpu_types[slug]
        if slug in self.pins:
            return self.pins[slug]
        c = self.pool.allocator.counts().get(slug, {"total": 0, "free": 0})
        u = utilization(c["total"], c["free"], self.books[slug].queued_cards)
        return spot_price(
            gt.spot_floor_price,
            gt.on_demand_price,
            u,
            self.in_low_window(t),
            window_factor=Decimal(self.window_factor),
        )

    def current_price(self, slug: str) -> Decimal:
        price = self.history.latest(slug)
        if price is None:
            price = self.compute_price(slug, time.time())
            self.history.record(slug, time.time(), price)
        return price

    def pin(self, slug: str, price: Decimal | None) -> None:
        """Fix a type's spot price (operator decision), or with None return it to the market."""
        if price is None:
            self.pins.pop(slug, None)
        else:
            self.pins[slug] = price
        self._save_state()
        self.tick_type(slug)

    def prices_json(self, hours: float) -> dict[str, Any]:
        now = time.time()
        since = now - hours * 3600
        types = []
        counts = self.pool.allocator.counts()
        for slug, gt in self.pool.catalog.gpu_types.items():
            c = counts.get(slug)
            if not c:
                continue
            types.append(
                {
                    "slug": slug,
                    "display_name": gt.display_name,
                    "price": str(self.current_price(slug)),
                    "spot_floor_price": str(gt.spot_floor_price),
                    "on_demand_price": str(gt.on_demand_price),
                    "pinned": slug in self.pins,
                    "total": c["total"],
                    "free": c["free"],
                    "queued": len(self.books[slug].orders) - len(self.books[slug].running),
                    "history": self.history.changes(slug, since),
                }
            )
        return {
            "currency": self.pool.catalog.currency,
            "time": now,
            "low_price_window": self.in_low_window(now),
            "timezone": self.timezone or str(self.local_now(now).tzinfo),
            "low_price_windows": list(self.low_price_windows),
            "weekends_low": self.weekends_low,
            "warning_seconds": self.warning_seconds,
            "tick_interval": self.tick_interval,
            "last_tick_ms": None
            if self.last_tick_seconds is None
            else round(self.last_tick_seconds * 1e3, 3),
            "gpu_types": types,
        }

    # ---- the loop ----------------------------------------------------------------------------

    def start(self, after: Awaitable[Any] | None = None) -> None:
        """Start the periodic tick (idempotent; needs a running event loop). The first tick waits
        for ``after`` (the hub answering on its API, so that restored servers are known)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(after))

    async def _loop(self, after: Awaitable[Any] | None) -> None:
        if after is not None:
            await after
        for p in list(self.preemptions.values()):
            if p.status == "warning":
                self._schedule_deadline(p)
        while True:
            try:
                self.tick()
            except Exception:
                self.log.exception("Spot market tick failed")
            await asyncio.sleep(self.tick_interval * (1 + random.uniform(0, 0.1)))

    def tick(self) -> None:
        t0 = time.perf_counter()
        self._sync_running()
        for slug in self.books:
            self.tick_type(slug)
        self.last_tick_seconds = time.perf_counter() - t0

    def tick_type(self, slug: str) -> None:
        now = time.time()
        c = self.pool.allocator.counts().get(slug)
        if not c:
            return
        price = self.compute_price(slug, now)
        if self.history.record(slug, now, price):
            self.log.info("Spot price of %s is now %s", slug, price)
        low = self.in_low_window(now)
        d = decide(self.books[slug], c["free"], price, low)
        for owner in d.cancel:
            self._cancel(owner, price)
        for owner, reason in d.preempt:
            self._preempt(owner, reason, price)
        for order in d.starts:
            self._start_queued(order)

    def _sync_running(self) -> None:
        """Bring the books in line with the allocator: spot servers that started or stopped."""
        spot = {
            a.owner: a
            for a in self.pool.allocator.allocations
            if a.pricing == "spot" and a.gpu_type in self.books and not a.owner.endswith(RESERVED)
        }
        changed = False
        for book in self.books.values():
            for _, _, owner in list(book.running):
                if owner not in spot:
                    book.remove(owner)
                    self.bids.pop(owner, None)
                    changed = True
                    self._server_gone(owner)
        for owner, alloc in spot.items():
            book = self.books[alloc.gpu_type]
            if book.is_running(owner):
                continue
            if owner in book.orders:
                book.remove(owner)
            order = self.bids.get(owner)
            if order is None or order.gpu_type != alloc.gpu_type:
                # Started before the market knew its bid (a restart without state): it bid the
                # on-demand price, the default, so only on-demand demand reclaims it.
                order = Order(
                    owner,
                    alloc.gpu_type,
                    len(alloc.uuids),
                    "spot",
                    self.pool.catalog.gpu_types[alloc.gpu_type].on_demand_price,
                    False,
                    alloc.created,
                )
                self.bids[owner] = order
            book.add_running(order)
            if owner in self.active:
                book.preempting[owner] = self.preemptions[self.active[owner]].reason
            changed = True
        if changed:
            self._save_state()

    # ---- admission (called by the spawner before it allocates) -------------------------------

    def admit(self, spawner: Any, options: Any) -> None:
        """Decide whether a spawn may allocate now. Raises :class:`MarketAnswer` otherwise.

        Spot: a card of the type must be free, the price at most the bid, the low-price window
        open for window-only requests, and no on-demand request waiting for that type. A request
        that asks to wait (or is window-only) is queued instead of refused. On-demand: when no
        card is free but spot servers hold the type, the lowest bid is reclaimed and the request
        queued until its card frees.
        """
        owner = spawner.owner
        self._spawners[owner] = spawner
        slug = options.gpu_type
        if slug is None or slug not in self.books:
            return
        book = self.books[slug]
        if owner in self.queue:  # a new request replaces a queued one
            self._dequeue(owner)
        reserved = self.pool.allocator.get(owner + RESERVED)
        if (
            reserved is not None
            and reserved.gpu_type == slug
            and len(reserved.uuids) == options.gpus
            and (reserved.expires or 0) > time.time()
        ):
            # Matched by the market (or reserved by a switch): the cards are held for this start.
            self._note_bid(owner, options)
            return
        self._sync_running()
        c = self.pool.allocator.counts().get(slug, {"total": 0, "free": 0})
        cur = self.pool.catalog.currency
        now = time.time()
        if options.pricing == "on-demand":
            if c["free"] >= options.gpus:
                return
            if c["free"] + book.running_cards < options.gpus:
                return  # spot servers can't make room: the allocator says what is free
            order = Order(owner, slug, options.gpus, "on-demand", None, False, now)
            entry = self._enqueue(order, options)
            self.tick_type(slug)
            raise MarketAnswer(
                202,
                f"No {slug} card is free; a spot server is being reclaimed for you (its user has "
                f"a {self.warning_seconds:.0f} s warning). Your request is queued as "
                f"{entry['id']} and your server starts by itself when the card frees. "
                "See GET /hub/api/gpulab/spot/queue.",
            )

        price = self.current_price(slug)
        bid = options.max_price
        low = self.in_low_window(now)
        problems = []
        if price > bid:
            problems.append(
                f"the spot price of {slug} is {price} {cur}/card-hour, above your max_price {bid}"
            )
        if c["free"] < options.gpus:
            problems.append(f"{c['free']} of {c['total']} {slug} cards are free")
        if options.windows_only and not low:
            problems.append(
                "it is outside the low-price windows ("
                + ", ".join(self.low_price_windows)
                + (", weekends" if self.weekends_low else "")
                + f", {self.timezone or 'local time'})"
            )
        if book.queued_on_demand:
            problems.append(f"on-demand requests are waiting for {slug}")
        if not problems:
            self._note_bid(owner, options)
            return
        if options.wait or options.windows_only:
            order = Order(owner, slug, options.gpus, "spot", bid, options.windows_only, now)
            entry = self._enqueue(order, options)
            raise MarketAnswer(
                202,
                f"Queued as {entry['id']}: " + "; ".join(problems) + ". Your server starts by "
                "itself when a card is free and the price is at most your max_price. Current "
                f"spot price: {price} {cur}/card-hour. See or cancel it at "
                "/hub/api/gpulab/spot/queue.",
            )
        raise MarketAnswer(
            409,
            "Spot server not started: " + "; ".join(problems) + f". Current spot price: {price} "
            f"{cur}/card-hour. Raise the max price, or queue the request (the form's queue "
            'option; "wait": true in the API).',
        )

    def _note_bid(self, owner: str, options: Any) -> None:
        if options.pricing != "spot":
            self.bids.pop(owner, None)
            return
        self.bids[owner] = Order(
            owner,
            options.gpu_type,
            options.gpus,
            "spot",
            options.max_price,
            options.windows_only,
            time.time(),
        )
        self._save_state()

    # ---- the queue ---------------------------------------------------------------------------

    def _enqueue(self, order: Order, options: Any) -> dict[str, Any]:
        entry = {"id": "q-" + uuid.uuid4().hex[:10], "options": options.to_json(), "order": order}
        self.queue[order.owner] = entry
        self.books[order.gpu_type].add_queued(order)
        self._save_state()
        return entry

    def _dequeue(self, owner: str) -> dict[str, Any] | None:
        entry = self.queue.pop(owner, None)
        if entry is not None:
            self.books[entry["order"].gpu_type].remove(owner)
            self._save_state()
        return entry

    def cancel_queued(self, owner: str) -> dict[str, Any] | None:
        entry = self._dequeue(owner)
        if entry is not None:
            self.log.info("Queued request %s of %s cancelled", entry["id"], owner)
        return entry

    def queue_position(self, owner: str) -> tuple[int, int] | None:
        """(position, length) of a queued request in its GPU type's queue, in the order the
        market serves it: on-demand requests first (arrival order), then spot bids, highest
        first (window-only ones among them, though they start only inside a window)."""
        entry = self.queue.get(owner)
        if entry is None:
            return None
        order = entry["order"]
        book = self.books[order.gpu_type]
        length = len(book.orders) - len(book.running)
        if order.pricing == "on-demand":
            return list(book.queued_on_demand).index(owner) + 1, length
        key = book._queue_key(order)
        ahead = len(book.queued_on_demand)
        # Both spot books are sorted by (-bid, created): a bisect counts the bids ahead.
        ahead += sum(bisect.bisect_left(lst, key) for lst in (book.queued, book.queued_windows))
        return ahead + 1, length

    def queue_json(self, user: str | None = None) -> list[dict[str, Any]]:
        out = []
        for entry in sorted(self.queue.values(), key=lambda e: e["order"].created):
            order = entry["order"]
            name, _, server = order.owner.partition("/")
            if user is not None and name != user:
                continue
            position, length = self.queue_position(order.owner) or (None, None)
            out.append(
                {
                    "id": entry["id"],
                    "user": name,
                    "server": server,
                    "gpu_type": order.gpu_type,
                    "gpus": order.cards,
                    "pricing": order.pricing,
                    "max_price": None if order.max_price is None else str(order.max_price),
                    "windows_only": order.windows_only,
                    "queued_at": order.created,
                    "current_price": str(self.current_price(order.gpu_type)),
                    "waiting_for": "reclaim" if order.pricing == "on-demand" else "match",
                    "position": position,
                    "queue_length": length,
                    "options": entry["options"],
                }
            )
        return out

    def _start_queued(self, order: Order) -> None:
        entry = self._dequeue(order.owner)
        if entry is None:
            return
        try:
            self.pool.allocator.reserve(
                order.owner, order.gpu_type, order.cards, self.reservation_ttl
            )
        except NoCapacity:
            self.queue[order.owner] = entry
            self.books[order.gpu_type].add_queued(order)
            self._save_state()
            return
        self.log.info("Starting queued request %s of %s", entry["id"], order.owner)
        asyncio.get_running_loop().create_task(self._spawn(order.owner, entry))

    async def _spawn(self, owner: str, entry: dict[str, Any]) -> None:
        name, _, server = owner.partition("/")
        path = (
            f"/users/{quote(name)}/servers/{quote(server)}"
            if server
            else f"/users/{quote(name)}/server"
        )
        code, body = await self._hub_api("POST", path, entry["options"])
        if code not in (201, 202):
            self.log.warning(
                "Starting queued %s for %s failed: %s %s", entry["id"], owner, code, body
            )
            self.pool.allocator.release(owner + RESERVED)

    async def _hub_api(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        base = self.hub_api_url
        try:
            resp = await AsyncHTTPClient().fetch(
                base.rstrip("/") + path,
                method=method,
                headers={"Authorization": f"token {self.api_token}"},
                body=None if body is None else json.dumps(body),
                allow_nonstandard_methods=True,
                request_timeout=120,
            )
            return resp.code, resp.body.decode(errors="replace")
        except HTTPClientError as e:
            text = e.response.body.decode(errors="replace") if e.response is not None else str(e)
            return e.code, text

    # ---- preemption --------------------------------------------------------------------------

    def _spawner(self, owner: str) -> Any:
        spawner = self._spawners.get(owner)
        if spawner is not None:
            return spawner
        try:
            return self.find_spawner(owner)
        except Exception:
            return None

    def _preempt(self, owner: str, reason: str, price: Decimal) -> None:
        alloc = self.pool.allocator.get(owner)
        order = self.bids.get(owner)
        if alloc is None or order is None:
            return
        book = self.books[alloc.gpu_type]
        book.preempting[owner] = reason
        now = time.time()
        name, _, server = owner.partition("/")
        p = Preemption(
            id="p-" + uuid.uuid4().hex[:12],
            owner=owner,
            user=name,
            server=server,
            gpu_type=alloc.gpu_type,
            reason=reason,
            status="warning",
            price=str(price),
            max_price=None if order.max_price is None else str(order.max_price),
            warned_at=now,
            deadline=now + self.warning_seconds,
        )
        self.active[owner] = p.id
        self._save_preemption(p)
        self.log.warning(
            "Preempting %s (%s): stops at %s unless cancelled",
            owner,
            reason,
            time.strftime("%H:%M:%S", time.localtime(p.deadline)),
        )
        self._schedule_deadline(p)
        self._warnings[p.id] = asyncio.Event()
        asyncio.get_running_loop().create_task(self._warn(p, alloc))

    async def _warn(self, p: Preemption, alloc: Any) -> None:
        """Signal, run the checkpoint command and send the webhook, concurrently."""
        checkpoint = None
        try:
            signalled, skipped = await self._signal(p, alloc)
            p = p.model_copy(update={"signalled_pids": signalled, "skipped_pids": skipped})
            self._update(p)
            settings = self.user_settings(p.user)
            if settings.get("checkpoint_command"):
                checkpoint = asyncio.get_running_loop().create_task(
                    self._checkpoint(p, settings["checkpoint_command"])
                )
            if settings.get("webhook_url"):
                await self._webhook(p, "preemption-warning", settings)
        finally:
            # A cancellation webhook waits for this one, never for the checkpoint.
            sent = self._warnings.pop(p.id, None)
            if sent is not None:
                sent.set()
        if checkpoint is not None:
            await checkpoint

    async def _signal(self, p: Preemption, alloc: Any) -> tuple[list[int], list[int]]:
        """SIGUSR1 to the server's opted-in processes: (signalled, skipped) pids, as the server
        sees them. A failure must not hold back the webhook or the checkpoint."""
        spawner = self._spawner(p.owner)
        if spawner is None:
            self.log.warning("Not signalling %s: its spawner is not known", p.owner)
            return [], []
        try:
            return await spawner.gpulab_signal_processes()
        except Exception:
            self.log.exception("Signalling the processes of %s failed", p.owner)
            return [], []

    def _update(self, p: Preemption) -> None:
        """Save a changed record unless a newer state (cancelled, stopped) was saved meanwhile."""
        latest = self.preemptions.get(p.id)
        if latest is not None and latest.status != p.status:
            p = p.model_copy(
                update={
                    "status": latest.status,
                    "cancelled_at": latest.cancelled_at,
                    "stopped_at": latest.stopped_at,
                }
            )
        self._save_preemption(p)

    async def _webhook(self, p: Preemption, event: str, settings: dict[str, Any]) -> None:
        payload = {
            "server": p.owner,
            "user": p.user,
            "server_name": p.server,
            "gpu_type": p.gpu_type,
            "reason": p.reason,
            "price": p.price,
            "max_price": p.max_price,
            "warned_at": p.warned_at,
            "deadline": p.deadline,
            "status": "cancelled" if event == "preemption-cancelled" else "warning",
        }
        result = await send_webhook(
            settings["webhook_url"], settings["webhook_secret"], event, p.id, payload
        )
        latest = self.preemptions[p.id]
        if event == "preemption-warning":
            self._save_preemption(latest.model_copy(update={"webhook": result}))

    def _checkpoint_progress(self, pid: str, result: dict[str, Any]) -> None:
        """Record the checkpoint's state as it goes (running, then its result) on the latest
        version of the record, so a stop or cancellation saved meanwhile is kept."""
        latest = self.preemptions[pid]
        result = {**result, "state": result.get("state") or checkpoint_state(result)}
        self._save_preemption(latest.model_copy(update={"checkpoint": result}))

    async def _checkpoint(self, p: Preemption, command: str) -> None:
        spawner = self._spawner(p.owner)
        try:
            if spawner is None:
                result = {"command": command, "error": "server not found"}
            else:
                # Where the server lives (a local process, a container), with its environment
                # plus these; "running" is recorded as soon as the command runs.
                result = await spawner.gpulab_run_checkpoint(
                    command,
                    self.checkpoint_timeout,
                    env={
                        "GPULAB_PREEMPTION_DEADLINE": str(p.deadline),
                        "GPULAB_PREEMPTION_REASON": p.reason,
                    },
                    on_start=lambda r: self._checkpoint_progress(p.id, r),
                )
        except Exception as e:
            self.log.exception("Checkpoint command of %s failed", p.owner)
            result = {"command": command, "error": f"{type(e).__name__}: {e}"}
        self._checkpoint_progress(p.id, result)

    async def _cancelled_webhook(self, p: Preemption, settings: dict[str, Any]) -> None:
        # The receiver must never see "cancelled" before the warning it cancels.
        sent = self._warnings.get(p.id)
        if sent is not None:
            await sent.wait()
        await self._webhook(p, "preemption-cancelled", settings)

    def _schedule_deadline(self, p: Preemption) -> None:
        delay = max(0.0, p.deadline - time.time())
        loop = asyncio.get_running_loop()
        self._timers[p.id] = loop.call_later(delay, lambda: loop.create_task(self._deadline(p.id)))

    async def _deadline(self, pid: str) -> None:
        self._timers.pop(pid, None)
        p = self.preemptions.get(pid)
        if p is None or p.status != "warning":
            return
        self.log.warning("Preemption deadline of %s: stopping it", p.owner)
        path = (
            f"/users/{quote(p.user)}/servers/{quote(p.server)}"
            if p.server
            else f"/users/{quote(p.user)}/server"
        )
        code, body = await self._hub_api("DELETE", path)
        if code not in (202, 204, 400, 404):
            self.log.error("Stopping preempted %s failed: %s %s", p.owner, code, body)
        # The stop releases the cards; the record is closed when the allocation is gone.
        for _ in range(600):
            if self.pool.allocator.get(p.owner) is None:
                break
            await asyncio.sleep(0.1)
        self._sync_running()
        self._server_gone(p.owner)
        self.tick_type(p.gpu_type)

    def _server_gone(self, owner: str) -> None:
        pid = self.active.pop(owner, None)
        if pid is None:
            return
        p = self.preemptions[pid]
        if p.status == "warning":
            self._save_preemption(
                p.model_copy(update={"status": "stopped", "stopped_at": time.time()})
            )
            timer = self._timers.pop(pid, None)
            if timer is not None:
                timer.cancel()

    def _cancel(self, owner: str, price: Decimal) -> None:
        pid = self.active.pop(owner, None)
        alloc = self.pool.allocator.get(owner)
        if alloc is not None and alloc.gpu_type in self.books:
            self.books[alloc.gpu_type].preempting.pop(owner, None)
        if pid is None:
            return
        timer = self._timers.pop(pid, None)
        if timer is not None:
            timer.cancel()
        p = self.preemptions[pid].model_copy(
            update={"status": "cancelled", "cancelled_at": time.time()}
        )
        self._save_preemption(p)
        self.log.info("Preemption of %s cancelled (spot price now %s)", owner, price)
        settings = self.user_settings(p.user)
        if settings.get("webhook_url"):
            asyncio.get_running_loop().create_task(self._cancelled_webhook(p, settings))

    def status_json(self, owner: str) -> dict[str, Any]:
        name = owner.partition("/")[0]
        alloc = self.pool.allocator.get(owner)
        order = self.bids.get(owner) if alloc is not None else None
        records = sorted(
            (p for p in self.preemptions.values() if p.owner == owner), key=lambda p: p.warned_at
        )
        queued = [e for e in self.queue_json(name) if f"{e['user']}/{e['server']}" == owner]
        gpu_type = alloc.gpu_type if alloc is not None else None
        return {
            "server": owner,
            "running": alloc is not None,
            "pricing": alloc.pricing if alloc is not None else None,
            "gpu_type": gpu_type,
            "max_price": None if order is None or order.max_price is None else str(order.max_price),
            "windows_only": bool(order and order.windows_only),
            "price": str(self.current_price(gpu_type)) if gpu_type in self.books else None,
            "currency": self.pool.catalog.currency,
            "low_price_window": self.in_low_window(),
            "warning_seconds": self.warning_seconds,
            # The JupyterLab extension saves open documents with changes this often on spot.
            "save_interval_seconds": self.save_interval,
            "time": time.time(),  # the hub's clock, for a countdown that ignores client skew
            # The JupyterLab extension saves open documents when this turns to a warning.
            "preemption": records[-1].public() if records else None,
            "queued": queued[0] if queued else None,
        }

    def preemptions_json(self, user: str | None = None) -> list[dict[str, Any]]:
        return [
            p.public()
            for p in sorted(self.preemptions.values(), key=lambda p: p.warned_at)
            if user is None or p.user == user
        ]


def _order_to_json(o: Order) -> dict[str, Any]:
    out = asdict(o)
    out["max_price"] = None if o.max_price is None else str(o.max_price)
    return out


def _order_from_json(rec: dict[str, Any]) -> Order:
    rec = dict(rec)
    rec["max_price"] = None if rec.get("max_price") is None else Decimal(rec["max_price"])
    return Order(**rec)
