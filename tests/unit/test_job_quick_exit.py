"""A job whose command ended before JupyterHub finished starting its server (CI, stop 31).

On a busy hub JupyterHub's spawn of a quick job ("echo") outlived its ``slow_spawn_timeout``;
JupyterHub then polled the spawner, found the runner gone (it had answered and exited) and
answered the scheduler's start "500 Spawner failed to start [status=0]". The scheduler took that
for a failed start and failed a job whose command had succeeded. These drive the scheduler's real
start and end of an attempt (its store in a temporary folder, the spawners' exit registry) with a
hub that answers as JupyterHub did; the end to end case is tests/e2e/test_jobs_api.py.
"""

from __future__ import annotations

import asyncio
import time

from gpulab.catalog import load_catalog
from gpulab.hub_config.jobs.scheduler import JobScheduler
from gpulab.spawners.jobs import launch as launches
from gpulab.spawners.jobs.model import EXITED, FAILED, START_FAILED, SUCCEEDED
from gpulab.spawners.jobs.queue import Decision
from gpulab.spawners.jobs.spec import parse_job_spec
from gpulab.spawners.jobs.store import JobStore
from gpulab.spawners.node.allocator import owner_key

SLOW_SPAWN = (500, '{"status": 500, "message": "Spawner failed to start [status=0]."}')


class Hub:
    """The hub's REST API as the scheduler sees it: a start answered ``answer``; the runner's
    exit (``exit_code``) filed by the spawner's poll meanwhile, as JupyterHub's poll does."""

    def __init__(self, answer: tuple[int, str], exit_code: int | None) -> None:
        self.answer, self.exit_code, self.calls = answer, exit_code, []

    async def request(self, method: str, path: str, body: object = None) -> tuple[int, str]:
        self.calls.append((method, path))
        if method == "POST":
            if self.exit_code is not None:
                owner, server = path.split("/users/")[1].split("/servers/")
                launches.note_exit(owner_key(owner, server.strip("/")), 1, self.exit_code)
            return self.answer
        return 204, ""


def run_attempt(tmp_path, answer: tuple[int, str], exit_code: int | None):
    async def scenario():
        scheduler = JobScheduler()
        scheduler.store = JobStore(tmp_path)
        scheduler.hub = Hub(answer, exit_code)
        scheduler.stop_timeout = 1
        owner = f"u{time.time_ns()}"
        spec = parse_job_spec(
            {"command": "echo quick", "gpu": "none", "gpus": 0},
            load_catalog(),
            max_nodes=1,
            max_gpus=lambda gpu: 1,
        )
        job = scheduler.store.submit(owner, spec)
        scheduler._begin_start(job, Decision(job.id, True, "", ("local",)), time.time())
        while scheduler._tasks:
            await asyncio.gather(*list(scheduler._tasks))
        return scheduler.store.get(job.id), scheduler.hub.calls

    return asyncio.run(scenario())


def test_a_command_that_ended_while_the_hub_started_it_ends_the_job_with_its_code(tmp_path):
    job, calls = run_attempt(tmp_path, SLOW_SPAWN, exit_code=0)
    assert job.state == SUCCEEDED, job
    assert job.attempts[0].end == EXITED and job.attempts[0].exit_code == 0
    assert calls == [("POST", calls[0][1])]  # started once, not retried


def test_its_own_failure_is_the_commands(tmp_path):
    job, _ = run_attempt(tmp_path, SLOW_SPAWN, exit_code=3)
    assert job.state == FAILED and job.attempts[0].exit_code == 3
    assert job.attempts[0].end == EXITED


def test_a_start_that_failed_with_nothing_run_is_still_a_failed_start(tmp_path):
    job, _ = run_attempt(tmp_path, (400, '{"message": "bad option"}'), exit_code=None)
    assert job.state == FAILED and job.attempts[0].end == START_FAILED
    assert "bad option" in (job.attempts[0].note or "")
