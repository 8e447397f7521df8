"""gpulab's SSH gateway (``gpulab-ssh``): SSH, SFTP and port forwarding into users' own servers.

Its own process, a JupyterHub managed service like billing. It imports only the catalog and
``gpulab.spawners.node.sockets`` (import-linter checks it) and reaches the hub over HTTP with its
service token. See ssh_service/README.md for its trust rules.
"""
