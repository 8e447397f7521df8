"""The billing service never outlives its hub, even one killed while billing was starting."""

from __future__ import annotations

import os
import subprocess
import sys

from harness import free_port


def test_billing_exits_when_the_hub_that_started_it_is_gone(tmp_path) -> None:
    env = {
        **os.environ,
        "GPULAB_DATA_DIR": str(tmp_path),
        # The hub's pid is not our parent's: as if the hub died before billing finished starting.
        "GPULAB_HUB_PID": str(os.getpid() + 1_000_000),
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{free_port()}",
        "JUPYTERHUB_API_TOKEN": "t" * 32,
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
        "JUPYTERHUB_SERVICE_PREFIX": "/services/billing/",
        "JUPYTERHUB_CLIENT_ID": "service-billing",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulab.billing_service"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "is gone; stopping" in out
