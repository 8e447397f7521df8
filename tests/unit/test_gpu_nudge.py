"""Issue 24, the idle nudge's prices and threshold (``hub_config/api/gpu_usage.py``): the nudge
names what the server costs now and what no-GPU mode would cost, from the one price function,
so a course student is told their education prices (1.50 and 0.05), not the on-demand ones, and
a bad ``GpuNudge.idle_minutes`` is refused naming the setting. Failed on the old code: there was
no nudge (``gpulab.hub_config.api.gpu_usage`` did not exist).
"""

from __future__ import annotations

import pytest
from traitlets import TraitError

from gpulab.catalog.models import load_catalog
from gpulab.hub_config.api.gpu_usage import GpuNudge, idle_for, nudge
from gpulab.spawners.options import parse_options


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_a_course_student_is_nudged_with_the_education_prices(catalog) -> None:
    student = parse_options({"gpu": "a100-80g", "gpus": 1, "course": "ml101"}, catalog)
    got = nudge(9 * 60, 8, student, catalog, auto_after=0)
    assert (got["price_now"], got["price_no_gpu"]) == ("1.50", "0.05")
    assert got["text"] == (
        "GPU idle for 9 min: switch to no-GPU mode and pay CNY 0.05/h instead of 1.50."
    )
    renter = parse_options({"gpu": "a100-80g", "gpus": 2}, catalog)
    got = nudge(8 * 60, 8, renter, catalog, auto_after=600)
    assert (got["price_now"], got["price_no_gpu"]) == ("4.20", "0.09")
    assert "A server that does no work for 10 min moves to no-GPU mode by itself" in got["text"]


def test_no_nudge_before_idle_minutes_without_a_figure_or_a_gpu(catalog) -> None:
    renter = parse_options({"gpu": "a100-80g", "gpus": 1}, catalog)
    assert nudge(8 * 60 - 1, 8, renter, catalog, auto_after=0) is None
    assert nudge(None, 8, renter, catalog, auto_after=0) is None
    assert nudge(3600, 0, renter, catalog, auto_after=0) is None  # 0 turns it off
    no_gpu = parse_options({"gpu": "none"}, catalog)
    assert nudge(3600, 8, no_gpu, catalog, auto_after=0) is None


class Sampler:
    def __init__(self, figures: dict) -> None:
        self.figures = figures

    def idle_seconds(self, uuid: str):
        return self.figures.get(uuid)


def test_a_server_is_as_idle_as_its_busiest_card() -> None:
    assert idle_for(Sampler({"a": 600.0, "b": 30.0}), ["a", "b"]) == 30.0
    assert idle_for(Sampler({"a": 600.0}), ["a", "b"]) is None  # b not read yet
    assert idle_for(Sampler({}), []) is None


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_a_bad_idle_minutes_is_refused_naming_it(bad: float) -> None:
    with pytest.raises(TraitError, match=r"GpuNudge\.idle_minutes"):
        GpuNudge(idle_minutes=bad)
