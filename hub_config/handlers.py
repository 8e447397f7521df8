"""gpulab's JSON API on the hub: the live GPU pool and the catalog.

- ``GET /hub/api/gpulab/pool``: per GPU type free/total and prices; each card with its state.
- ``GET /hub/api/gpulab/catalog``: GPU types, images, datasets, no-GPU mode, currency.

Both need the custom scope ``custom:gpulab:read-pool`` (every user has it); who holds which card
is shown only to holders of ``admin:servers``.
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import define_custom_scopes, needs_scope

from gpulab.spawners.pool import GpuPool

READ_POOL_SCOPE = "custom:gpulab:read-pool"

CUSTOM_SCOPES = {
    READ_POOL_SCOPE: {
        "description": "Read the GPU pool (free cards, prices) and the platform catalog.",
    },
}
# Defined here as well as through JupyterHub.custom_scopes: needs_scope() checks the name when
# the handlers below are declared, before the hub reads its config. Same definition, no conflict.
define_custom_scopes(CUSTOM_SCOPES)


class _GpulabAPIHandler(APIHandler):
    @property
    def pool(self) -> GpuPool:
        return GpuPool.instance(config=self.settings["config"])


class PoolAPIHandler(_GpulabAPIHandler):
    @needs_scope(READ_POOL_SCOPE)
    async def get(self) -> None:
        viewer = (
            self.current_user.name if getattr(self.current_user, "kind", "") == "user" else None
        )
        snap = await self.pool.snapshot(show_holders=self.has_scope("admin:servers"), viewer=viewer)
        self.write(json.dumps(snap))


class CatalogAPIHandler(_GpulabAPIHandler):
    @needs_scope(READ_POOL_SCOPE)
    def get(self) -> None:
        self.write(json.dumps(self.pool.catalog.public()))


def extra_handlers() -> list[tuple[str, type]]:
    return [
        (r"/api/gpulab/pool", PoolAPIHandler),
        (r"/api/gpulab/catalog", CatalogAPIHandler),
    ]
