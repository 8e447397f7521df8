"""Servers in containers (``gpulab-docker``), the production path.

- :mod:`.spawner`: :class:`GpuDockerSpawner`, on dockerspawner's ``DockerSpawner``.
- :mod:`.images`: which catalog images are present on the Docker node.
- :mod:`.agent`: the preemption agent through ``docker exec``, and observed activity.
- :mod:`.recovery`: claiming containers after a hub restart; removing the unclaimed.
- :mod:`.labels`: what every container's labels say.
"""
