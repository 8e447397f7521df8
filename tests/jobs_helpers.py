"""What the jobs tests share: a user's jobs through the REST API with their own token, the job
servers a user has, and the ``gpulab jobs`` CLI run against a test hub."""

from __future__ import annotations

import os
import subprocess

from harness import REPO, VENV_BIN, Hub, run_whole, wait_for


class Jobs:
    """One user's jobs, through the REST API with a token of their own."""

    def __init__(self, hub: Hub, user: str) -> None:
        self.hub, self.user = hub, user
        r = hub.api("POST", f"/users/{user}/tokens", json={"expires_in": 3600, "note": "jobs"})
        assert r.status_code == 201, r.text
        self.token = r.json()["token"]

    def call(self, method: str, path: str = "", **kw) -> object:
        return self.hub.api(method, f"/gpulab/users/{self.user}/jobs{path}", token=self.token, **kw)

    def submit(self, **spec) -> dict:
        r = self.call("POST", json=spec)
        assert r.status_code == 201, r.text
        return r.json()

    def get(self, job_id: int) -> dict:
        r = self.call("GET", f"/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait_state(self, job_id: int, *states: str, timeout: float = 90) -> dict:
        return wait_for(
            lambda: (j := self.get(job_id))["state"] in states and j,
            timeout,
            0.2,
            f"job {job_id} to be {' or '.join(states)}",
        )

    def log(self, job_id: int) -> str:
        r = self.call("GET", f"/{job_id}/log")
        assert r.status_code == 200, r.text
        return r.text

    def cancel(self, job_id: int) -> None:
        r = self.call("DELETE", f"/{job_id}")
        assert r.status_code == 202, r.text


def job_servers(hub: Hub, user: str) -> dict:
    return {k: v for k, v in hub.user(user)["servers"].items() if k.startswith("job-")}


def cli(hub: Hub, token: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "GPULAB_"))}
    env["GPULAB_TOKEN"] = token
    return subprocess.run(
        [str(VENV_BIN / "gpulab"), "jobs", "--hub", hub.url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def run_reference(args: list[str], cwd, env: dict[str, str], timeout: float = 600) -> str:
    """Run an uninterrupted reference training to its end; its stdout. The guard is generous
    (on 2 loaded cores a 40-step gloo run took over 240 s); its ranks never outlive it."""
    out = run_whole(
        args,
        timeout=timeout,
        what="the reference training",
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
