"""The hub side of gpulab: everything that runs inside the JupyterHub process, plus its CLI.

Rooms, top floor first (the contract "Floors of the hub" in pyproject.toml places every module):

- ``cli/``: the ``gpulab`` command (``up``, ``images``, ``models``, ``kubernetes``);
  ``jupyterhub_config.py`` and ``config.py``: the JupyterHub configuration ``gpulab up`` starts;
- ``auth.py``, ``plugin.py``: log-in, and the one place gpulab is wired into a running hub;
- ``api/``: gpulab's JSON API, one module per resource; ``overrides/``: the only subclasses of
  JupyterHub's handlers; ``home.py``, ``launch_plan.py``, ``app_probe.py``,
  ``signup_handlers.py``: pages and their helpers;
- ``courses/``: classroom teaching (groups, rosters, staff rights, bookings, grading, the
  dashboard, LTI launches); ``billing/``: billing as the hub sees it (observer, hooks, notices);
- ``scopes.py``, ``data_dir.py``, ``origin.py``: the ground of the hub: custom scopes and roles,
  the private data dir, users' origins.

The catalog every part stands on is :mod:`gpulab.catalog`. See docs/architecture.md.
"""
