"""What the hub-metrics unit tests share: a real :class:`GpuPool` (simulated cards, a real
allocator and ledger in a temp dir) with its card sampler and, where asked, its spot market; and
one scrape of :class:`GpulabCollector` alone through prometheus_client's own exposition and
parser, on a registry of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from traitlets.config import Config

from gpulab.hub_config.metrics.collector import GpulabCollector
from gpulab.hub_config.metrics.sampler import CardSampler
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.pool import GpuPool


def _clear(market: bool) -> None:
    if market:
        SpotMarket.clear_instance()
    GpuPool.clear_instance()
    CardSampler.clear_instance()


def metrics_pool(tmp_path: Path, gpus: str, market: bool = True) -> Iterator[GpuPool]:
    """For a fixture to ``yield from``: the pool of ``gpus`` (``"A100-80G:2,RTX-4090:3"``), the
    sampler reading it, and (``market``) the spot market on it; all cleared afterwards."""
    _clear(market)
    c = Config()
    c.GpuPool.data_dir = str(tmp_path / "data")
    c.GpuInventory.simulate_gpus = gpus
    pool = GpuPool.instance(config=c)
    if market:
        SpotMarket.instance(config=c, pool=pool)
    CardSampler.instance(config=c).pool = pool
    yield pool
    _clear(market)


def scrape() -> dict:
    """family name -> (type, [samples]) of one exposition of the collector alone."""
    registry = CollectorRegistry()
    registry.register(GpulabCollector())
    text = generate_latest(registry).decode()
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}
