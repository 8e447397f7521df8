"""gpulab's own JSON API under ``/hub/api/gpulab/``: thin handlers over the pool and the market.

Scopes are checked with JupyterHub's RBAC (:mod:`gpulab.hub_config.scopes`).
"""

from gpulab.hub_config.api import (
    apps,
    console,
    datasets,
    gpu_usage,
    jobs,
    notices,
    pool,
    ports,
    reservations,
    spot,
    ssh,
    storage,
    uploads,
)

ROUTES = [
    *pool.ROUTES,
    *spot.ROUTES,
    *notices.ROUTES,
    *apps.ROUTES,
    *reservations.ROUTES,
    *datasets.ROUTES,
    *storage.ROUTES,
    *uploads.ROUTES,
    *gpu_usage.ROUTES,
    *ports.ROUTES,
    *console.ROUTES,
    *ssh.ROUTES,
    *jobs.ROUTES,
]
