"""GPUs and the servers that use them: the node's pool (``node/``), the spawn contract
(``options.py``), the spot market (``market/``), the spawn form (``form/``), the spawner classes
(``mixin.py``, ``local/``, ``docker/``) and the code run inside servers (``inside/``).
"""
