"""Prices in force, and the cost of billed time.

Rounding rule (the one place money is rounded):

- Prices come from the catalog as Decimals with at most 6 decimal places, so a price per hour is an
  exact whole number of micro-units per hour.
- A server session's amount is computed from its whole billed time at once:
  ``sum(price_micro_per_hour x microseconds) / 3,600,000,000``, rounded half-to-even to whole
  micro-units (1 CNY = 1,000,000 micro-units). The ledger records the difference between that
  amount and what the session was already charged, so the charges of a session always add up to
  the rounded amount of its total time, never to a sum of rounded pieces.
- Presentation rounds micro-units to the currency's cents, half-to-even (``format_money``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from decimal import ROUND_HALF_EVEN, Decimal

from gpulab.billing_service.models import MICRO
from gpulab.hub_config.catalog import Catalog

US_PER_HOUR = 3600 * MICRO


def to_micro(amount: Decimal) -> int:
    """An exact Decimal amount in micro-units; refuses amounts finer than a micro-unit."""
    micro = amount * MICRO
    if micro != micro.to_integral_value():
        raise ValueError(f"{amount} has more than 6 decimal places")
    return int(micro)


def from_micro(micro: int) -> Decimal:
    return Decimal(micro) / MICRO


def format_money(micro: int) -> str:
    """Micro-units as a currency amount with two decimals (half-to-even), e.g. ``9.87``."""
    return str(from_micro(micro).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


def round_div(numerator: int, denominator: int) -> int:
    """numerator / denominator rounded half-to-even, in integers."""
    q, r = divmod(numerator, denominator)
    twice = 2 * r
    if twice > denominator or (twice == denominator and q % 2 == 1):
        q += 1
    return q


class PriceBook:
    """What one second of a server costs at a given time.

    ``price_at`` and ``change_points`` are the seam for spot prices: the spot market supplies a
    price series per GPU type; until then spot seconds are rated at the on-demand price.
    """

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def price_at(self, gpu_type: str, pricing: str, t_us: int) -> Decimal:
        """Price per card-hour (per hour in no-GPU mode) in force at ``t_us``."""
        if gpu_type in ("", "none"):
            return self.catalog.no_gpu.price_per_hour
        gpu = self.catalog.gpu_types.get(gpu_type)
        if gpu is None:
            raise KeyError(f"unknown GPU type {gpu_type!r}")
        # Spot: rated at on-demand until the spot market provides its series.
        return gpu.on_demand_price

    def change_points(self, gpu_type: str, pricing: str, start_us: int, end_us: int) -> list[int]:
        """Times strictly inside (start, end) where the price changes (none for fixed prices)."""
        return []

    def rate_micro_per_hour(self, gpu_type: str, gpus: int, pricing: str, t_us: int) -> int:
        price = to_micro(self.price_at(gpu_type, pricing, t_us))
        return price * (gpus if gpu_type not in ("", "none") else 1)

    def _pieces(
        self, gpu_type: str, pricing: str, intervals: Iterable[tuple[int, int]]
    ) -> Iterator[tuple[int, int]]:
        for start, end in intervals:
            cuts = [start, *self.change_points(gpu_type, pricing, start, end), end]
            for a, b in itertools.pairwise(cuts):
                if b > a:
                    yield a, b

    def cost_micro(
        self, gpu_type: str, gpus: int, pricing: str, intervals: Iterable[tuple[int, int]]
    ) -> int:
        """The amount for these (disjoint) billed intervals, rounded once (see module doc)."""
        total = 0
        for a, b in self._pieces(gpu_type, pricing, intervals):
            total += self.rate_micro_per_hour(gpu_type, gpus, pricing, a) * (b - a)
        return round_div(total, US_PER_HOUR)


def merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]
