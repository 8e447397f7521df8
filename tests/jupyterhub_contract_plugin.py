"""pytest plugin: JupyterHub's own spawner tests, with gpulab-local as their local-process spawner.

Loaded with ``-p`` by ``test_jupyterhub_spawner_contract.py`` into a separate pytest that runs
the installed ``jupyterhub/tests/test_spawner.py``. A ``-p`` plugin is imported before JupyterHub's
conftest and test modules, so when they import ``SimpleLocalProcessSpawner`` (the base of their
``MockSpawner`` and the class of their ``new_spawner``) and ``LocalProcessSpawner`` they get
gpulab's spawner; their tests and assertions run as JupyterHub ships them.

Settings come from the environment (set by the calling test):

- ``GPULAB_DATA_DIR``: the pool's data dir (ledger, homes, logs): a fresh temp dir. No GPUs are
  simulated, so every server runs in no-GPU mode (the default option).
- ``GPULAB_CONTRACT_WAIT``: ``1`` (default) or ``0``, GpuLocalSpawner.wait_until_listening.
- ``GPULAB_CONTRACT_DESELECT``: JSON list of test names (``test_x`` or ``test_x[param]``) to leave
  out; ``GPULAB_CONTRACT_ONLY``: JSON list of the only ones to run. A name that matches no test
  fails the run, so a list cannot go stale silently.
"""

from __future__ import annotations

import json
import os

import jupyterhub.spawner
import pytest
from traitlets import default

from gpulab.spawners.local.spawner import GpuLocalSpawner

WAIT = os.environ.get("GPULAB_CONTRACT_WAIT", "1") == "1"
DESELECT = set(json.loads(os.environ.get("GPULAB_CONTRACT_DESELECT", "[]")))
ONLY = set(json.loads(os.environ.get("GPULAB_CONTRACT_ONLY", "[]")))


class ContractSpawner(GpuLocalSpawner):
    """GpuLocalSpawner, configured through class defaults: JupyterHub's tests build most of their
    spawners without a config object, so there is no config file to put settings in."""

    @default("wait_until_listening")
    def _default_wait_until_listening(self) -> bool:
        return WAIT

    @default("user_accounts")
    def _default_user_accounts(self) -> bool:
        # JupyterHub's tests hand their servers files in root's private pytest temp folders (a
        # shell rc file, say), which a server running as its user's own account may not read.
        # The contract is the spawner API; the accounts are tested in tests/e2e/test_isolation.py.
        return False

    @default("use_cgroups")
    def _default_use_cgroups(self) -> bool:
        # Likewise: LocalProcessSpawner's contract, without gpulab's isolation of local servers
        # (tests/e2e/test_isolation.py, tests/unit/test_local_cgroup.py).
        return False


jupyterhub.spawner.LocalProcessSpawner = ContractSpawner
jupyterhub.spawner.SimpleLocalProcessSpawner = ContractSpawner


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def names(item: pytest.Item) -> set[str]:
        return {item.name, getattr(item, "originalname", item.name)}

    seen = set().union(*(names(item) for item in items)) if items else set()
    unknown = (DESELECT | ONLY) - seen
    if unknown:
        raise pytest.UsageError(f"no JupyterHub spawner test named {sorted(unknown)}")
    keep, drop = [], []
    for item in items:
        if names(item) & DESELECT or (ONLY and not names(item) & ONLY):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
