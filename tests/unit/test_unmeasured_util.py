"""A real card whose utilisation NVML cannot give (``util_pct=None``; some boards, some drivers)
is shown as not measured everywhere, never as a made-up 0 % or as idle: JSON null in the user's
GPU API and the console, no DCGM_FI_DEV_GPU_UTIL sample and no idle seconds in the metrics (no
"held but idle" alert, no idle nudge), while its other figures still show.

Issue 24 (F1): "GPU utilisation per server", "cards held but idle past a threshold"; a card
with no utilisation figure counted as idle from the moment its server took it: its idle
seconds grew on /hub/metrics (the idle-card alert fired on it), the console called it idle and
the user got "GPU idle for 8 min" about a card nobody could measure.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from metrics_helpers import metrics_pool, scrape

from gpulab.catalog.models import load_catalog
from gpulab.hub_config.api.console import Console, console_json
from gpulab.hub_config.api.gpu_usage import card_view, idle_for, nudge
from gpulab.hub_config.metrics.sampler import CardSampler
from gpulab.hub_config.metrics.snapshot import snapshot
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.telemetry import CardReading
from gpulab.spawners.options import parse_options


@pytest.fixture
def pool(tmp_path):
    yield from metrics_pool(tmp_path, "A100-80G:2")


def unmeasured(uuid: str) -> CardReading:
    """NVML gave memory, temperature and a process, but no utilisation and no power."""
    return CardReading(
        uuid, 0, "NVIDIA A100", None, 1024.0, 81920.0, None, 41.0, False, ((77, 1024.0),)
    )


def test_a_card_without_a_utilisation_figure_is_not_measured_anywhere(pool) -> None:
    alloc = pool.allocator.allocate("alice/", "a100-80g", 1)
    (uuid,) = alloc.uuids
    sampler = CardSampler.instance()
    # Read twice, never busy: a card counted idle is idle since its server took it.
    sampler.update([unmeasured(uuid)], time.time() - 3600)
    sampler.update([unmeasured(uuid)], time.time())

    assert sampler.idle_seconds(uuid) is None

    # The user's API: null, not 0, not idle, no nudge; the other figures as read.
    view = card_view(uuid, 0, "a100-80g", sampler.latest()[uuid])
    assert view["util_pct"] is None and view["power_w"] is None
    assert (view["mem_used_mib"], view["temp_c"], view["simulated"]) == (1024.0, 41.0, False)
    assert view["processes"] == [{"pid": 77, "used_mib": 1024.0}]
    assert idle_for(sampler, [uuid]) is None
    renter = parse_options({"gpu": "a100-80g", "gpus": 1}, load_catalog())
    assert nudge(idle_for(sampler, [uuid]), 8, renter, load_catalog(), auto_after=0) is None

    # The metrics: no utilisation or power sample for it (no None, no NaN), no idle seconds;
    # its memory and temperature are there. The scrape itself does not fail.
    families = scrape()
    mine = lambda name: [s for s in families[name][1] if s.labels["UUID"] == uuid]  # noqa: E731
    assert mine("DCGM_FI_DEV_GPU_UTIL") == [] and mine("DCGM_FI_DEV_POWER_USAGE") == []
    assert [s.value for s in mine("DCGM_FI_DEV_FB_USED")] == [1024.0]
    assert [s.value for s in mine("DCGM_FI_DEV_GPU_TEMP")] == [41.0]
    assert mine("gpulab_card_idle_seconds") == []

    # The console: JSON null, neither busy nor idle.
    app = SimpleNamespace(config=None, users={})
    market = SpotMarket.instance()
    body = json.dumps(console_json(snapshot(app), sampler, market, Console()), allow_nan=False)
    (card,) = [c for c in json.loads(body)["cards"] if c["uuid"] == uuid]
    assert card["state"] == "held" and card["user"] == "alice"
    assert card["util_pct"] is None and card["idle_seconds"] is None and card["busy"] is False
