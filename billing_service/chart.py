"""The statement page's chart of spend per day: an SVG bar chart laid out here, on the server.

It draws the usage API's ``daily`` list itself (``daily.daily``), one bar per entry, so the page
and the API cannot disagree. Nothing runs in the browser and nothing is fetched: the template
writes this layout out as inline SVG (escaped like the rest of the page). Each bar carries its
day and exact amount (``data-date``, ``data-amount``) and a ``<title>`` shown on hover; the page
puts the same numbers in a table for screen readers and copying.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpulab.billing_service.rating import format_money

WIDTH = 760
HEIGHT = 260
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 14, 52
# The narrowest a date label may be given before labels start to skip days.
LABEL_PX = 46
# Y-axis steps: 1, 2, 2.5 or 5 times a power of ten, never finer than a cent (amounts are shown
# in cents).
STEPS = (Decimal(1), Decimal(2), Decimal("2.5"), Decimal(5), Decimal(10))
CENT = Decimal("0.01")
Y_TICKS = 4


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    date: str
    amount: str  # exact decimal string, as in the API
    display: str  # rounded to cents
    seconds: float
    tooltip: str


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class Label:
    x: float
    text: str


@dataclass(frozen=True)
class BarChart:
    width: int
    height: int
    left: float
    right: float
    top: float
    bottom: float
    bars: list[Bar]
    y_ticks: list[Tick]
    x_labels: list[Label]
    title: str
    description: str


def nice_step(raw: Decimal) -> Decimal:
    """The smallest 1/2/2.5/5 x 10^k step at or above ``raw``, at least a cent."""
    if raw <= CENT:
        return CENT
    power = Decimal(10) ** raw.adjusted()
    return next(m * power for m in STEPS if m * power >= raw)


def bar_chart(daily: list[dict[str, Any]], currency: str, time_zone: str) -> BarChart:
    """The layout of ``daily`` (the usage API's list) as bars over a y-axis in ``currency``."""
    amounts = [Decimal(d["amount"]) for d in daily]
    top_amount = max([*amounts, Decimal(0)])
    step = nice_step((top_amount / Y_TICKS).quantize(CENT, rounding=ROUND_CEILING))
    # The top tick: a whole number of steps (Decimal's // truncates, so round up explicitly).
    scale_top = step * max(1, (top_amount / step).to_integral_value(rounding=ROUND_CEILING))
    plot_h = HEIGHT - TOP - BOTTOM
    plot_w = WIDTH - LEFT - RIGHT
    bottom = TOP + plot_h

    def y_of(amount: Decimal) -> float:
        return bottom - float(max(amount, Decimal(0)) / scale_top) * plot_h

    n = len(daily)
    pitch = plot_w / n if n else plot_w
    bar_w = max(pitch * 0.7, 1.0)
    bars = []
    for i, (d, amount) in enumerate(zip(daily, amounts, strict=True)):
        y = y_of(amount)
        shown = format_money(d["micro"])
        bars.append(
            Bar(
                x=round(LEFT + i * pitch + (pitch - bar_w) / 2, 2),
                y=round(y, 2),
                width=round(bar_w, 2),
                height=round(bottom - y, 2),
                date=d["date"],
                amount=d["amount"],
                display=shown,
                seconds=d["seconds"],
                tooltip=f"{d['date']} ({time_zone}): {currency} {shown}, "
                f"{d['seconds']:.0f} s billed",
            )
        )
    ticks = []
    value = Decimal(0)
    while value <= scale_top:
        ticks.append(Tick(round(y_of(value), 2), str(value.quantize(CENT))))
        value += step
    every = max(1, -(-n * LABEL_PX // plot_w)) if n else 1
    labels = [
        Label(round(LEFT + i * pitch + pitch / 2, 2), d["date"][5:])
        for i, d in enumerate(daily)
        if i % every == 0
    ]
    total = format_money(sum(d["micro"] for d in daily))
    span = f"{daily[0]['date']} to {daily[-1]['date']}" if daily else "no days"
    return BarChart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        right=WIDTH - RIGHT,
        top=TOP,
        bottom=bottom,
        bars=bars,
        y_ticks=ticks,
        x_labels=labels,
        title=f"Spend per day ({time_zone}), {currency}",
        description=f"{n} days, {span}: {currency} {total} in all; "
        f"highest day {currency} {format_money(max([d['micro'] for d in daily], default=0))}.",
    )
