"""jupyterhub-idle-culler, the ecosystem's culler, run against gpulab as a hub-managed service
with its documented scopes: it culls an idle server, even one with a notebook open whose kernel
sits idle, and spares one whose kernel is busy without producing any output (JupyterHub's own
last_activity would never move for it; gpulab's observer moves it while the server uses CPU)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from conftest import require
from harness import ConfigFileHub, wait_for

CULL_AFTER = 20

CONFIG = f"""\
import sys
from gpulab.hub_config.config import configure

configure(c)
c.ActivityObserver.interval = 0.5
c.ActivityObserver.activity_update_interval = 2
c.JupyterHub.last_activity_interval = 2
c.JupyterHub.services.append(
    {{
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                    "--timeout={CULL_AFTER}", "--cull-every=2"],
    }}
)
c.JupyterHub.load_roles.append(
    {{
        "name": "idle-culler",
        "description": "The scopes jupyterhub-idle-culler documents for culling servers",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }}
)
"""


@pytest.fixture(scope="module")
def chub(tmp_path_factory, chp_installed):
    require(
        importlib.util.find_spec("jupyterhub_idle_culler") is not None,
        "jupyterhub-idle-culler (pip install jupyterhub-idle-culler)",
    )
    root = Path(tmp_path_factory.mktemp("culler-hub"))
    config = root / "jupyterhub_config.py"
    config.write_text(CONFIG)
    hub = ConfigFileHub(root / "data", config)
    hub.extra_env.update(GPULAB_ADMIN_TOKEN=hub.token, GPULAB_SIMULATE_GPUS="RTX-4090:2")
    yield hub.start()
    hub.stop()


def test_the_culler_stops_an_idle_server_and_spares_a_busy_silent_kernel(chub) -> None:
    idle, busy = chub.create_user(), chub.create_user()
    chub.spawn_ready(idle, {"gpu": "none"})
    chub.spawn_ready(busy, {"gpu": "none"})
    # The idle one has a notebook open whose kernel sits idle: its process is there, it does
    # no work, so it is idle all the same (issue 20, "Idle is never idle").
    forgotten = chub.kernel(idle)
    assert forgotten.execute("print(6 * 7)").strip() == "42"
    k = chub.kernel(busy)
    try:
        # Busy for longer than the culler's timeout, and silent: no output, no messages.
        k.send(f"import time\nend = time.time() + {3 * CULL_AFTER}\nwhile time.time() < end: pass")
        t0 = time.monotonic()
        wait_for(lambda: chub.server(idle) is None, 3 * CULL_AFTER, 1, "the idle server culled")
        assert time.monotonic() - t0 >= CULL_AFTER - 5
        # Well past the timeout, the busy one is still up.
        while time.monotonic() - t0 < CULL_AFTER + 10:
            assert chub.server(busy) is not None, "the busy server was culled"
            time.sleep(1)
    finally:
        k.close()
        forgotten.close()
