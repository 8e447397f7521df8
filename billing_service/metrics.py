"""Billing's Prometheus metrics, served on its own ``/metrics`` (``api/metrics``): is billing
keeping up, what did it earn and give, is the enforcer running, who is running out of money.

The operator's Prometheus scrapes them with the hub token of ``GPULAB_PROMETHEUS_TOKEN`` (its
``read:metrics`` scope) next to the hub's ``/hub/metrics``; the alert rules in ``monitoring/``
read them. Each service has its own registry (``BillingMetrics.registry``), never
prometheus_client's global one, so tests can run several services in one process.

Two kinds of figures:

- **counted where things happen**, in this process (they restart at 0 with it, as Prometheus
  expects of counters): ``gpulab_billing_ingest_total{source}`` (events taken by
  ``POST events``: ``observed`` is the hub's own ``activity`` samples, ``event`` everything
  else; ``storage``: homes metered from the hub's storage scan), the ingest latency (request
  received to committed), ``gpulab_billing_enforcer_actions_total{action}`` and the enforcer's
  last completed check;
- **read from the database at scrape time** (``revenue.totals``, kept ``cache_seconds`` so a
  storm of scrapes reads it once): revenue and credits (the ledger's charges and credits, the
  sums the statements give; each entry is read once, see ``revenue.Settled``), accounts and those below each ``[billing] low_balance_thresholds`` of the
  catalog, and the lag: now minus the newest sign of life committed for a running server (a
  heartbeat, a kernel's or the hub's observed sample, a start), 0 when no server runs. A
  reporter can make its server look fresher than billing is, never bill less by it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpulab.billing_service import revenue
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import to_micro

# Where ingested events come from (``gpulab_billing_ingest_total{source}``).
SOURCES = ("observed", "event", "storage")
# What the enforcer did: moved a GPU server to no-GPU mode, stopped a server (out of money,
# idle, or silent), closed the session of a server the hub no longer runs; failed: the hub
# call raised.
ACTIONS = ("no_gpu", "stop", "close", "failed")
READ_SCOPE = "read:metrics"  # JupyterHub's scope for /hub/metrics; billing's /metrics asks it too
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def thresholds_of(values: tuple[Decimal, ...] | list[Decimal]) -> list[tuple[str, int]]:
    """(label, micro-units) of each low-balance threshold, in the catalog's order."""
    return [(revenue.threshold_label(v), to_micro(v)) for v in values]


class _Ledger(Collector):
    """The families read from the database, from the last ``BillingMetrics.refresh``."""

    def __init__(self, metrics: BillingMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        figures = self.metrics.figures
        rev = CounterMetricFamily(
            "gpulab_billing_revenue",
            "Money charged (in the catalog currency): sessions by GPU type (none: no-GPU), "
            "pricing and course; prepaid reservations (pricing reservation); storage",
            labels=["type", "pricing", "course"],
        )
        credits = CounterMetricFamily(
            "gpulab_billing_credits",
            "Money given (in the catalog currency): credit (top-ups), refund (positive "
            "adjustments), compensation, trial",
            labels=["kind"],
        )
        below = GaugeMetricFamily(
            "gpulab_billing_balances_below",
            "User accounts whose balance is below the threshold (catalog [billing] "
            "low_balance_thresholds)",
            labels=["threshold"],
        )
        accounts = GaugeMetricFamily("gpulab_billing_accounts", "User accounts billing holds")
        lag = GaugeMetricFamily(
            "gpulab_billing_lag_seconds",
            "Seconds since the newest sample committed for a running server (0: none runs)",
        )
        if figures is not None:
            for (gpu_type, pricing, course), micro in sorted(figures.revenue.items()):
                rev.add_metric([gpu_type, pricing, course], micro / MICRO)
            for kind in revenue.CREDIT_KINDS:
                credits.add_metric([kind], figures.credits.get(kind, 0) / MICRO)
            for label, _ in self.metrics.thresholds:
                below.add_metric([label], figures.below.get(label, 0))
            accounts.add_metric([], figures.accounts)
            lag.add_metric([], self.metrics.lag_seconds())
        yield from (rev, credits, below, accounts, lag)


class BillingMetrics:
    """One service's metrics: its registry, the counters its code moves, and the cached
    database figures (``refresh`` before each exposition)."""

    def __init__(
        self,
        read: Callable[[list[tuple[str, int]], revenue.Settled | None], Awaitable[revenue.Totals]],
        thresholds: list[tuple[str, int]],
        cache_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.read = read
        self.thresholds = thresholds
        self.cache_seconds = cache_seconds
        self.clock = clock
        self.figures: revenue.Totals | None = None
        self.read_at = 0.0
        self._lock = asyncio.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        self.ingest = Counter(
            "gpulab_billing_ingest",
            "Events billing took: observed (the hub's activity samples), event (reporters' and "
            "the hub's other events), storage (homes metered from the hub's scan)",
            ["source"],
            registry=self.registry,
        )
        self.ingest_latency = Histogram(
            "gpulab_billing_ingest_latency_seconds",
            "Seconds from a batch of events received to committed",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.enforcer_actions = Counter(
            "gpulab_billing_enforcer_actions",
            "What the enforcer did: no_gpu (moved a GPU server to no-GPU mode), stop, close (a "
            "session whose server the hub no longer ran), failed",
            ["action"],
            registry=self.registry,
        )
        self.enforcer_last_run = Gauge(
            "gpulab_billing_enforcer_last_run_timestamp_seconds",
            "Unix time of the enforcer's last completed check (0: none yet)",
            registry=self.registry,
        )
        for source in SOURCES:
            self.ingest.labels(source)
        for action in ACTIONS:
            self.enforcer_actions.labels(action)
        self.registry.register(_Ledger(self))

    # ---- counted where things happen ---------------------------------------------------------

    def ingested(self, kinds: dict[str, int]) -> None:
        """Events of these kinds (kind -> count) were committed."""
        for kind, n in kinds.items():
            if n:
                self.ingest.labels("observed" if kind == "activity" else "event").inc(n)

    def enforced(self, action: str) -> None:
        self.enforcer_actions.labels(action.replace("-", "_")).inc()

    # ---- read at scrape time -----------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the database figures unless read within ``cache_seconds`` (one read at a
        time: concurrent scrapes share it)."""
        async with self._lock:
            if self.figures is not None and self.clock() - self.read_at < self.cache_seconds:
                return
            settled = self.figures.settled if self.figures is not None else None
            self.figures = await self.read(self.thresholds, settled)
            self.read_at = self.clock()

    def lag_seconds(self) -> float:
        figures = self.figures
        if figures is None or not figures.open_sessions or figures.newest_us is None:
            return 0.0
        return max(0.0, self.clock() - figures.newest_us / MICRO)
