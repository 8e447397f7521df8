"""The hub's side of billing, run inside the hub process (the billing service itself is
:mod:`gpulab.billing_service`, a separate process that the hub reaches only over HTTP).

- ``check_balance`` (the spawner's ``afford_hook``, asked once per spawn request): refuse a
  start, with a clear message, when the balance cannot pay ``min_minutes`` of the requested
  mode; else answer the monthly reservation it runs on (prepaid), if any. A server of a course
  (option ``course``) is priced at the education price and paid by the course's pool up to the
  student's cap first: billing's balance API says what is left (``?course=``).
- ``report_start`` (the spawner's ``pre_allocate_hook``): report ``server_start`` with the
  request's mode, its reservation and who pays, so the billing service knows what each second
  of that server costs.

Both read the spawn's :class:`~gpulab.spawners.request.SpawnRequest` and set nothing on the
spawner: the reservation they pick travels in the request (``hold_id``).
- ``after_stop`` (JupyterHub's ``Spawner.post_stop_hook``): report ``server_stop``, which closes
  the server's session whether it stopped cleanly, was culled or was found dead.

Both call the billing service directly with the service's own token (which holds ``admin:users``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyterhub.utils import random_port
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab.catalog import NO_GPU, Catalog, settings
from gpulab.hub_config.data_dir import secret_file
from gpulab.hub_config.scopes import (
    COURSE_MANAGE_SCOPE,
    COURSE_READ_SCOPE,
    READ_POOL_SCOPE,
    READ_STORAGE_SCOPE,
    grant,
)
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.mixin import SpawnError
from gpulab.spawners.node.holds import accounts_for
from gpulab.spawners.options import ServerOptions
from gpulab.spawners.request import SpawnRequest

log = logging.getLogger("gpulab.billing.hooks")
# Calls to billing in flight at once (balance checks of a class starting together, reports).
MAX_CALLS = 64


class BillingUnavailable(RuntimeError):
    pass


class BillingUnreachable(BillingUnavailable):
    """Nothing listens (yet): the service is starting or being restarted by the hub."""


def hourly_price(opts: ServerOptions, catalog: Catalog) -> tuple[Decimal, str]:
    """What one hour of the requested server costs now, and a label for messages: the one price
    function's answer (:func:`gpulab.catalog.pricing.quote`, which billing rates by) for its
    options, at the spot price in force for a spot server (what its first minutes are billed at;
    none when the hub runs no spot market: then spot time is rated at on-demand too)."""
    spot_price = None
    if opts.pricing == "spot" and opts.gpu != NO_GPU and SpotMarket.initialized():
        try:
            spot_price = SpotMarket.instance().current_price(opts.gpu)
        except KeyError:  # a type the market does not trade
            spot_price = None
    q = opts.quote(catalog, spot_price)
    return q.per_hour, q.label


def _m(value: dict[str, Any]) -> Decimal:
    return Decimal(value["exact"])


def course_refusal(
    course: dict[str, Any], balance: Decimal, need: Decimal, what: str, minutes: float, cur: str
) -> str | None:
    """Why a course server cannot start (None: it can), from billing's ``course`` record: with
    ``overflow = "refuse"`` the course's share must pay ``need`` on its own; with ``"personal"``
    the course's share plus the student's balance must."""
    name = course["name"]
    available = _m(course["available"])
    cap, used, left, pool = (_m(course[k]) for k in ("cap", "used", "left", "pool_balance"))
    period = "weekly" if course["period"] == "week" else "term"
    this = "this week" if course["period"] == "week" else "this term"
    need_text = f"{cur} {need:.2f} for {minutes:g} minutes of {what}"
    if course["overflow"] == "refuse":
        if available >= need:
            return None
        beyond = "; the course refuses usage beyond the cap"
        if not course.get("in_period", True):
            return (
                f"Course {name} pays only during its term ({course['term_start']} to "
                f"{course['term_end']}) and refuses usage outside it."
            )
        if left <= 0:
            return (
                f"Your {period} cap in course {name} ({cur} {cap:.2f}) is used up: "
                f"{cur} {used:.2f} of {cap:.2f} {this}{beyond}."
            )
        if pool < left:
            return (
                f"The credit pool of course {name} has {cur} {pool:.2f} left, less than "
                f"{need_text}; the course refuses usage beyond its pool. Ask the course's "
                "teacher to top it up."
            )
        return (
            f"Your {period} cap in course {name} has {cur} {left:.2f} left ({cur} {used:.2f} of "
            f"{cap:.2f} used {this}), less than {need_text}{beyond}."
        )
    if available + balance >= need:
        return None
    return (
        f"Course {name} can pay {cur} {available:.2f} more for you {this} (cap {cur} {cap:.2f}, "
        f"{cur} {used:.2f} used, pool {cur} {pool:.2f}) and your balance is {cur} {balance:.2f}: "
        f"together less than {need_text}. Beyond the cap the course charges your own balance; "
        "top up, or choose a cheaper mode."
    )


def reservation_for(spawner, opts: ServerOptions) -> str | None:
    """The monthly reservation (its id) a start of ``opts`` will run on, if any: one of the
    user's or their course's, usable now, with enough unused cards of the type."""
    if opts.gpu == NO_GPU:
        return None
    accounts = accounts_for(spawner.user.name, opts.course)
    hold = spawner.pool.allocator.usable_hold(accounts, opts.gpu, opts.gpus)
    return hold.hold_id if hold is not None and hold.kind == "reservation" else None


class BillingHooks:
    """Spawner hooks bound to one billing service URL and token."""

    def __init__(
        self,
        url: str,
        token: str,
        min_minutes: float = 10.0,
        timeout: float = 10.0,
        retry_for: float = 600.0,
        start_wait: float = 20.0,
    ) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.min_minutes = min_minutes
        self.timeout = timeout
        self.retry_for = retry_for
        self.start_wait = start_wait
        self._tasks: set[asyncio.Task] = set()
        # Billing's calls have a client of their own: on tornado's shared one (10 at a time) a
        # class starting at once queued every balance check behind the starts waiting on them.
        self._http: AsyncHTTPClient | None = None

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        req = HTTPRequest(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            request_timeout=self.timeout,
        )
        try:
            if self._http is None:
                self._http = AsyncHTTPClient(force_instance=True, max_clients=MAX_CALLS)
            resp = await self._http.fetch(req)
        except HTTPClientError as e:
            if e.code == 599:
                raise BillingUnreachable(f"billing unreachable: {e}") from None
            detail = e.response.body.decode(errors="replace") if e.response else str(e)
            raise BillingUnavailable(f"billing answered {e.code}: {detail}") from None
        except OSError as e:
            raise BillingUnreachable(f"billing unreachable: {e}") from None
        return json.loads(resp.body or b"null")

    async def _call_when_up(self, method: str, path: str, body: Any = None) -> Any:
        """Like _call, but wait up to ``start_wait`` seconds for a service that is (re)starting."""
        deadline = time.monotonic() + self.start_wait
        while True:
            try:
                return await self._call(method, path, body)
            except BillingUnreachable:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def prepay_reservation(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Ask billing to charge a monthly reservation (idempotent by its id): (status, answer).
        402/400/409 are billing's refusals; 503 when billing cannot be asked."""
        try:
            return 201, await self._call_when_up("POST", "api/v1/reservations", body)
        except BillingUnreachable as e:
            return 503, {"message": f"Billing is unavailable right now: {e}"}
        except BillingUnavailable as e:
            status, _, detail = str(e).removeprefix("billing answered ").partition(": ")
            try:
                answer = json.loads(detail)
            except ValueError:
                answer = {"message": detail}
            return (int(status) if status.isdigit() else 503), answer

    async def course_money(self, course: str) -> dict[str, Any]:
        """Billing's record of ``course``: pool, cap, and each student's credit this period (for
        the teacher dashboard, whose page the hub has already checked the viewer may see)."""
        return await self._call("GET", f"api/v1/courses/{course}")

    async def meter_storage(self) -> None:
        """Ask billing to read every home's storage now (a quota is about to change, or just
        did), so that a quota held between two of billing's periodic reads is billed too.
        Raises when billing cannot be asked."""
        await self._call_when_up("POST", "api/v1/storage/pull", {})

    async def balance(self, user_name: str) -> dict[str, Any]:
        """Billing's balance record for ``user_name`` (for the hub's home page)."""
        return await self._call("GET", f"api/v1/users/{user_name}/balance")

    async def check_balance(self, spawner, request: SpawnRequest) -> str | None:
        """Raise SpawnError 402 when the balance cannot pay ``min_minutes`` of the request's
        options (503 when billing cannot be asked): the spawner's ``afford_hook``. Return the
        monthly reservation the server runs on (prepaid: no balance asked), or None."""
        opts = request.options
        catalog = spawner.pool.catalog
        name = spawner.user.name
        hold_id = reservation_for(spawner, opts)
        if hold_id is not None:
            return hold_id  # prepaid: a server on the account's reservation costs nothing more
        per_hour, price_kind = hourly_price(opts, catalog)
        need = per_hour * Decimal(str(self.min_minutes)) / 60
        path = f"api/v1/users/{name}/balance"
        if opts.course:
            path += f"?course={opts.course}"
        try:
            info = await self._call_when_up("GET", path)
        except BillingUnavailable as e:
            log.error("Refusing start of %s: %s", spawner.owner, e)
            raise SpawnError(
                503,
                "Billing is unavailable right now, so the server cannot start; try again in a minute.",
            ) from None
        balance = Decimal(info["balance"]["exact"])
        cur = catalog.currency
        staff_started = request.paid_by == "course"
        if staff_started and not (opts.course and isinstance(info.get("course"), dict)):
            raise SpawnError(402, "A server course staff start is paid by a course's pool only.")
        if opts.course and isinstance(info.get("course"), dict):
            course = info["course"]
            if staff_started:
                # Started by course staff, not the student: the pool alone pays (as "refuse").
                course = {**course, "overflow": "refuse"}
            why = course_refusal(course, balance, need, opts.label(catalog), self.min_minutes, cur)
            if why is not None:
                if staff_started:
                    why = (
                        f"{name}'s server started by course staff is paid by course "
                        f"{opts.course}'s pool only, never by {name}'s own balance: {why}"
                    )
                raise SpawnError(402, why)
            return None
        if balance < need:
            raise SpawnError(
                402,
                f"Your balance ({cur} {balance:.2f}) cannot pay for {self.min_minutes:g} minutes of "
                f"{opts.label(catalog)} ({price_kind}{cur} {per_hour}/h, {cur} {need:.2f} "
                f"for {self.min_minutes:g} minutes). Top up, or choose {catalog.no_gpu.display_name} "
                f"({cur} {catalog.no_gpu.price_per_hour}/h).",
            )
        return None

    async def report_start(self, spawner, request: SpawnRequest) -> None:
        """Tell billing the server starts, with what it costs: the spawner's
        ``pre_allocate_hook``, after ``check_balance`` answered the request."""
        name = spawner.user.name
        opts = request.options
        options = opts.to_json()
        if request.hold_id is not None:
            # A server of an account with a monthly reservation runs on it (prepaid): billing is
            # told so, and the allocation is then bound to that reservation (request.hold_id).
            options["reservation"] = request.hold_id
        options.pop("paid_by", None)
        if request.paid_by == "course" and opts.course:
            # Started by course staff (courses/staff.py): billing charges the pool only.
            options["paid_by"] = "course"
        event = {
            "id": f"hub-start-{uuid.uuid4()}",
            "kind": "server_start",
            "user": name,
            "server": spawner.name or "",
            "t": time.time(),
            "gpu": opts.gpu,
            "gpus": opts.gpus,
            "pricing": opts.pricing,
            "options": options,
        }
        try:
            await self._call_when_up("POST", "api/v1/events", {"events": [event]})
        except BillingUnavailable as e:
            raise SpawnError(
                503,
                "Billing is unavailable right now, so the server cannot start; try again in a minute.",
            ) from e

    async def after_stop(self, spawner) -> None:
        event = {
            "id": f"hub-stop-{uuid.uuid4()}",
            "kind": "server_stop",
            "user": spawner.user.name,
            "server": spawner.name or "",
            "t": time.time(),
        }
        await self.report_events([event], what=f"server_stop of {spawner.owner}")

    async def compensate(
        self, *, user: str, server: str, at: float, reason: str, checkpoint: str, key: str
    ) -> None:
        """Credit ``user`` for work a platform reclaim lost (billing picks the amount); the
        ``key`` makes a retry harmless."""
        body = {
            "server": server,
            "at": at,
            "reason": reason,
            "checkpoint": checkpoint,
            "idempotency_key": key,
        }
        await self._call_when_up("POST", f"api/v1/users/{user}/compensations", body)
        log.info("Compensated %s/%s for %s (checkpoint %s)", user, server, reason, checkpoint)

    async def report_events(self, events: list[dict], what: str = "activity") -> None:
        """Deliver hub events (server stops, observed activity); when billing is away, keep
        trying in the background (the same event ids: each is applied once). Never waits for
        a billing that is down: stops and observation must go on."""
        try:
            await self._call("POST", "api/v1/events", {"events": events})
        except BillingUnavailable as e:
            log.warning("%s not delivered yet: %s", what, e)
            task = asyncio.ensure_future(self._retry(events))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _retry(self, events: list[dict]) -> None:
        deadline = time.monotonic() + self.retry_for
        delay = 1.0
        while time.monotonic() < deadline:
            await asyncio.sleep(delay)
            try:
                await self._call("POST", "api/v1/events", {"events": events})
                return
            except BillingUnavailable:
                delay = min(delay * 2, 30.0)
        log.error("gave up delivering %d event(s): %s", len(events), events[:3])


