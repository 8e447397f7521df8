"""Billing's HTTP API, one module per resource, every handler on one base (``base``).

- ``base``: who the caller is, every authorization rule (once), errors, ``from``/``to``;
- ``events``: ``POST events`` (reporters and the hub);
- ``balances``: ``GET users/NAME/balance``;
- ``credits``: ``users/NAME/credits``, ``courses/C/credits`` (the one ledger's credits);
- ``compensations``: ``POST users/NAME/compensations``;
- ``statements``: ``GET users/NAME/usage``, ``GET admin/overview``;
- ``courses``: ``courses/C``;
- ``reservations``: ``reservations``;
- ``storage``: ``GET users/NAME/storage``, ``POST storage/pull`` (read the hub's scan now);
- ``pages``: the statement page and ``statement.csv``;
- ``admin_revenue``: ``GET api/admin/revenue`` (the console's money, admins);
- ``metrics``: ``GET metrics`` (Prometheus, ``read:metrics`` or admins).

``routes`` mounts them under the service's prefix (``BillingService.make_app``).
"""

from __future__ import annotations

from typing import Any

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web

from gpulab.billing_service.api import (
    admin_revenue,
    balances,
    compensations,
    courses,
    credits,
    events,
    metrics,
    pages,
    reservations,
    statements,
    storage,
)


def routes(prefix: str) -> list[tuple[Any, ...]]:
    """Every route of the service under ``prefix`` (e.g. ``/services/billing/``)."""
    api = url_path_join(prefix, "api/v1")
    return [
        (url_path_join(api, "events"), events.EventsHandler),
        (url_path_join(api, r"users/([^/]+)/usage"), statements.UsageHandler),
        (url_path_join(api, r"users/([^/]+)/balance"), balances.BalanceHandler),
        (url_path_join(api, r"users/([^/]+)/credits"), credits.CreditsHandler),
        (url_path_join(api, r"users/([^/]+)/compensations"), compensations.CompensationsHandler),
        (url_path_join(api, r"courses/([^/]+)"), courses.CourseHandler),
        (url_path_join(api, r"courses/([^/]+)/credits"), credits.CourseCreditsHandler),
        (url_path_join(api, "reservations"), reservations.ReservationsHandler),
        (url_path_join(api, r"users/([^/]+)/storage"), storage.UserStorageHandler),
        (url_path_join(api, "storage/pull"), storage.PullHandler),
        (url_path_join(api, "admin/overview"), statements.OverviewHandler),
        # The console's money (contract: api/admin/revenue, not under v1) and Prometheus'.
        (url_path_join(prefix, "api/admin/revenue"), admin_revenue.RevenueHandler),
        (url_path_join(prefix, "metrics"), metrics.MetricsHandler),
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        (url_path_join(prefix, "statement.csv"), pages.CsvHandler),
        (prefix, pages.StatementPage),
        (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
    ]
