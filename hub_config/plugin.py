"""The one place that wires gpulab into a JupyterHub process.

Two moments:

- **config time**, :func:`configure_plugin` (called by ``configure(c)``): the authenticator that
  lets gpulab mount its routes, the scopes and roles, the spot market's service token, billing's
  service and spawner hooks.
- **hub start**, :func:`attach` (called by the authenticator's ``get_handlers``: JupyterHub asks
  only its authenticator for routes mounted *ahead* of its own, and hands it the app): the GPU pool
  and its orphan sweep, the spawner class's node hooks, the spot market's loop, the activity
  observer (:mod:`.observer`), the job scheduler (:mod:`.jobs.scheduler`), and the routes of
  :mod:`.api` (gpulab's JSON API) and :mod:`.overrides` (JupyterHub pages gpulab changes).

Sweeps and the market wait until the hub answers on its own REST API: JupyterHub restores its
spawners before it listens (``init_spawners_timeout = -1``, set here), so from then on an
allocation that no spawner claimed really is an orphan.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tornado.httpclient import AsyncHTTPClient

from gpulab.hub_config import api, overrides
from gpulab.hub_config.api import reservations, uploads
from gpulab.hub_config.api.ssh import configure_ssh
from gpulab.hub_config.billing.hooks import configure_billing
from gpulab.hub_config.billing.notices import notices_for
from gpulab.hub_config.billing.observer import ActivityObserver
from gpulab.hub_config.courses import autograde as course_autograde
from gpulab.hub_config.courses import bookings as course_bookings
from gpulab.hub_config.courses import dashboard as course_dashboard
from gpulab.hub_config.courses import groups as course_groups
from gpulab.hub_config.courses import handlers as course_handlers
from gpulab.hub_config.courses.assignments import configure_assignments
from gpulab.hub_config.home import TEMPLATES as HOME_TEMPLATES
from gpulab.hub_config.jobs.scheduler import JobScheduler
from gpulab.hub_config.metrics.collector import install as install_metrics
from gpulab.hub_config.metrics.sampler import CardSampler, cpu_by_card
from gpulab.hub_config.origin import install_host_guard
from gpulab.hub_config.scopes import (
    CUSTOM_SCOPES,
    MARKET_SERVICE,
    PROMETHEUS_SERVICE,
    SERVER_TOKEN_SCOPES,
    base_roles,
    prometheus_role,
)
from gpulab.hub_config.storage_keeper import StorageKeeper
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.market.hub_client import HubClient
from gpulab.spawners.mixin import GpuSpawnerMixin
from gpulab.spawners.node.pool import GpuPool

AUTHENTICATOR = "gpulab.hub_config.auth.GpulabAuthenticator"


def configure_plugin(
    c: Any,
    *,
    data_dir: str,
    catalog: str,
    admin_name: str,
    admin_token: str,
    market_token: str,
    hub_api_url: str,
    prometheus_token: str = "",
) -> None:
    """Everything gpulab adds to a hub config ``c``, after the JupyterHub basics are set."""
    c.JupyterHub.authenticator_class = AUTHENTICATOR
    # Restored spawners must have claimed their GPUs before the orphan sweep runs (see attach).
    c.JupyterHub.init_spawners_timeout = -1
    c.JupyterHub.custom_scopes = dict(CUSTOM_SCOPES)
    roles = base_roles(admin_name, admin_service=bool(admin_token))
    services: list[dict[str, Any]] = []
    if admin_token:
        services.append({"name": "gpulab-admin", "api_token": admin_token})
    services.append({"name": MARKET_SERVICE, "api_token": market_token})
    if prometheus_token:
        # Prometheus scrapes /hub/metrics (and billing's) with it: read:metrics only.
        services.append({"name": PROMETHEUS_SERVICE, "api_token": prometheus_token})
        roles.append(prometheus_role())
    c.JupyterHub.services = services
    configure_billing(c, data_dir, catalog, roles)
    # The SSH gateway (GPULAB_SSH_PORT; 0: none), its token and its role (hub_config/api/ssh.py).
    configure_ssh(c, data_dir, roles)
    configure_assignments(c)
    c.JupyterHub.load_roles = roles
    c.SpotMarket.api_token = market_token
    c.SpotMarket.hub_api_url = hub_api_url
    c.Spawner.server_token_scopes = list(SERVER_TOKEN_SCOPES)
    # gpulab's home page (hub_config/templates/home.html) ahead of JupyterHub's own templates.
    paths = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    # The courses' home-page part (invitations, held cards), included by home.html.
    c.JupyterHub.template_paths = [str(HOME_TEMPLATES), str(course_dashboard.TEMPLATES), *paths]


def routes() -> list[tuple[str, type]]:
    """gpulab's routes, to be mounted ahead of JupyterHub's own."""
    return [
        *api.ROUTES,
        *course_handlers.ROUTES,
        *course_bookings.ROUTES,
        *course_dashboard.ROUTES,
        *course_autograde.ROUTES,
        *overrides.ROUTES,
    ]


def attach(app: Any) -> list[tuple[str, type]]:
    """Start gpulab's parts of the hub ``app`` (idempotent) and return its routes."""
    pool = GpuPool.instance(config=app.config)
    if not getattr(pool, "_attached", False):
        pool._attached = True
        # Hub pages answer only under the hub's own host name (hub_config/origin.py).
        install_host_guard(app)
        # Published ports on users' host names (hub_config/api/ports.py).
        api.ports.install_proxy(app)
        # JupyterHub dropped the course roles its config does not load: derive them again.
        course_groups.sync_all(app.db)
        spawner_class = app.spawner_class
        spawner_class.prepare_node(pool, app.config)
        ready = asyncio.ensure_future(_hub_answers(app))
        pool.start_reconciling(after=ready, node_sweep=spawner_class.sweep_node)
        market = SpotMarket.instance(config=app.config, pool=pool)
        if not market.hub_api_url:
            market.hub_api_url = app.hub.api_url
        market.find_spawner = lambda owner: _find_spawner(app, owner)
        market.start(after=ready)
        observer = ActivityObserver.instance(
            config=app.config,
            hub_api=HubClient(market.hub_api_url, market.api_token).request,
            notices=notices_for(pool.data_dir),
        )
        observer.start(lambda: running_spawners(app), after=ready)
        # Training jobs: queued jobs started as their owners' job-* servers (hub_config/jobs/).
        scheduler = JobScheduler.instance(config=app.config)
        scheduler.attach(
            pool,
            market,
            HubClient(market.hub_api_url, market.api_token),
            lambda owner: _find_spawner(app, owner),
            notices=notices_for(pool.data_dir),
            spawner_record=lambda owner: _find_spawner(app, owner, make=True),
        )
        scheduler.start(after=ready)
        # The hub's metrics: every card read periodically (simulated ones follow their holder's
        # CPU, as the observer measures it), and gpulab's families on /hub/metrics.
        sampler = CardSampler.instance(config=app.config)
        sampler.start(pool, lambda: cpu_by_card(pool, observer.trackers))
        install_metrics(app)
        keeper = course_bookings.BookingKeeper.instance(config=app.config)
        keeper.start(app, HubClient(market.hub_api_url, market.api_token), after=ready)
        # Homes kept and released on a schedule; restored servers count once the hub answers.
        StorageKeeper.instance(config=app.config).start(app, pool, market, after=ready)
        pool._confirming = asyncio.ensure_future(_confirm_reservations(app, pool, ready))
        # Unfinished uploads expire a day after their last chunk (hub_config/api/uploads.py).
        uploads.start_sweeping(pool, app.log)
    return routes()


