"""The embedded default: each user's server is a local process (``gpulab-local``).

- :mod:`.spawner`: :class:`GpuLocalSpawner`, on JupyterHub's ``LocalProcessSpawner``.
- :mod:`.forkserver`: a warm Python that forks servers with JupyterLab already imported.
"""
