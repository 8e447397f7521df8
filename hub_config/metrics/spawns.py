"""The last 200 spawns with their steps and durations: :data:`SPAWNS`.

Spawns are counted where they end, in the spawner (``GpuSpawnerMixin.gpulab_start`` and its
refusals), which lives on the spawners floor and cannot import the hub's modules; so the ring
itself lives there (:mod:`gpulab.spawners.node.counters`) and this module is its name on the hub's
side: the collector's ``gpulab_spawn_duration_seconds`` and the admin console's "slowest recent
spawns" read it here.
"""

from __future__ import annotations

from gpulab.spawners.node.counters import (
    SPAWN_DURATION,
    SPAWN_LOG,
    SPAWN_REFUSALS,
    SpawnRecord,
)

SPAWNS = SPAWN_LOG

__all__ = ["SPAWNS", "SPAWN_DURATION", "SPAWN_REFUSALS", "SpawnRecord", "slowest"]


def slowest(n: int = 20) -> list[SpawnRecord]:
    """The ``n`` slowest of the recent spawns, slowest first."""
    return SPAWNS.slowest(n)
