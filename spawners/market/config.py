"""The spot market's settings: every ``c.SpotMarket.*`` option, with its checks.

:class:`~gpulab.spawners.market.hub.SpotMarket` inherits them, so the options keep their
``SpotMarket`` names in a hub's config.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from traitlets import Any, Bool, Float, Instance, List, Unicode, default, validate
from traitlets.config import SingletonConfigurable

from gpulab.spawners.market.core import Schedule
from gpulab.spawners.market.outbound import Network, parse_networks
from gpulab.spawners.node.pool import GpuPool


class SpotMarketConfig(SingletonConfigurable):
    """Options of the spot market (see SpotMarket)."""

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

    webhook_allowed_networks = List(
        Unicode(),
        [],
        config=True,
        help="""Networks (CIDR, e.g. '10.20.0.0/16') the preemption webhook may be sent to besides
        public addresses. Empty: only public addresses; loopback, private, link-local and other
        internal addresses are refused, so a user's webhook URL cannot probe the hub's host or
        network (the proxy's and hub's APIs, PostgreSQL, billing).""",
    )

    compensation_hook = Any(
        None,
        allow_none=True,
        config=True,
        help="""An async callable(user, server, at, reason, checkpoint, key) that credits a user
        whose reclaimed spot server was stopped while its checkpoint ran, before the time the
        platform promised it (never for a checkpoint command that failed or ran past its limit
        on its own: that is the user's). Set by gpulab's billing wiring; ``key`` makes it
        idempotent. None: no compensation.""",
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

    @validate("webhook_allowed_networks")
    def _check_networks(self, proposal: dict) -> list[str]:
        try:
            parse_networks(proposal["value"])
        except ValueError as e:
            raise ValueError(f"webhook_allowed_networks: {e}") from None
        return proposal["value"]

    @property
    def webhook_networks(self) -> list[Network]:
        return parse_networks(self.webhook_allowed_networks)

    @validate("low_price_windows")
    def _check_windows(self, proposal: dict) -> list[str]:
        Schedule.parse(proposal["value"])
        return proposal["value"]