def configure_billing(c, data_dir: str, catalog: str, roles: list[dict]) -> None:
    """Register the billing service, its role and the spawner hooks in a hub config ``c``.

    Two modes. **Managed** (the default): the hub starts ``python -m gpulab.billing_service``
    itself, with a port and token kept in the data dir. **External**: the service runs on its own
    (its docker-compose container, a systemd unit) and the hub registers it by URL and token; the
    hub's restarts and crashes do not touch it.

    Operator knobs (environment): ``GPULAB_BILLING=0`` turns billing off;
    ``GPULAB_BILLING_MIN_MINUTES`` (default 10: minutes of the requested mode a start needs).
    Managed mode: ``GPULAB_BILLING_PORT`` (default: a free port), ``GPULAB_BILLING_DB_URL``
    (default: SQLite in the data dir), ``GPULAB_BILLING_ARGS`` (extra ``--BillingService.x=y``
    arguments). External mode: ``GPULAB_BILLING_EXTERNAL_URL`` (e.g. ``http://billing:10101``:
    where the hub and the proxy (and by default every server) reach the service; no path, the
    service serves under ``/services/billing/``) and ``GPULAB_BILLING_API_TOKEN`` (required with
    it: the service's hub token, the same secret the service gets as ``JUPYTERHUB_API_TOKEN``).
    Either mode: ``GPULAB_BILLING_SERVER_URL`` (e.g. ``http://proxy:8000/services/billing/``):
    where servers reach the service, when that is not where the hub does (docker-compose: the
    proxy's public route, because user containers can't reach billing's own port); default: the
    service's own address under ``/services/billing/``.
    Reporter knobs passed to every server: ``GPULAB_REPORTER_HEARTBEAT`` (seconds, default 10),
    ``GPULAB_REPORTER_MAX_BACKOFF``.
    """

    if not settings.get("GPULAB_BILLING"):
        return
    min_minutes = settings.setting("GPULAB_BILLING_MIN_MINUTES").text(
        settings.get("GPULAB_BILLING_MIN_MINUTES")
    )
    # Checked before anything is registered, as the external mode's settings are.
    server_url_setting = _server_url_setting()
    if settings.get("GPULAB_BILLING_EXTERNAL_URL"):
        service, server_url = _external_service()
    else:
        service, server_url = _managed_service(c, data_dir, catalog, min_minutes)
    server_url = server_url_setting or server_url
    service.update(
        {
            "name": "billing",
            "display": True,
            "oauth_no_confirm": True,
            # Admins' OAuth tokens for the statement page carry admin:users (the admin view).
            # Course staff's tokens carry their course scopes (filtered by the course's group),
            # so billing's course API shows TAs and teachers their course. admin-ui: the
            # statement page shows the hub's Admin link to whom the hub shows it.
            "oauth_client_allowed_scopes": [
                "admin:users",
                "admin-ui",
                COURSE_READ_SCOPE,
                COURSE_MANAGE_SCOPE,
            ],
        }
    )
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    services.append(service)
    c.JupyterHub.services = services
    roles.append(
        {
            "name": "gpulab-billing",
            "description": "The billing service: stops or moves servers it cannot bill, and "
            "meters every home's storage from the hub's own scan",
            "scopes": ["admin:users", "admin:servers", READ_POOL_SCOPE, READ_STORAGE_SCOPE],
            "services": ["billing"],
        }
    )
    grant(roles, "user", "access:services!service=billing")

    hooks = BillingHooks(
        f"{service['url']}/services/billing/", service["api_token"], min_minutes=float(min_minutes)
    )
    c.Spawner.pre_allocate_hook = hooks.report_start
    c.Spawner.afford_hook = hooks.check_balance
    c.Spawner.post_stop_hook = hooks.after_stop
    # What the hub observes in each server is billed too (hub_config/billing/observer.py).
    c.ActivityObserver.report_hook = hooks.report_events
    c.SpotMarket.compensation_hook = hooks.compensate
    c.GpulabHome.balance_hook = hooks.balance
    c.StorageAPI.meter_hook = hooks.meter_storage
    c.CourseDashboard.money_hook = hooks.course_money
    c.ReservationsConfig.prepay_hook = hooks.prepay_reservation
    c.GpulabHome.statement_url = "/services/billing/"
    server_env = dict(c.Spawner.environment) if "environment" in c.Spawner else {}
    server_env["GPULAB_BILLING_URL"] = server_url
    for key in ("GPULAB_REPORTER_HEARTBEAT", "GPULAB_REPORTER_MAX_BACKOFF"):
        if settings.is_set(key):
            server_env[key] = settings.setting(key).text(settings.get(key))
    # The usage reporter runs in every server the hub starts: its jupyter-config/ data file
    # enables it. An installed wheel puts that file in PREFIX/etc/jupyter (always read); for the
    # source checkout (``pip install -e``, which installs no data files) point Jupyter at it.
    config_dir = _reporter_config_dir()
    if config_dir is not None:
        paths = [config_dir, *filter(None, [server_env.get("JUPYTER_CONFIG_PATH")])]
        server_env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(paths)
    c.Spawner.environment = server_env


