"""JupyterHub configuration of a gpulab node, as started by ``gpulab up``.

Settings come from GPULAB_* environment variables (see gpulab.hub_config.config.Settings).
"""

from gpulab.hub_config.config import configure

configure(c)  # noqa: F821 (`c` is injected by JupyterHub)
