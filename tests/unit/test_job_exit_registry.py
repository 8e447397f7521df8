"""The hub's memory of job runners' exits (spawners/jobs/launch.py: note_exit, exit_for) and the
spawner side that files them (GpuSpawnerMixin._job_exit): issue 26, red-team finding F1 (a job
that exited 0 was recorded as a node failure once JupyterHub had dropped its spawner)."""

from __future__ import annotations

from gpulab.spawners.jobs import launch as launches
from gpulab.spawners.jobs.launch import JobLaunch
from gpulab.spawners.mixin import GpuSpawnerMixin


class _Spawner(GpuSpawnerMixin):
    """Only what the exit code needs: an owner key and a launch."""

    def __init__(self, key: str, launch: JobLaunch | None) -> None:
        self._key = key
        self.gpulab_job = launch

    @property
    def owner(self) -> str:
        return self._key


def _launch(attempt: int) -> JobLaunch:
    return JobLaunch(job_id=7, attempt=attempt, rank=0, nodes=1, gpus=0, command="true")


def test_an_exit_a_spawner_saw_outlives_the_spawner_for_its_attempt_only() -> None:
    """A spawner that saw its runner exit 3 files it; a fresh spawner (JupyterHub dropped the
    first) is not needed to read it; the next attempt's offer clears it."""
    key = "exitreg-a/job-7"
    spawner = _Spawner(key, _launch(2))
    assert launches.exit_for(key, 2) is None
    spawner._job_exit = 3
    del spawner
    assert launches.exit_for(key, 2) == 3
    assert launches.exit_for(key, 1) is None  # another attempt's exit is not this one's
    launches.offer(key, _launch(3))
    assert launches.exit_for(key, 2) is None and launches.exit_for(key, 3) is None
    launches.withdraw(key)


def test_the_first_exit_seen_stays_and_a_server_with_no_job_files_nothing() -> None:
    """A later stop's code does not replace the exit the hub saw first; a server without a job
    launch (a notebook server) files nothing."""
    key = "exitreg-b/job-7"
    launches.note_exit(key, 1, 0)
    launches.note_exit(key, 1, 143)
    assert launches.exit_for(key, 1) == 0
    launches.forget_exit(key)
    assert launches.exit_for(key, 1) is None
    _Spawner("exitreg-b/", None)._job_exit = 1
    assert launches.exit_for("exitreg-b/", 1) is None


def test_the_registry_is_bounded() -> None:
    """Never more than EXITS_KEPT servers' exits: the oldest go first."""
    for i in range(launches.EXITS_KEPT + 5):
        launches.note_exit(f"exitreg-c{i}/job-1", 1, 0)
    assert len(launches._EXITS) <= launches.EXITS_KEPT
    assert launches.exit_for("exitreg-c0/job-1", 1) is None
    assert launches.exit_for(f"exitreg-c{launches.EXITS_KEPT + 4}/job-1", 1) == 0
    for i in range(launches.EXITS_KEPT + 5):
        launches.forget_exit(f"exitreg-c{i}/job-1")
