"""GPUs and the servers that use them, floor by floor (the contract "Floors of the spawners" in
pyproject.toml places every module):

- spawner classes: ``local/`` (the embedded default), ``docker/`` (production), ``swarm/`` and
  ``kubernetes/`` (many nodes);
- ``mixin.py``: what every gpulab spawner shares (options, allocation, GPU environment, state);
- ``form/``, ``apps.py`` and ``request.py``: the spawn form, what a one-click app gets, and the
  one typed ``SpawnRequest`` a spawn carries from the hub's gate to the launch;
- ``market/`` and ``courses.py``: the spot market, and who pays for a course server;
- ``node/``, ``options.py``, ``images.py``, ``activity.py``, ``agent_reports.py``: the node's GPU
  pool, the spawn contract, images present, observed activity;
- ``inside/``: code run inside users' servers (stdlib only; imports nothing of gpulab).
"""
