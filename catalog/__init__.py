"""The platform catalog, the floor every other part of gpulab stands on.

- :mod:`.models`: GPU types, prices, images and datasets as typed models, loaded from TOML.
- :mod:`.apps`: the apps a one-click launch runs and the model store they read.
- :mod:`.price_history`: the spot price in force at every second, written by the hub's market
  and read by billing.
- :mod:`.pricing`: the one price function (``quote``) billing, the hub's pages and APIs, the spawn
  form and the servers' status bar all price a server by.

Nothing here imports anything else of gpulab.
"""

from gpulab.catalog.apps import DEFAULT_APP, App, StoreModel
from gpulab.catalog.models import (
    DEFAULT_CATALOG,
    Catalog,
    CatalogError,
    Dataset,
    GpuType,
    Image,
    NoGpuMode,
    ServerLimits,
    load_catalog,
    parse_catalog,
    slugify,
)
from gpulab.catalog.no_gpu import NO_GPU, card_type, gpu_choice

__all__ = [
    "DEFAULT_APP",
    "DEFAULT_CATALOG",
    "NO_GPU",
    "App",
    "Catalog",
    "CatalogError",
    "Dataset",
    "GpuType",
    "Image",
    "NoGpuMode",
    "ServerLimits",
    "StoreModel",
    "card_type",
    "gpu_choice",
    "load_catalog",
    "parse_catalog",
    "slugify",
]
