"""The ``gpulab`` command line: one module per subcommand family.

- :mod:`.main`: the parser and ``gpulab up`` / ``status`` / ``config``, the entry point;
- :mod:`.images` and :mod:`.images_nodes`: the catalog's images on this node and on every Swarm node;
- :mod:`.models`: the model store and the tiny demo model;
- :mod:`.kubernetes`: the catalog as zero-to-jupyterhub values.

The CLI is the top floor of the hub side: it may use everything below it and nothing imports it.
"""
