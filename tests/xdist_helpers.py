"""Test groups for a parallel run (pytest-xdist ``--dist loadgroup``), carried without touching
node ids.

pytest-xdist's own ``loadgroup`` appends ``@group`` to each grouped test's node id on the worker,
and pytest 9.2's structured node ids ignore that (pytest-dev/pytest-xdist#1386): every test would
be handed out alone, so a module's hub started on every worker, and the test swarm and gradings
ran side by side. Here each worker writes the group of each test it collected (``xdist_group``
marks, those conftest.py adds included) to a file of its own before it reports its collection;
the controller's scheduler, which starts only once every worker has reported, reads them and
hands out whole groups. Heavy groups (hubs, browsers, engines) go out first, so that the run does
not end waiting on one module started last.

conftest.py loads this module as a plugin.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

GROUPS_FILE = "gpulab_groups_dir"
# Scopes under these folders start hubs, browsers or Docker engines: worth more than a unit test.
HEAVY = ("tests/e2e/", "tests/browser/", "tests/docker/", "tests/swarm/")


def group_of(item) -> str | None:
    names = sorted(
        str(m.args[0] if m.args else m.kwargs.get("name", "default"))
        for m in item.iter_markers("xdist_group")
    )
    return "_".join(names) or None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """(Controller) where each worker writes its groups: the run's temp dir."""
    base = node.config._tmp_path_factory.getbasetemp()
    node.workerinput[GROUPS_FILE] = str(base)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reports the collection
def pytest_collection_finish(session) -> None:
    where = getattr(session.config, "workerinput", {}).get(GROUPS_FILE)
    if not where:
        return
    groups = {item.nodeid: g for item in session.items if (g := group_of(item))}
    worker = session.config.workerinput["workerid"]
    path = Path(where) / f"xdist-groups-{worker}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before pytest-xdist's own
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """``loadgroup`` with the groups from the workers' files (see the module docstring)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                self._groups = {}
                base = config._tmp_path_factory.getbasetemp()
                for path in sorted(base.glob("xdist-groups-*.json")):
                    self._groups.update(json.loads(path.read_text()))
            group = self._groups.get(nodeid)
            if group is None and nodeid.rfind("@") > nodeid.rfind("]"):
                group = nodeid.rsplit("@", 1)[1]  # pytest-xdist's own mark, where it works
            return f"group:{group}" if group else nodeid

        def schedule(self) -> None:
            assert self.collection_is_completed
            if self.collection is not None:
                for node in self.nodes:
                    self._reschedule(node)
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False

            def weight(item: tuple[str, dict[str, bool]]) -> int:
                _scope, nodeids = item
                heavy = any(n.startswith(HEAVY) for n in nodeids)
                return -(len(nodeids) * (10 if heavy else 1))

            for scope, nodeids in sorted(units.items(), key=weight):
                self.workqueue[scope] = nodeids
            for _ in range(max(0, len(self.nodes) - len(self.workqueue))):
                unused, _assigned = self.assigned_work.popitem()
                unused.shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()

    return GroupScheduling(config, log)
