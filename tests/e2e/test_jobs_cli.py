"""``gpulab jobs`` from a terminal of the user's own server (issue 26: "gpulab jobs submit (CLI,
REST API, ...)"), with real parts: a root hub, the user's notebook server (a kernel as their own
account), and the CLI run there with nothing but what JupyterHub put in the server's
environment (``JUPYTERHUB_API_URL``, the server's own ``JUPYTERHUB_API_TOKEN``).
"""

from __future__ import annotations

import json
import os

import pytest
from harness import Hub, wait_for
from jobs_helpers import Jobs, job_servers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="servers run as users' accounts")

RUN = """
import json, os, subprocess, sys
gpulab = os.path.join(os.path.dirname(sys.executable), "gpulab")
env = {k: v for k, v in os.environ.items() if k != "GPULAB_TOKEN"}
p = subprocess.run([gpulab, "jobs", *json.loads(%r)], env=env, capture_output=True, text=True,
                   timeout=120)
print(json.dumps({"rc": p.returncode, "out": p.stdout, "err": p.stderr}))
"""


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "jobscli", simulate="RTX-4090:1", extra_args=["--JobScheduler.interval=0.3"]
    )


def in_server(kernel, *args: str) -> dict:
    return json.loads(kernel.execute(RUN % json.dumps(list(args)), timeout=150).strip())


def test_cli_submits_and_follows_with_the_servers_own_token(hub: Hub) -> None:
    """Issue 26, Jobs: `gpulab jobs submit --follow` in the user's own server submits with the
    server's token, streams the job's output until it ends and exits with the job's exit code;
    `list`, `show` and `logs` read it back; the job belongs to the server's owner."""
    user = hub.create_user()
    hub.spawn_ready(user, {"gpu": "none"})
    try:
        with hub.kernel(user) as k:
            ok = in_server(k, "submit", "--gpu", "none", "--follow", "--", "echo", "from-inside")
            assert ok["rc"] == 0, ok
            assert "from-inside" in ok["out"], ok
            failing = in_server(k, "submit", "--gpu", "none", "--follow", "--", "exit 3")
            assert failing["rc"] == 3, failing
            listed = in_server(k, "list")
            assert listed["rc"] == 0 and "succeeded" in listed["out"], listed
            assert "failed" in listed["out"], listed
            queued = in_server(k, "submit", "--gpu", "rtx-4090", "--", "echo", "later")
            assert queued["rc"] == 0, queued
            job_id = int(queued["out"].strip())
            shown = in_server(k, "show", str(job_id))
            assert shown["rc"] == 0 and json.loads(shown["out"])["owner"] == user, shown
            bad = in_server(k, "submit", "--gpu", "rtx-4090", "--gpus", "5", "--", "true")
            assert bad["rc"] == 1 and "400 gpus:" in bad["err"], bad
    finally:
        hub.stop_server(user)
    jobs = Jobs(hub, user)
    done = jobs.wait_state(job_id, "succeeded", "failed")
    assert done["state"] == "succeeded" and "later" in jobs.log(job_id), done
    wait_for(lambda: not job_servers(hub, user), 30, what="the job's server to be gone")
