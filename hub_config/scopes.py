"""gpulab's custom scopes and the roles that hold them, assembled in one place.

Handlers check these with JupyterHub's RBAC (``needs_scope``); nothing in gpulab checks an admin
flag by hand. :func:`base_roles` is what ``configure(c)`` loads; billing adds its own role through
:mod:`gpulab.hub_config.billing.hooks`.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.scopes import define_custom_scopes

READ_POOL_SCOPE = "custom:gpulab:read-pool"
SET_PRICE_SCOPE = "custom:gpulab:set-spot-price"
SETTINGS_SCOPE = "custom:gpulab:spot-settings"
# Reporting usage to billing is tied to one server: a server's own token holds it as
# ``!server=USER/NAME`` and billing accepts its reports for that server only.
REPORT_USAGE_SCOPE = "custom:gpulab:report-usage"
# Course staff hold these filtered to their course's group (``!group=ml101``): TAs and teachers
# read the course (roster, servers, credit), teachers also manage it (roster, limits, caps).
COURSE_READ_SCOPE = "custom:gpulab:course-read"
COURSE_MANAGE_SCOPE = "custom:gpulab:course-manage"
# Spending an account's money in advance (a monthly reservation): each user for themself and
# teachers for their course, through their log-in and their own tokens; never a server's own
# token, which course staff can read inside a student's server they reach (docs/security.md).
PREPAY_SCOPE = "custom:gpulab:prepay"
# Homes (hub_config/api/storage.py): reading a home's usage and quota (each user and their
# server's token for themself, !user; admins through admin:users; billing, unfiltered, meters
# from it), and changing the quota, which costs money: never a server's own token.
READ_STORAGE_SCOPE = "custom:gpulab:read-storage"
SET_STORAGE_SCOPE = "custom:gpulab:set-storage"
# SSH (hub_config/api/ssh.py): the gateway service alone asks who a key or token logs in as and
# where that user's server runs; each user manages their own public keys (their log-in and
# their own tokens, !user), never a server's own token (staff who reach a student's server
# could read it and add a key of theirs).
SSH_GATEWAY_SCOPE = "custom:gpulab:ssh-gateway"
SSH_KEYS_SCOPE = "custom:gpulab:ssh-keys"
# A user's own GPU at work (hub_config/api/gpu_usage.py): each user and their server's token for
# themself (!user), admins through admin:users; course staff do not hold it.
READ_GPU_USAGE_SCOPE = "custom:gpulab:read-gpu-usage"
# Published ports (hub_config/api/ports.py): each user publishes and revokes their own server's
# ports (their log-in and their own tokens, !user), never a server's own token (staff who reach a
# student's server could read it and make the student's app public).
PUBLISH_PORTS_SCOPE = "custom:gpulab:publish-ports"
# Training jobs (hub_config/api/jobs.py): each user submits, reads, follows and cancels their own
# jobs (their log-in, their own tokens and their servers' tokens, !user; JupyterLab's Jobs panel
# submits with the server's token); admins hold it for everyone.
JOBS_SCOPE = "custom:gpulab:jobs"

CUSTOM_SCOPES: dict[str, dict[str, str]] = {
    READ_POOL_SCOPE: {
        "description": "Read the GPU pool (free cards, prices) and the platform catalog.",
    },
    SET_PRICE_SCOPE: {"description": "Pin or unpin the spot price of a GPU type."},
    SETTINGS_SCOPE: {
        "description": "Read and change spot settings: the preemption webhook (with its HMAC "
        "secret) and the checkpoint command."
    },
    REPORT_USAGE_SCOPE: {
        "description": "Report a server's kernel and app usage to billing (held by each "
        "server's own token, for that server only).",
    },
    COURSE_READ_SCOPE: {
        "description": "Read a course: its roster, its students' servers and credit, its "
        "bookings (course staff hold it as !group=COURSE).",
    },
    PREPAY_SCOPE: {
        "description": "Prepay from an account (monthly reservations): users hold it for "
        "themselves (!user); a server's own token never holds it.",
    },
    READ_STORAGE_SCOPE: {
        "description": "Read homes' usage and quotas (users hold it for themselves: !user; "
        "billing, unfiltered, meters storage from it).",
    },
    SET_STORAGE_SCOPE: {
        "description": "Change a home's quota (paid per GB-day above the free size): users hold "
        "it for themselves (!user); a server's own token never holds it.",
    },
    READ_GPU_USAGE_SCOPE: {
        "description": "Read the hub's measurement of a user's GPUs (utilisation, memory, "
        "processes, idle time, the idle nudge): users hold it for themselves (!user).",
    },
    SSH_GATEWAY_SCOPE: {
        "description": "The SSH gateway: check a user's SSH key or token and read where their "
        "server runs (held by the gpulab-ssh service only).",
    },
    SSH_KEYS_SCOPE: {
        "description": "List, add and remove SSH public keys (users hold it for themselves: "
        "!user; a server's own token never holds it).",
    },
    PUBLISH_PORTS_SCOPE: {
        "description": "List, publish and revoke published ports of a server (users hold it for "
        "themselves: !user; a server's own token never holds it).",
    },
    JOBS_SCOPE: {
        "description": "Submit, list, read the output of and cancel training jobs (users hold "
        "it for themselves: !user, their servers' tokens too).",
    },
    COURSE_MANAGE_SCOPE: {
        "description": "Manage a course: import its roster, set its limits and caps, book lab "
        "sessions (teachers hold it as !group=COURSE).",
        "subscopes": [COURSE_READ_SCOPE],
    },
}
# Defined at import as well as through JupyterHub.custom_scopes: needs_scope() checks the name
# when the handlers are declared, before the hub reads its config. Same definition, no conflict.
define_custom_scopes(CUSTOM_SCOPES)

# What a server's own token may do besides JupyterHub's defaults: read the pool, restart its
# own server in another mode (the JupyterLab toggle), report that server's usage to billing and
# read its owner's home usage (the status bar).
# It does not hold SETTINGS_SCOPE, so code in a notebook can neither read the webhook's signing
# secret nor redirect the webhook.
SERVER_TOKEN_SCOPES = [
    "access:servers!server",
    "users:activity!user",
    "read:users:name!user",
    "read:servers!user",
    "servers!user",
    READ_POOL_SCOPE,
    f"{REPORT_USAGE_SCOPE}!server",
    # JupyterLab's status bar: its own user's home usage, read-only (SET_STORAGE_SCOPE is not here).
    f"{READ_STORAGE_SCOPE}!user",
    # JupyterLab's GPU item and panel: its own user's cards as the hub measures them, read-only.
    f"{READ_GPU_USAGE_SCOPE}!user",
    # JupyterLab's Jobs panel and `gpulab jobs` in a terminal: its own user's jobs.
    f"{JOBS_SCOPE}!user",
]

MARKET_SERVICE = "gpulab-market"
SSH_SERVICE = "gpulab-ssh"
# Prometheus' scrape (GPULAB_PROMETHEUS_TOKEN): JupyterHub's /hub/metrics and billing's metrics,
# nothing else (docs/metrics.md).
PROMETHEUS_SERVICE = "gpulab-prometheus"
ADMIN_SERVICE = "gpulab-admin"


def base_roles(admin_name: str, *, admin_service: bool) -> list[dict[str, Any]]:
    """The roles of a gpulab hub (before billing adds its own)."""
    # Spot settings hold the webhook's HMAC secret: each user for themself (log-in session and
    # the tokens they create), never a server's own token (see SERVER_TOKEN_SCOPES).
    roles: list[dict[str, Any]] = [
        {
            "name": "user",
            "scopes": [
                "self",
                READ_POOL_SCOPE,
                f"{SETTINGS_SCOPE}!user",
                f"{PREPAY_SCOPE}!user",
                f"{READ_STORAGE_SCOPE}!user",
                f"{SET_STORAGE_SCOPE}!user",
                f"{SSH_KEYS_SCOPE}!user",
                f"{READ_GPU_USAGE_SCOPE}!user",
                f"{PUBLISH_PORTS_SCOPE}!user",
                f"{JOBS_SCOPE}!user",
                # JupyterHub gives a server's token only what its owner holds, so the owner must
                # hold the report scope for SERVER_TOKEN_SCOPES' `!server` grant to survive.
                # Billing accepts only the `!server=USER/NAME` form, so the user's other tokens
                # (which carry `!user`) still cannot report.
                f"{REPORT_USAGE_SCOPE}!user",
            ],
        }
    ]
    if admin_service:
        roles.append({"name": "admin", "services": [ADMIN_SERVICE]})
        roles.append(
            {"name": "gpulab-service", "scopes": [READ_POOL_SCOPE], "services": [ADMIN_SERVICE]}
        )
    # Pinning spot prices is an operator's act: admins (and the admin service) hold the scope;
    # they also read and set any user's spot settings.
    roles.append(
        {
            "name": "gpulab-market-admin",
            "scopes": [SET_PRICE_SCOPE, SETTINGS_SCOPE, READ_POOL_SCOPE, JOBS_SCOPE],
            "users": [admin_name],
            "services": [ADMIN_SERVICE] if admin_service else [],
        }
    )
    # Operators run every course (create them with admin:groups, then rosters, bookings, caps).
    roles.append(
        {
            "name": "gpulab-course-admin",
            "scopes": [COURSE_MANAGE_SCOPE, "admin:groups", PREPAY_SCOPE],
            "users": [admin_name],
            "services": [ADMIN_SERVICE] if admin_service else [],
        }
    )
    # The spot market starts queued servers and stops reclaimed ones through the REST API; the
    # activity observer (same service) records servers' activity and moves idle GPUs.
    roles.append(
        {
            "name": MARKET_SERVICE,
            "scopes": ["admin:servers", "read:users", "users:activity", READ_POOL_SCOPE],
            "services": [MARKET_SERVICE],
        }
    )
    return roles


def prometheus_role() -> dict[str, Any]:
    """The scrape's role: ``read:metrics`` only (no user, server or pool data)."""
    return {
        "name": PROMETHEUS_SERVICE,
        "scopes": ["read:metrics"],
        "services": [PROMETHEUS_SERVICE],
    }


def grant(roles: list[dict[str, Any]], role_name: str, *scopes: str) -> None:
    """Add ``scopes`` to the role named ``role_name`` (which must exist)."""
    for role in roles:
        if role["name"] == role_name:
            role["scopes"] = [*role.get("scopes", []), *scopes]
            return
    raise KeyError(f"no role {role_name!r}")