async def _confirm_reservations(app: Any, pool: GpuPool, ready: Any) -> None:
    """Once the hub answers: billing confirms every reservation held (see reservations)."""
    await ready
    settings = reservations.ReservationsConfig.instance(config=app.config)
    try:
        await reservations.confirm_reservations(pool, settings.prepay_hook, app.log)
    except Exception:
        app.log.exception("Confirming the reservations with billing failed")


def running_spawners(app: Any) -> list[Any]:
    """The hub's gpulab servers that are up (not starting or stopping)."""
    return [
        spawner
        for user in list(app.users.values())
        for spawner in list(user.spawners.values())
        if isinstance(spawner, GpuSpawnerMixin) and spawner.ready
    ]


def _find_spawner(app: Any, owner: str, make: bool = False) -> Any:
    """The hub's spawner of ``owner``'s server; ``make``: also of a stopped server JupyterHub
    still has a record of (a wrapper made from its record, e.g. to read its log)."""
    name, _, server = owner.partition("/")
    user = app.users.get(name) if hasattr(app.users, "get") else None
    if user is None:
        try:
            user = app.users[name]
        except KeyError:
            return None
    spawner = user.spawners.get(server)
    if spawner is None and make and server in user.orm_spawners:
        spawner = user.spawners[server]
    return spawner


async def _hub_answers(app: Any, interval: float = 0.2) -> None:
    """Wait until the hub's REST API answers (JupyterHub listens only once it has started)."""
    client = AsyncHTTPClient()
    url = app.hub.api_url.rstrip("/") + "/"
    while True:
        try:
            await client.fetch(url, request_timeout=5, raise_error=False)
            return
        except Exception:
            await asyncio.sleep(interval)
