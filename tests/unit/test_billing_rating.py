"""A session's charge rated in one place (``rating.rate_charge``): the amount is the one rounding
of all its billed time, and a course session's split by period adds up to it exactly, whatever
the periods, the reservation window and the pricing."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.billing_service import courses
from gpulab.billing_service.models import MICRO
from gpulab.billing_service.rating import OUTSIDE, PriceBook, merge, rate_charge
from gpulab.catalog import load_catalog

PRICES = PriceBook(load_catalog())
MONDAY = int(datetime(2026, 6, 1, tzinfo=UTC).timestamp()) * MICRO
WEEK = 7 * 86_400 * MICRO
TERM = courses.Settings(period="term", term_start=date(2026, 6, 3), term_end=date(2026, 6, 9))


def session(course: str | None, gpu: str = "a100-80g", gpus: int = 1, pricing: str = "on-demand"):
    options = json.dumps({"course": course} if course else {})
    return SimpleNamespace(gpu_type=gpu, gpus=gpus, pricing=pricing, options=options)


def test_a_personal_session_is_rated_once_without_periods() -> None:
    sess = session(None)
    merged = [(MONDAY, MONDAY + 3600 * MICRO)]
    charge = rate_charge(PRICES, sess, merged)
    assert charge.amount_micro == PRICES.cost_micro("a100-80g", 1, "on-demand", merged)
    assert charge.billed_us == 3600 * MICRO and charge.periods == {}


def test_a_course_session_over_a_week_boundary_is_split_by_its_seconds() -> None:
    sess = session("ml101")
    merged = [(MONDAY + WEEK - 1800 * MICRO, MONDAY + WEEK + 5400 * MICRO)]
    charge = rate_charge(PRICES, sess, merged, cut=courses.Settings().cut)
    # Education price of a100-80g: 1.50 per card-hour; 2 h in all, a quarter of it in week 1.
    assert charge.amount_micro == 3 * MICRO
    assert charge.periods == {
        MONDAY: (MONDAY + WEEK, 750_000),
        MONDAY + WEEK: (MONDAY + 2 * WEEK, 2_250_000),
    }


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3 * WEEK), st.integers(1, 40 * 3600 * MICRO)),
        min_size=0,
        max_size=6,
    ),
    st.sampled_from(["a100-80g", "rtx-4090", "none"]),
    st.integers(1, 4),
    st.sampled_from([courses.Settings(), TERM]),
    st.one_of(st.none(), st.tuples(st.integers(0, 2 * WEEK), st.integers(1, WEEK))),
)
def test_the_periods_add_up_to_the_amount(spans, gpu, gpus, rules, prepaid) -> None:
    merged = merge([(MONDAY + a, MONDAY + a + n) for a, n in spans])
    window = None if prepaid is None else (MONDAY + prepaid[0], MONDAY + sum(prepaid))
    sess = session("ml101", gpu, gpus)
    charge = rate_charge(PRICES, sess, merged, window, rules.cut)
    assert charge.amount_micro == rate_charge(PRICES, sess, merged, window).amount_micro
    assert sum(micro for _, micro in charge.periods.values()) == charge.amount_micro
    assert all(micro >= 0 for _, micro in charge.periods.values())
    if rules.period == "week":
        assert OUTSIDE not in charge.periods
