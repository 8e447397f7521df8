"""The embedded default: each user's server is a local process (``gpulab-local``).

- :mod:`.spawner`: :class:`GpuLocalSpawner`, on JupyterHub's ``LocalProcessSpawner``.
- :mod:`.forkserver`: a warm Python that forks servers with JupyterLab already imported.
"""

from gpulab.spawners.local.spawner import GpuLocalSpawner, pid_alive

__all__ = ["GpuLocalSpawner", "pid_alive"]
