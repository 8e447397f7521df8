"""The billing service process: a JupyterHub service named ``billing``.

Started by the hub (``python -m gpulab.billing_service``, a *managed* service) with the standard
service environment (``JUPYTERHUB_SERVICE_URL``, ``JUPYTERHUB_SERVICE_PREFIX``,
``JUPYTERHUB_API_TOKEN`` …), or run on its own (an *external* service, e.g. its docker-compose
container) with the same variables set by the operator (see billing_service/README.md). It
migrates its database at start, then serves the ingestion API, the read APIs and the statement
page, and runs the enforcement loop (zero balance, idle servers).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sqlalchemy import select
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import Float, Int, List, Unicode, default, validate
from traitlets.config import Application

from gpulab.billing_service import (
    api,
    compensation,
    courses,
    ledger,
    reservations,
    revenue,
    statements,
    storage,
)
from gpulab.billing_service.bounds import Limits
from gpulab.billing_service.compensation import Rule
from gpulab.billing_service.db import is_sqlite, make_engine, upgrade
from gpulab.billing_service.enforce import Enforcer
from gpulab.billing_service.hub_client import HubClient
from gpulab.billing_service.metering import ingest, rate_session
from gpulab.billing_service.metrics import BillingMetrics, thresholds_of
from gpulab.billing_service.models import MICRO, LedgerEntry, ServerSession
from gpulab.billing_service.rating import PriceBook, to_micro
from gpulab.billing_service.schemas import ServerStop
from gpulab.billing_service.storage import StorageMetering
from gpulab.catalog import load_catalog
from gpulab.catalog import settings as table

TEMPLATES = Path(__file__).with_name("templates")
# What the service cannot guess: where the hub's API is, its own token there, where it listens and
# its OAuth client (for the statement page).
REQUIRED_ENV = (
    "JUPYTERHUB_API_URL",
    "JUPYTERHUB_API_TOKEN",
    "JUPYTERHUB_SERVICE_URL",
    "JUPYTERHUB_CLIENT_ID",
)


def _ran_in(conn: Any, user: str, course: str) -> bool:
    """Whether ``user`` has had a server session under ``course``."""
    q = select(ServerSession.id).where(ServerSession.user == user, ServerSession.course == course)
    return conn.execute(q.limit(1)).first() is not None


class BillingService(Application):
    name = "gpulab-billing"
    description = "gpulab's billing service: meters kernel-seconds, rates them, keeps balances."

    aliases = {
        "db-url": "BillingService.db_url",
        "config": "BillingService.config_file",
    }

    config_file = Unicode(
        "", config=True, help="A Python config file (c.BillingService.… = …) to load at start."
    )

    data_dir = Unicode(config=True, help="Where the SQLite database and the pid file live.")

    @default("data_dir")
    def _default_data_dir(self) -> str:
        return table.get("GPULAB_DATA_DIR")

    db_url = Unicode(
        config=True,
        help="""SQLAlchemy URL of the billing database: SQLite in the data dir by default; for
        production e.g. postgresql://billing:secret@db/billing (driver: psycopg 3).""",
    )

    @default("db_url")
    def _default_db_url(self) -> str:
        return table.get("GPULAB_BILLING_DB_URL") or (
            f"sqlite:///{Path(self.data_dir).resolve() / 'billing.sqlite'}"
        )

    catalog_path = Unicode(config=True, help="The platform catalog TOML (prices, trial credit).")

    @default("catalog_path")
    def _default_catalog(self) -> str:
        return table.get("GPULAB_CATALOG")

    market_data_dir = Unicode(
        config=True,
        help="""The hub's data dir, whose spot/spot-prices.jsonl (the spot market's durable price
        history) rates spot seconds; default: $GPULAB_HUB_DATA_DIR, else data_dir (a hub that
        starts the service passes its own). It must be the hub's file system (a read-only mount
        is enough): billing reads the file, it never asks the hub.""",
    )

    @default("market_data_dir")
    def _default_market_data_dir(self) -> str:
        # Run on its own (docker-compose), the service has a data dir of its own and sees the
        # hub's through a read-only mount.
        return table.get("GPULAB_HUB_DATA_DIR") or self.data_dir

    trial_credit = Unicode(
        "",
        config=True,
        help="Credit given to each new account, e.g. '10.00'; empty: the catalog's trial_credit.",
    )

    heartbeat_interval = Float(
        10.0,
        config=True,
        help="""Seconds between the reporters' heartbeats. A server whose kernels were not seen
        for 3 intervals counts as not burning money (burn rate, enforcement).""",
    )

    zero_balance_action = Unicode(
        "no-gpu",
        config=True,
        help="""What happens to a running GPU server when its owner's balance cannot pay for
        `switch_margin` more seconds of it: 'no-gpu' (restart it in no-GPU mode: same home, same
        image and datasets; stopped when even no-GPU cannot be paid) or 'stop'.""",
    )

    @validate("zero_balance_action")
    def _check_action(self, proposal: dict) -> str:
        if proposal["value"] not in ("no-gpu", "stop"):
            raise ValueError(f"zero_balance_action: {proposal['value']!r}; allowed: no-gpu, stop")
        return proposal["value"]

    switch_margin = Float(
        60.0,
        config=True,
        help="""Seconds of the current mode the balance must still pay for; below that a GPU
        server is moved to no-GPU mode (or stopped), and a no-GPU server is stopped at zero.""",
    )

    start_minutes = Float(
        config=True,
        help="""Minutes of a mode the balance must pay for a start (the hub's check). A GPU server
        at zero balance is moved to no-GPU only if no-GPU can be paid this long (the restart
        would be refused otherwise); else it is stopped.""",
    )

    @default("start_minutes")
    def _default_start_minutes(self) -> float:
        return table.get("GPULAB_BILLING_MIN_MINUTES")

    idle_timeout = Float(
        900.0,
        config=True,
        help="Stop servers with no live kernel for this many seconds (0: never), so GPUs return.",
    )

    silent_timeout = Float(
        900.0,
        config=True,
        help="""Stop servers the hub runs that sent no heartbeat for this many seconds (their
        reporter was killed or is not installed), so unmetered GPU time is not given away; a
        session whose server is gone is closed at its last heartbeat. 0: never.""",
    )

    enforce_interval = Float(
        10.0, config=True, help="Seconds between checks of balances and idle servers (jittered)."
    )

    storage_interval = Float(
        config=True,
        help="""Seconds between reads of the hub's storage scan (GET /hub/api/storage, jittered),
        each charging every home's storage above the free size for the time since the previous
        read, at the level the previous read found (``storage``); 0: storage is not metered.
        Shorter is closer to the second (a quota raised and lowered again between two reads is
        not seen); each read costs the hub one scan of every home.""",
    )

    @default("storage_interval")
    def _default_storage_interval(self) -> float:
        return table.get("GPULAB_BILLING_STORAGE_INTERVAL")

    busy_window = Float(
        60.0,
        config=True,
        help="""A session charged within this many seconds (a kernel or app reported, or activity
        the hub observed) is checked against the balance by the enforcer, whatever its
        heartbeats say. Keep it above the hub's ActivityObserver.report_interval + interval
        (15 + 2 s by default), so a server whose reporter was silenced stays checked while the
        hub sees it work; 3 heartbeat intervals are used where that is more.""",
    )

    warn_thresholds = List(
        Unicode(),
        ["2.00"],
        config=True,
        help="Balances (in the catalog currency) below which users are warned.",
    )

    clock_skew = Float(
        5.0,
        config=True,
        help="""Seconds of clock difference allowed between a server and the hub. A reporter's
        event must lie within its server's current session, from the start the hub reported
        minus this, to now (or the reported stop) plus this; a kernel first reported before the
        start counts from the start.""",
    )

    max_new_ids_per_batch = Int(
        500,
        config=True,
        help="""At most this many kernel/app ids not reported before, per batch from a server's
        reporter; events that would add more are rejected (each named in the answer). A real
        server starts a handful of kernels per minute; the cap keeps one token from filling the
        span table. Hub and admin batches are not capped.""",
    )

    max_new_ids_per_heartbeat = Int(
        100,
        config=True,
        help="""At most this many kernel/app ids not reported before in one heartbeat from a
        server's reporter; a heartbeat listing more is rejected whole.""",
    )

    @property
    def limits(self) -> Limits:
        """The bounds on a reporter's events (see ``bounds``)."""
        return Limits(
            skew_us=int(self.clock_skew * MICRO),
            max_new_per_batch=self.max_new_ids_per_batch,
            max_new_per_heartbeat=self.max_new_ids_per_heartbeat,
        )

    compensation_rule = Unicode(
        "last-minutes:10",
        config=True,
        help="""What a user is credited when a platform reclaim (spot preemption, the zero-balance
        move, a node failure) loses work because the platform cut the checkpoint short, posted by
        the hub to api/v1/users/NAME/compensations: 'last-minutes:N' (what the session was
        charged for its last N minutes of billed time; nothing billed, nothing credited) or
        'fixed:AMOUNT' (e.g. 'fixed:1.00' in the catalog currency).""",
    )

    @validate("compensation_rule")
    def _check_compensation(self, proposal: dict) -> str:
        Rule.parse(proposal["value"])  # raises with the allowed forms
        return proposal["value"]

    metrics_cache_seconds = Float(
        5.0,
        config=True,
        help="""Seconds a scrape of /metrics reuses the figures read from the database
        (revenue, credits, balances, lag) before reading them again: many scrapers, or a fast
        scrape interval, read the ledger once per this long.""",
    )

    @cached_property
    def metrics(self) -> BillingMetrics:
        """This service's Prometheus metrics (``metrics``), made on first use."""
        return BillingMetrics(
            lambda thresholds, settled: self.read(revenue.totals, thresholds, settled),
            thresholds_of(self.catalog.billing.low_balance_thresholds),
            self.metrics_cache_seconds,
        )

    @cached_property
    def revenue_days(self) -> dict[int, revenue.Day]:
        """The admin revenue report's figures of days over (``revenue.report``)."""
        return {}

    pid_file = Unicode(config=True, help="Where the service writes its process id.")

    @default("pid_file")
    def _default_pid_file(self) -> str:
        return str(Path(self.data_dir) / "billing.pid")

    # ---- set-up ------------------------------------------------------------------------------

    def initialize(self, argv: list[str] | None = None) -> None:
        self.parse_command_line(argv)
        missing = [name for name in REQUIRED_ENV if not os.environ.get(name)]
        if missing:
            # A hub that starts the service sets them all; run on its own, the operator must
            # (billing_service/README.md, "Running it on its own").
            self.log.critical(
                "missing environment: %s (JupyterHub's service variables; see "
                "billing_service/README.md)",
                ", ".join(missing),
            )
            self.exit(2)
        if self.config_file:
            self.load_config_file(self.config_file)
            self.parse_command_line(argv)  # the command line wins over the file
        self.catalog = load_catalog(self.catalog_path or None)
        self.prices = PriceBook(self.catalog, self.market_data_dir)
        self.trial_micro = to_micro(
            Decimal(self.trial_credit) if self.trial_credit else self.catalog.trial_credit
        )
        self.warn_micro = [to_micro(Decimal(w)) for w in self.warn_thresholds]
        self.engine = make_engine(self.db_url)
        upgrade(self.engine)
        # SQLite has one writer: one DB thread avoids "database is locked"; PostgreSQL gets more.
        self.executor = ThreadPoolExecutor(max_workers=1 if is_sqlite(self.engine) else 8)
        self.prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/billing/")
        self.hub = HubClient.from_env()
        self.enforcer = Enforcer(self)
        self.storage_metering = StorageMetering(self)
        self.started_us = time.time_ns() // 1000

    async def run_db(self, fn, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args))

    async def read(self, fn, *args: Any) -> Any:
        def run() -> Any:
            with self.engine.connect() as conn:
                return fn(conn, *args)

        return await self.run_db(run)

    # ---- operations the handlers share -------------------------------------------------------

    def _balance(
        self, user: str, course: str | None = None, participant_only: bool = False
    ) -> dict[str, Any]:
        now = time.time_ns() // 1000
        with self.engine.begin() as conn:
            if course is not None and participant_only and not _ran_in(conn, user, course):
                # A course's pool and rules are its staff's to read; a user sees where they
                # stand in a course they have run a server under, not in anyone's course.
                raise web.HTTPError(
                    403, "%s", f"course: {user} has run no server under course {course}"
                )
            ledger.ensure(conn, ledger.user(user), now, trial_micro=self.trial_micro)
            info = statements.balance_info(
                conn,
                self.prices,
                user,
                now,
                int(3 * self.heartbeat_interval * MICRO),
                self.warn_micro,
            )
            if course is not None:
                info["course"] = statements.course_status(
                    conn, course, user, now, self.catalog.currency
                )
            info["storage"], warnings = storage.balance_json(
                conn, self.catalog.storage, self.catalog.currency, user, info["balance"]["micro"]
            )
            info["warnings"] += warnings
            return info

    async def balance(
        self, user: str, course: str | None = None, participant_only: bool = False
    ) -> dict[str, Any]:
        return await self.run_db(self._balance, user, course, participant_only)

    def course_info(self, conn, course: str) -> dict[str, Any]:
        return statements.course_info(conn, course, time.time_ns() // 1000, self.catalog.currency)

    def set_course(self, course: str, body: Any, actor: str) -> None:
        """Apply a PUT of a course's settings; raises ``courses.SettingsError`` (nothing
        changed) for a bad field."""
        now = time.time_ns() // 1000
        with self.engine.begin() as conn:  # rolled back, course row and all, on an error
            # Write first (SQLite's write lock) and lock the row (PostgreSQL), so that two
            # concurrent changes of different fields both stay.
            ledger.ensure(conn, ledger.pool(course), now)
            ledger.lock(conn, [ledger.pool(course)])
            current = courses.Settings.of(courses.get(conn, course))
            settings = courses.parse_settings(body, current)
            courses.put_settings(conn, course, settings, now, actor)

    def reserve(self, req: reservations.Request, actor: str) -> dict[str, Any]:
        """Record and charge a prepaid reservation once per id (``reservations``): its record,
        ``created`` (False for a replay) and the paying account's ``balance`` after. Raises
        ``reservations.Conflict`` or ``reservations.PaymentRequired`` (nothing changed)."""
        now = time.time_ns() // 1000
        with self.engine.begin() as conn:
            row, created, tagged = reservations.create(
                conn, self.prices, req, now, actor=actor, trial_micro=self.trial_micro
            )
            # Sessions the hub tagged before the reservation was known: re-rated now.
            for sid in tagged:
                rate_session(conn, sid, self.prices, now)
            out = statements.reservation_json(row, self.catalog.currency)
            balance = ledger.balance(conn, ledger.AccountId(req.kind, req.name)) or 0
            out["created"] = created
            out["balance"] = statements.money(balance)
            return out

    def list_reservations(self, conn, account: str | None) -> list[dict[str, Any]]:
        return [
            statements.reservation_json(r, self.catalog.currency)
            for r in reservations.listed(conn, account)
        ]

    def credit(
        self, account: ledger.AccountId, kind: str, amount: int, key: str, note: str, actor: str
    ) -> tuple[ledger.Entry, bool]:
        """A top-up or adjustment of a user's or a pool's balance, once per ``key``."""
        with self.engine.begin() as conn:
            return ledger.credit(
                conn,
                account,
                kind,
                amount,
                key,
                time.time_ns() // 1000,
                trial_micro=self.trial_micro,
                note=note,
                actor=actor,
            )

    def compensate(
        self,
        user: str,
        server: str,
        at_us: int | None,
        reason: str,
        checkpoint: str,
        key: str,
        note: str,
        actor: str,
    ) -> dict[str, Any] | None:
        """Credit ``user`` for the session of ``server`` in force at ``at_us`` (else its latest)
        under the configured rule, once per ``key``; None when there is no such session."""
        now = time.time_ns() // 1000
        with self.engine.begin() as conn:
            sess = compensation.find_session(conn, user, server, at_us)
            if sess is None:
                return None
            entry, created = compensation.compensate(
                conn,
                self.prices,
                Rule.parse(self.compensation_rule),
                sess,
                reason=reason,
                checkpoint=checkpoint,
                key=key,
                note=note,
                actor=actor,
                now_us=now,
                until_us=at_us if at_us is not None else now,
            )
            return {
                "id": entry.id,
                "user": entry.user,
                "kind": entry.kind,
                "session": entry.session_id,
                "server": sess.server,
                "amount": statements.money(entry.amount_micro),
                "note": entry.note,
                "actor": entry.actor,
                "idempotency_key": key,
                "created": created,
            }

    async def close_session(self, sess) -> None:
        """Record the stop of a server that vanished without the hub's report."""
        event = ServerStop(
            id=f"enforcer-stop-{sess.id}",
            kind="server_stop",
            user=sess.user,
            server=sess.server,
            # Its last sign of life: a heartbeat, or a kernel, app or observed span seen.
            t=max(sess.last_heartbeat_us or 0, sess.last_busy_us or 0, sess.started_us) / MICRO,
        )
        await self.run_db(
            ingest, self.engine, [event], self.prices, self.trial_micro, time.time_ns() // 1000
        )

    @staticmethod
    def entries(conn, user: str) -> list[dict[str, Any]]:
        rows = conn.execute(
            select(LedgerEntry).where(LedgerEntry.user == user).order_by(LedgerEntry.id)
        ).all()
        return [
            {
                "id": r.id,
                "kind": r.kind,
                "amount": statements.money(r.amount_micro),
                "created": statements.iso(r.created_us),
                "session": r.session_id,
                "note": r.note,
                "actor": r.actor,
            }
            for r in rows
        ]

    async def pool_snapshot(self) -> dict[str, Any] | None:
        return await self.hub.pool()

    # ---- web ---------------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        return web.Application(
            api.routes(self.prefix),
            billing=self,
            cookie_secret=os.urandom(32),
            template_path=str(TEMPLATES),
            xsrf_cookies=True,
        )

    async def _watch_parent(self, stop: asyncio.Event) -> None:
        """Exit when the hub that started us is gone (e.g. SIGKILLed): the restarted hub starts
        a fresh service on the same port, and reporters retry meanwhile.

        Only a service the hub started (it sets ``GPULAB_HUB_PID``) watches: an external one
        (its own container, a systemd unit) outlives hub restarts and is stopped by its own
        supervisor; its parent (e.g. tini, a shell) says nothing about the hub."""
        parent = table.get("GPULAB_HUB_PID")
        if not parent:
            return
        # The hub says who it is: a hub killed while we were still starting must not leave us
        # waiting for a parent we never had.
        while os.getppid() == parent:  # noqa: ASYNC110 (no event tells us the parent died)
            await asyncio.sleep(1)
        self.log.warning("the hub (pid %i) is gone; stopping", parent)
        stop.set()

    def start(self) -> None:
        # Written whole (a temporary file renamed over it): whoever reads it while a restarted
        # service is starting sees the old id or the new one, never an empty file.
        pid_file = Path(self.pid_file)
        pid_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = pid_file.with_name(f".{pid_file.name}.{os.getpid()}")
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, pid_file)
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        asyncio.run(self._serve(url.hostname or "127.0.0.1", url.port or 80))

    async def _serve(self, host: str, port: int) -> None:
        server = HTTPServer(self.make_app(), xheaders=True)
        server.listen(port, host)
        self.log.info(
            "gpulab billing on http://%s:%i%s (db: %s)",
            host,
            port,
            self.prefix,
            self.engine.url.render_as_string(hide_password=True),
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        tasks = [
            asyncio.create_task(self.enforcer.run()),
            asyncio.create_task(self.storage_metering.run()),
            asyncio.create_task(self._watch_parent(stop)),
        ]
        await stop.wait()
        for task in tasks:
            task.cancel()
        server.stop()
        self.executor.shutdown(wait=True)


def main(argv: list[str] | None = None) -> None:
    app = BillingService.instance()
    app.initialize(argv)
    app.start()
