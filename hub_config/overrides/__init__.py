"""The only subclasses of JupyterHub's own handlers, mounted ahead of JupyterHub's routes for the
same URLs. Each module says which JupyterHub behaviour it changes; ``tests/unit/test_overrides.py``
fails when a JupyterHub upgrade moves what they rely on.
"""

from gpulab.hub_config.overrides import server_api, spawn_page

ROUTES = [*server_api.ROUTES, *spawn_page.ROUTES]
