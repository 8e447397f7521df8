"""The hub side of gpulab: its configuration and wiring (``config.py``, ``plugin.py``), log-in,
scopes, the JSON API and JupyterHub overrides, billing's hooks, the ``gpulab`` CLI, and at the
bottom of every import, the platform catalog (``catalog/``). See docs/architecture.md.
"""
