"""Docker Swarm scale-out: many GPU nodes behind one hub (``gpulab-swarm``).

- :mod:`.spawner`: :class:`GpuSwarmSpawner`, every server a Swarm service on the node holding its
  cards (gpulab-docker's guarantees, services instead of containers).
- :mod:`.cluster`: :class:`SwarmCluster`, the nodes' cards (generic resources, GPU-type labels)
  read into the pool every few seconds, and the nodes' own engines for ``docker exec``.
"""
