"""Servers in containers (``gpulab-docker``), the production path.

- :mod:`.spawner`: :class:`GpuDockerSpawner`, on dockerspawner's ``DockerSpawner``.
- :mod:`.images`: which catalog images are present on the Docker node.
"""

from gpulab.spawners.docker.spawner import AGENT_SOURCE, GpuDockerSpawner, network_gateway

__all__ = ["AGENT_SOURCE", "GpuDockerSpawner", "network_gateway"]
