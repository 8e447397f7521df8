"""The spot market inside the hub: :class:`SpotMarket`, its prices, tick, admission and queue.

Runs on the hub's event loop next to the allocator (whose mutations are synchronous there too, so
the market and spawns never interleave inside one decision). The matching itself is the pure
:func:`gpulab.spawners.market.core.decide`; this module feeds it from the allocator and carries
out what it decides:

- starting a queued request: its cards are reserved in the allocator for the owner, then the
  server is started through the hub's own REST API (:mod:`.hub_client`) with the
  ``gpulab-market`` service token;
- preempting: a warning (:mod:`.preemption`: signals, a signed webhook, the user's checkpoint
  command) and at the deadline a normal stop through the REST API (billing closes there);
- cancelling a preemption when the price falls back under the bid before the deadline.

State that must survive a hub crash lives in ``DATA_DIR/spot/`` (:mod:`.store`): the price
history (append-only, fsynced), the queue and bids (``state.json``), preemption records
(``preemptions.jsonl``) and per-user settings with webhook secrets (``settings.json``, mode
0600, :mod:`.settings`). The JSON the API shows is built in :mod:`.views`; the answers to a
spawn that does not start now in :mod:`.admission`.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from gpulab.catalog import NO_GPU
from gpulab.catalog.price_history import history_for, market_dir
from gpulab.spawners.market.admission import queued, reclaiming, refused, spot_problems
from gpulab.spawners.market.config import SpotMarketConfig
from gpulab.spawners.market.core import Order, Schedule, TypeBook, decide, spot_price, utilization
from gpulab.spawners.market.hub_client import HubClient
from gpulab.spawners.market.preemption import Preemption, Preemptions
from gpulab.spawners.market.settings import SpotSettings
from gpulab.spawners.market.store import load_state, save_state
from gpulab.spawners.market.views import queue_entry_json
from gpulab.spawners.node.allocator import RESERVED, NoCapacity
from gpulab.spawners.node.counters import SPOT_QUEUE_WAIT
from gpulab.spawners.node.holds import accounts_for
from gpulab.spawners.options import ServerOptions


class SpotMarket(SpotMarketConfig):
    """Spot prices, bids, the wait queue and preemptions for this node's GPU pool."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dir = market_dir(self.pool.data_dir)
        self.history = history_for(self.pool.data_dir)
        self.schedule = Schedule.parse(self.low_price_windows, self.weekends_low)
        self.books: dict[str, TypeBook] = {slug: TypeBook() for slug in self.pool.catalog.gpu_types}
        self.queue: dict[str, dict[str, Any]] = {}  # owner -> {id, options, order}
        self.bids: dict[str, Order] = {}  # owner -> the order of a running spot server
        self.pins: dict[str, Decimal] = {}
        self.settings = SpotSettings(self.dir)
        self.preemptions = Preemptions(self)
        self._spawners: dict[str, Any] = {}
        # owner -> the hub's spawner of that server, or None; set by the hub's plugin (the market
        # sees only spawners that asked it for admission until then).
        self.find_spawner: Callable[[str], Any] = lambda owner: None
        self._task: asyncio.Task | None = None
        self.last_tick_seconds: float | None = None
        self._load()

    # ---- persistence and the market's links to the hub ----------------------------------------

    def _load(self) -> None:
        self.pins, bids, queue = load_state(self.dir)
        self.bids = {order.owner: order for order in bids}
        for entry in queue:
            order = entry["order"]
            if order.gpu_type in self.books:
                self.queue[order.owner] = entry
                self.books[order.gpu_type].add_queued(order)

    def _save_state(self) -> None:
        save_state(self.dir, self.pins, self.bids.values(), self.queue.values())

    @property
    def hub_client(self) -> HubClient:
        """The hub's REST API, as the ``gpulab-market`` service (read at each use: the hub's
        plugin may set the URL after the market exists)."""
        return HubClient(self.hub_api_url, self.api_token)

    def spawner(self, owner: str) -> Any:
        """The hub's spawner of ``owner``'s server, or None when the hub has none."""
        spawner = self._spawners.get(owner)
        if spawner is not None:
            return spawner
        try:
            return self.find_spawner(owner)
        except Exception:
            return None

    # ---- prices ------------------------------------------------------------------------------

    def local_now(self, t: float) -> datetime:
        """``t`` in the operator's time zone (`timezone`)."""
        tz = ZoneInfo(self.timezone) if self.timezone else None
        return datetime.fromtimestamp(t, tz) if tz else datetime.fromtimestamp(t).astimezone()

    def in_low_window(self, t: float | None = None) -> bool:
        """Whether ``t`` (default: now) is inside a low-price window."""
        return self.schedule.is_low(self.local_now(time.time() if t is None else t))

    def compute_price(self, slug: str, t: float, without: int = 0) -> Decimal:
        """The spot price of GPU type ``slug`` at ``t``: its pin, else from its utilization.

        ``without``: held cards counted as free (the price a spot holder of that many cards is
        measured against: its own cards never out-bid it; the published price counts them)."""
        gt = self.pool.catalog.gpu_types[slug]
        if slug in self.pins:
            return self.pins[slug]
        c = self.pool.allocator.counts().get(slug, {"total": 0, "free": 0})
        free = min(c["total"], c["free"] + without)
        u = utilization(c["total"], free, self.books[slug].queued_cards)
        return spot_price(
            gt.spot_floor_price,
            gt.on_demand_price,
            u,
            self.in_low_window(t),
            window_factor=Decimal(self.window_factor),
        )

    def current_price(self, slug: str) -> Decimal:
        """The price in force for ``slug`` (the latest recorded one; computed on first use)."""
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
        # The books may not yet hold a server that became ready since the last tick; a pin
        # must weigh it, or the warning would wait for the next tick.
        self._sync_running()
        self.tick_type(slug)

    # ---- the loop ----------------------------------------------------------------------------

    def start(self, after: Awaitable[Any] | None = None) -> None:
        """Start the periodic tick (idempotent; needs a running event loop). The first tick waits
        for ``after`` (the hub answering on its API, so that restored servers are known)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(after))

    async def _loop(self, after: Awaitable[Any] | None) -> None:
        if after is not None:
            await after
        self.preemptions.resume()
        while True:
            try:
                self.tick()
            except Exception:
                self.log.exception("Spot market tick failed")
            await asyncio.sleep(self.tick_interval * (1 + random.uniform(0, 0.1)))

    def tick(self) -> None:
        """Bring the books up to date, then price and match every GPU type."""
        t0 = time.perf_counter()
        self._sync_running()
        for slug in self.books:
            self.tick_type(slug)
        self.last_tick_seconds = time.perf_counter() - t0

    def tick_type(self, slug: str) -> None:
        """Price GPU type ``slug`` now and carry out what the order book decides."""
        now = time.time()
        c = self.pool.allocator.counts().get(slug)
        if not c:
            return
        price = self.compute_price(slug, now)
        if self.history.record(slug, now, price):
            self.log.info("Spot price of %s is now %s", slug, price)
        low = self.in_low_window(now)
        held_need = self.pool.allocator.hold_deficit(slug, now)
        d = decide(
            self.books[slug],
            c["free"],
            price,
            low,
            held_need,
            price_without=lambda cards: self.compute_price(slug, now, without=cards),
        )
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
                    self.preemptions.server_gone(owner)
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
            reason = self.preemptions.reason(owner)
            if reason is not None:
                book.preempting[owner] = reason
            changed = True
        if changed:
            self._save_state()

    def _preempt(self, owner: str, reason: str, price: Decimal) -> None:
        alloc = self.pool.allocator.get(owner)
        order = self.bids.get(owner)
        if alloc is None or order is None:
            return
        self.books[alloc.gpu_type].preempting[owner] = reason
        self.preemptions.warn(alloc, order, reason, price)

    def _cancel(self, owner: str, price: Decimal) -> None:
        alloc = self.pool.allocator.get(owner)
        if alloc is not None and alloc.gpu_type in self.books:
            self.books[alloc.gpu_type].preempting.pop(owner, None)
        self.preemptions.cancel(owner, price)

    def preempted(self, p: Preemption) -> None:
        """Called once a preempted server was stopped at its deadline: close its record and
        hand its cards to whoever waits."""
        self._sync_running()
        self.preemptions.server_gone(p.owner)
        self.tick_type(p.gpu_type)

    # ---- admission (once per spawn, before it allocates) --------------------------------------

    def admit(self, spawner: Any, options: ServerOptions) -> None:
        """Decide whether a spawn may allocate now. Raises :class:`MarketAnswer` otherwise.

        Called once per spawn: by the hub's pre-check before JupyterHub's spawn begins (which
        hands a success to the spawner), or else by the spawner itself. It changes the market's
        state (bids, the queue, reclaims), so it must not run twice for one spawn.

        Spot: a card of the type must be free, the price at most the bid, the low-price window
        open for window-only requests, and no on-demand request waiting for that type. A request
        that asks to wait (or is window-only) is queued instead of refused. On-demand: when no
        card is free but spot servers hold the type, the lowest bid is reclaimed and the request
        queued until its card frees.
        """
        owner = spawner.owner
        self._spawners[owner] = spawner
        slug = options.gpu
        if slug == NO_GPU or slug not in self.books:
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
        # Cards held for the user's (or their course's) reservation or lab session count as
        # free for this request.
        accounts = accounts_for(spawner.user.name, options.course)
        c = self.pool.allocator.counts(accounts).get(slug, {"total": 0, "free": 0})
        cur = self.pool.catalog.currency
        now = time.time()
        if options.pricing == "on-demand":
            if c["free"] >= options.gpus:
                return
            # Spot cards that holds will claim cannot make room for this request.
            held = self.pool.allocator.held_out(slug, now, accounts)
            if c["free"] + c.get("held", 0) + book.running_cards - held < options.gpus:
                return  # spot servers can't make room: the allocator says what is free
            order = Order(owner, slug, options.gpus, "on-demand", None, False, now)
            entry = self._enqueue(order, options)
            self.tick_type(slug)
            raise reclaiming(slug, entry["id"], self.warning_seconds)

        price = self.current_price(slug)
        windows = ", ".join(self.low_price_windows) + (", weekends" if self.weekends_low else "")
        problems = spot_problems(
            slug,
            price,
            options.max_price,
            options.gpus,
            c,
            options.windows_only,
            self.in_low_window(now),
            f"{windows}, {self.timezone or 'local time'}",
            bool(book.queued_on_demand),
            cur,
        )
        if not problems:
            self._note_bid(owner, options)
            return
        if options.wait or options.windows_only:
            order = Order(
                owner, slug, options.gpus, "spot", options.max_price, options.windows_only, now
            )
            raise queued(self._enqueue(order, options)["id"], problems, price, cur)
        raise refused(problems, price, cur)

    def _note_bid(self, owner: str, options: ServerOptions) -> None:
        if options.pricing != "spot":
            self.bids.pop(owner, None)
            return
        self.bids[owner] = Order(
            owner,
            options.gpu,  # a spot request always names a GPU type
            options.gpus,
            "spot",
            options.max_price,
            options.windows_only,
            time.time(),
        )
        self._save_state()

    # ---- the queue ---------------------------------------------------------------------------

    def _enqueue(self, order: Order, options: ServerOptions) -> dict[str, Any]:
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
        """Withdraw ``owner``'s queued request; returns it, or None if there was none."""
        entry = self._dequeue(owner)
        if entry is not None:
            self.log.info("Queued request %s of %s cancelled", entry["id"], owner)
        return entry

    def queued_entry(self, owner: str) -> dict[str, Any] | None:
        """``owner``'s ("user/server") queued request as the API shows it, or None."""
        entry = self.queue.get(owner)
        return queue_entry_json(self, entry) if entry is not None else None

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
        if order.created:
            SPOT_QUEUE_WAIT.observe(max(0.0, time.time() - order.created), order.gpu_type)
        asyncio.get_running_loop().create_task(self._spawn(order.owner, entry))

    async def _spawn(self, owner: str, entry: dict[str, Any]) -> None:
        code, body = await self.hub_client.start_server(owner, entry["options"])
        if code not in (201, 202):
            self.log.warning(
                "Starting queued %s for %s failed: %s %s", entry["id"], owner, code, body
            )
            self.pool.allocator.release(owner + RESERVED)