# Managed-mode knobs that mean nothing to a service the hub does not start.
_MANAGED_ONLY = ("GPULAB_BILLING_PORT", "GPULAB_BILLING_DB_URL", "GPULAB_BILLING_ARGS")


def _server_url_setting() -> str:
    """``GPULAB_BILLING_SERVER_URL``, checked: where servers reach billing, or "" for the
    default (the service's own address). A path is allowed, and expected: the proxy's route is
    ``/services/billing/`` under the hub's base URL."""

    url = settings.get("GPULAB_BILLING_SERVER_URL")  # SettingError (a ValueError) if bad
    if not url:
        return ""
    # Servers append api/v1/... to it, as to the default.
    return url.rstrip("/") + "/"


def _external_service() -> tuple[dict[str, Any], str]:
    """The service entry for a billing service the hub does not start, and the URL servers use."""

    # http(s)://HOST:PORT with no path (the service serves under /services/billing/): the table
    # refuses anything else, naming the variable.
    url = settings.get("GPULAB_BILLING_EXTERNAL_URL")
    token = settings.get("GPULAB_BILLING_API_TOKEN")
    if len(token) < 16:
        raise ValueError(
            "GPULAB_BILLING_API_TOKEN: required with GPULAB_BILLING_EXTERNAL_URL, at least 16 "
            "characters (the billing service's hub token, shared with the service as "
            "JUPYTERHUB_API_TOKEN; e.g. `openssl rand -hex 32`)"
        )
    for key in _MANAGED_ONLY:
        if settings.is_set(key):
            log.warning(
                "%s is ignored with GPULAB_BILLING_EXTERNAL_URL: set it on the service", key
            )
    # By default servers reach the service where the hub does; GPULAB_BILLING_SERVER_URL says
    # otherwise (docker-compose: user containers can't reach this address, they use the proxy).
    return {"url": url, "api_token": token}, f"{url}/services/billing/"


