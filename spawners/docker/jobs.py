"""Job servers in containers (issue 26): the job runner as the container's command, its exit
code from the engine, and the checkpoint signal to the runner alone.

Mixed into :class:`~gpulab.spawners.docker.spawner.GpuDockerSpawner` (and so the Swarm
spawner). A job server's container runs :mod:`gpulab.spawners.inside.jobrunner` (stdlib only),
sent with its command like the preemption agent with each ``docker exec``: any image with a
Python runs jobs unchanged, under the image's own init (tini).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import docker

from gpulab.spawners.inside import jobrunner

JOBRUNNER_SOURCE = Path(jobrunner.__file__).read_text()


class ContainerJobsMixin:
    """The job methods of a container spawner (before :class:`ContainerAgentMixin`)."""

    exec_python: str
    object_id: str
    gpulab_job: Any
    _job_exit: int | None

    async def get_command(self) -> list[str]:
        """A job server runs the job runner in JupyterLab's place (the image's entrypoint, tini,
        stays its init); every other server the image's command."""
        if self.gpulab_job is not None:
            return [self.exec_python, "-I", "-c", JOBRUNNER_SOURCE, *self.get_args()]
        return await super().get_command()

    def _note_exit_state(self, state: dict[str, Any]) -> None:
        if self.gpulab_job is not None and self._job_exit is None and not state.get("Running"):
            code = state.get("ExitCode")
            if isinstance(code, int):
                self._job_exit = self.exit_code_of(code)

    async def gpulab_exit_status(self) -> int | None:
        """The runner's exit code: the engine's ExitCode of the container once it stopped (its
        init passes the runner's on, 128+N for a signal N)."""
        if self._job_exit is None and self.gpulab_job is not None and self.object_id:

            def state() -> dict[str, Any] | None:
                client, container = self._container_target()
                try:
                    return client.inspect_container(container)["State"]
                except (docker.errors.NotFound, LookupError):
                    return None

            found = await asyncio.to_thread(state)
            if found is not None:
                self._note_exit_state(found)
        return self._job_exit

    async def gpulab_signal_processes(self) -> tuple[list[int], list[int]]:
        """A job server's checkpoint signal goes to its runner alone (the container's init
        passes it on), which forwards it to the processes that catch it: each gets it once."""
        if self.gpulab_job is None:
            return await super().gpulab_signal_processes()
        if not self.object_id:
            return [], []

        def kill() -> None:
            client, container = self._container_target()
            client.kill(container, signal="SIGUSR1")

        await asyncio.to_thread(kill)
        return [1], []
