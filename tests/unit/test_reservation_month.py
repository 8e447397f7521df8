"""The month a reservation covers: from now when it has begun, bad months named."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpulab.hub_config.api.reservations import month_window

NOW = datetime(2026, 12, 1, 22, 0, tzinfo=UTC).timestamp()


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_a_begun_month_runs_from_now_to_its_end() -> None:
    assert month_window("2026-12", NOW, 11) == (NOW, ts(2027, 1, 1))
    assert month_window("2026-12", NOW + 0.7, 11) == (NOW, ts(2027, 1, 1))  # whole seconds


def test_a_later_month_is_whole_and_december_rolls_over() -> None:
    assert month_window("2027-02", NOW, 11) == (ts(2027, 2, 1), ts(2027, 3, 1))
    assert month_window("2027-11", NOW, 11) == (ts(2027, 11, 1), ts(2027, 12, 1))


@pytest.mark.parametrize(
    ("month", "message"),
    [
        ("2026-11", "2026-11 is over"),
        ("2027-12", "at most 11 months ahead"),
        ("december", "must be a month like 2026-12"),
        ("2026-13", "must be a month like 2026-12"),
        (None, "must be a month like 2026-12"),
    ],
)
def test_bad_months_are_named(month, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        month_window(month, NOW, 11)