def _hub_ports(c) -> set[int]:
    """The ports this hub's own processes will listen on (not bound yet while config loads)."""

    ports = set()
    for section, key in (("JupyterHub", "port"), ("JupyterHub", "hub_port")):
        if key in c[section]:
            ports.add(int(c[section][key]))
    if "api_url" in c.ConfigurableHTTPProxy:
        port = urlparse(c.ConfigurableHTTPProxy.api_url).port
        if port:
            ports.add(port)
    return ports


def _free_port_besides(taken: set[int], pick: Callable[[], int]) -> int:
    """A free port that is none of ``taken``: the hub's ports are chosen before anything binds
    them, so a free port can be one the proxy is about to take (seen: billing on the proxy's
    public port, every start refused)."""
    while True:
        port = pick()
        if port not in taken:
            return port


def _managed_service(
    c, data_dir: str, catalog: str, min_minutes: str
) -> tuple[dict[str, Any], str]:
    """The service entry for a billing service the hub starts, and the URL servers use."""

    # Port and token are kept in the data dir: after a hub restart (even a SIGKILL) the servers
    # still running keep reporting to the same URL, and the service keeps the same identity.
    data = Path(data_dir)
    port_file = data / "billing-port"
    if settings.get("GPULAB_BILLING_PORT"):
        port = settings.get("GPULAB_BILLING_PORT")
    elif port_file.exists():
        port = int(port_file.read_text())
    else:
        port = _free_port_besides(_hub_ports(c), random_port)
        port_file.write_text(str(port))
    token = secret_file(data / "billing-api-token")
    # The service listens where the hub's API does, because every server must reach both: on
    # loopback for local servers, on the host's address on the containers' network for the Docker
    # spawner (configure_docker sets hub_ip and maybe hub_connect_ip before this runs). Servers
    # use hub_connect_ip where one is set, as they do for the hub's API.
    hub_ip = c.JupyterHub.hub_ip if "hub_ip" in c.JupyterHub else "127.0.0.1"
    listen = hub_ip if hub_ip not in ("", "0.0.0.0", "::") else "127.0.0.1"
    connect = (c.JupyterHub.hub_connect_ip if "hub_connect_ip" in c.JupyterHub else "") or listen
    env = {
        "GPULAB_HUB_PID": str(os.getpid()),
        "GPULAB_DATA_DIR": data_dir,
        "GPULAB_CATALOG": catalog,
        "GPULAB_BILLING_MIN_MINUTES": min_minutes,
    }
    if settings.get("GPULAB_BILLING_DB_URL"):
        env["GPULAB_BILLING_DB_URL"] = settings.get("GPULAB_BILLING_DB_URL")
    if settings.is_set("GPULAB_BILLING_STORAGE_INTERVAL"):
        key = "GPULAB_BILLING_STORAGE_INTERVAL"
        env[key] = settings.setting(key).text(settings.get(key))
    service = {
        "url": f"http://{listen}:{port}",
        "api_token": token,
        "command": [
            sys.executable,
            "-m",
            "gpulab.billing_service",
            *settings.get("GPULAB_BILLING_ARGS"),
        ],
        "environment": env,
    }
    return service, f"http://{connect}:{port}/services/billing/"


def _reporter_config_dir() -> str | None:

    spec = importlib.util.find_spec("gpulab_reporter")
    if spec is None or spec.origin is None:
        return None
    config = Path(spec.origin).parent.parent / "jupyter-config"
    return str(config) if (config / "jupyter_server_config.d").is_dir() else None
