"""A lab-session booking is checked whole before any card is held (hub_config/courses/bookings.py:
``parse_booking``): each refusal names its field, and a good ask comes back as asked."""

from __future__ import annotations

import pytest

from gpulab.catalog import load_catalog
from gpulab.hub_config.courses.bookings import BookingKeeper, parse_booking
from gpulab.hub_config.courses.groups import CourseError
from gpulab.spawners.courses import Course, CourseLimits

CATALOG = load_catalog()
COURSE = Course(name="ml101", limits=CourseLimits(gpu_types=("none", "rtx-4090")))
NOW = 1_900_000_000.0


def ask(**body):
    return parse_booking(body, COURSE, CATALOG, BookingKeeper(), NOW)


def refused(**body) -> CourseError:
    with pytest.raises(CourseError) as e:
        ask(**body)
    return e.value


def test_a_good_ask_comes_back_as_asked():
    got = ask(gpu_type="rtx-4090", cards=2, start=NOW + 600, minutes=90)
    assert (got.gpu_type, got.cards, got.start, got.end) == ("rtx-4090", 2, NOW + 600, NOW + 6000)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"gpu_type": "rtx-4090", "cards": 1, "start": NOW, "minutes": 60, "x": 1}, 400, "x"),
        ({"gpu_type": "h100", "cards": 1, "start": NOW, "minutes": 60}, 400, "gpu_type"),
        ({"gpu_type": "a100-80g", "cards": 1, "start": NOW, "minutes": 60}, 403, "gpu_type"),
        ({"gpu_type": "rtx-4090", "cards": True, "start": NOW, "minutes": 60}, 400, "cards"),
        ({"gpu_type": "rtx-4090", "cards": 0, "start": NOW, "minutes": 60}, 400, "cards"),
        ({"gpu_type": "rtx-4090", "cards": 1, "start": NOW, "minutes": -5}, 400, "minutes"),
        ({"gpu_type": "rtx-4090", "cards": 1, "start": NOW - 7200, "minutes": 60}, 400, "start"),
        ({"gpu_type": "rtx-4090", "cards": 1, "start": NOW, "minutes": 60 * 24}, 400, "minutes"),
        (
            {"gpu_type": "rtx-4090", "cards": 1, "start": NOW + 86400 * 60, "minutes": 60},
            400,
            "start",
        ),
        (
            {"gpu_type": "rtx-4090", "cards": 1, "start": NOW, "minutes": 60, "end": NOW + 60},
            400,
            "end",
        ),
    ],
)
def test_each_refusal_names_its_field(body, status, field):
    e = refused(**body)
    assert (e.status, e.field) == (status, field), e
