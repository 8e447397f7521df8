"""The reporter's heartbeat never bills a kernel past its stop.

A heartbeat asks each kernel whether it is alive, which yields to the server's event loop; a
kernel shut down meanwhile has its stop spooled first. Listed in the heartbeat stamped after the
look, it would be billed from its stop to that stamp: on a busy server, seconds the user never
used (seen in CI as a 7.6 s kernel billed 9.0 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpulab_reporter.reporter import Reporter


class Kernel:
    def __init__(self, manager: KernelManager, kid: str, shut_down_while_asked: bool) -> None:
        self.manager, self.kid, self.shut_down_while_asked = manager, kid, shut_down_while_asked

    async def is_alive(self) -> bool:
        if self.shut_down_while_asked:
            # The user's DELETE runs while the heartbeat waits: jupyter_server drops the kernel,
            # then emits its shutdown event, which the reporter spools.
            await asyncio.sleep(0)
            self.manager.ids.remove(self.kid)
            self.manager.reporter.spool.put(
                [self.manager.reporter.event("kernel_stop", kernel=self.kid)]
            )
        return True


class KernelManager:
    def __init__(self) -> None:
        self.ids = ["k-stays", "k-stopped"]
        self.reporter: Reporter | None = None

    def list_kernel_ids(self) -> list[str]:
        return list(self.ids)

    def get_kernel(self, kid: str) -> Kernel:
        return Kernel(self, kid, shut_down_while_asked=kid == "k-stopped")


@pytest.fixture
def reporter(tmp_path: Path, monkeypatch) -> Reporter:
    monkeypatch.setenv("GPULAB_REPORTER_SPOOL", str(tmp_path))
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    km = KernelManager()
    app = SimpleNamespace(log=logging.getLogger("test"), web_app=None, kernel_manager=km)
    r = Reporter(app)
    km.reporter = r
    r.app_events = lambda now: ([], [])
    return r


def spooled(reporter: Reporter) -> list[dict]:
    return [
        ev for p in sorted(reporter.spool.path.glob("*.json")) for ev in json.loads(p.read_text())
    ]


def test_a_kernel_stopped_during_the_heartbeat_is_not_billed_past_its_stop(reporter) -> None:
    asyncio.run(reporter.beat())
    events = spooled(reporter)
    (stop,) = [e for e in events if e["kind"] == "kernel_stop"]
    (beat,) = [e for e in events if e["kind"] == "heartbeat"]
    assert beat["kernels"] == ["k-stays"]
    # Nothing in the spool places the stopped kernel after its stop.
    assert stop["kernel"] == "k-stopped" and beat["t"] >= stop["t"]
