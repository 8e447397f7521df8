"""Talking to what runs in a container: gpulab's agent through ``docker exec`` (preemption
signals, the checkpoint command) and the engine's process list (observed activity).

Mixed into :class:`~gpulab.spawners.docker.spawner.GpuDockerSpawner`. Everything read back from
the container is the user's to shape, so it is capped and checked before it is used
(:mod:`gpulab.spawners.agent_reports`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import requests
from docker.utils.socket import consume_socket_output, demux_adaptor, frames_iter

from gpulab.spawners.activity import Observation, Proc
from gpulab.spawners.agent_reports import AGENT_OUTPUT_LIMIT, CheckpointReport, SignalReport
from gpulab.spawners.inside import agent as preemption_agent
from gpulab.spawners.inside.agent import checkpoint_log, checkpoint_state
from gpulab.spawners.node.inventory import nvml_compute_pids

# Sent to the container's Python with each `docker exec` (see preemption_agent's docstring).
AGENT_SOURCE = Path(preemption_agent.__file__).read_text()


class ContainerAgentMixin:
    """The preemption and observation methods of a container spawner."""

    exec_python: str
    container_user: str
    home_mount: str

    def _container_target(self) -> tuple[Any, str]:
        """(Docker API client, container id) of the server's container; may block. A Swarm
        service's container is its task's, reached through its node's own engine."""
        return self.client, self.object_id

    def _exec_agent(
        self,
        args: list[str],
        environment: dict[str, str] | None = None,
        read_timeout: float = 30,
        started: Callable[[], None] | None = None,
    ) -> tuple[int | None, bytes, bytes]:
        """Run gpulab's preemption agent in the container as its user, in its home (blocking).

        The source is sent with the command, so any image with a Python works unchanged. Returns
        the agent's exit code, stdout and stderr."""
        client, container = self._container_target()
        # -I and a working directory outside the home: nothing the user put there (a ~/json.py)
        # is imported by the hub's agent.
        argv = [self.exec_python, "-I", "-c", AGENT_SOURCE, *args]
        exec_id = client.exec_create(
            container,
            argv,
            user=self.container_user,
            workdir="/",
            environment=environment,
        )["Id"]
        # The raw connection rather than exec_start's reader: the client's 60 s socket timeout
        # must not cut off a checkpoint command that writes nothing for longer.
        sock = client.exec_start(exec_id, socket=True)
        # A unix socket arrives wrapped (SocketIO): timeouts and closing act on the socket inside.
        raw = getattr(sock, "_sock", sock)
        try:
            if started is not None:
                started()
            raw.settimeout(read_timeout)
            frames = (demux_adaptor(*frame) for frame in frames_iter(sock, tty=False))
            out, err = consume_socket_output(frames, demux=True)
            # What runs in the container is the user's: never more than the agent ever writes.
            out, err = (out or b"")[-AGENT_OUTPUT_LIMIT:], (err or b"")[-AGENT_OUTPUT_LIMIT:]
        finally:
            sock.close()
            raw.close()
        code = None
        for _ in range(50):  # the exit code lands a moment after the stream closes
            try:
                info = client.exec_inspect(exec_id)
            except docker.errors.NotFound:  # the container is gone already
                break
            code = info.get("ExitCode")
            if not info.get("Running"):
                break
            time.sleep(0.02)
        return code, out or b"", err or b""

    def _agent_failure(self, what: str, code: int | None, out: bytes, err: bytes) -> str:
        tail = (err or out).decode(errors="replace").strip()[-500:]
        if not tail and code in (None, 137, 143):
            return f"{what} did not finish: the container {self.container_name} stopped first"
        return (
            f"{what} could not run in container {self.container_name} with "
            f"{self.exec_python} (exit code {code}): {tail}"
        )

    async def observe_activity(self) -> Observation | None:
        """The container's processes (host pids, from the engine) besides its init and the
        server it started: kernels, terminals, apps and anything detached, which the container's
        init adopts but never hides."""
        if not self.object_id or self.allocation is None:
            return None
        uuids = [u for u in self.allocation.uuids if not self._simulated_uuid(u)]

        def look() -> Observation | None:
            t = time.time()
            try:
                client, container = self._container_target()
                top = client.top(container, ps_args="-eo pid,ppid,etimes,comm")
                init = client.inspect_container(container)["State"]["Pid"]
            except (docker.errors.APIError, LookupError, requests.exceptions.ConnectionError):
                # Gone, or its node's engine is (a Swarm node that died): nothing to observe.
                return None
            rows = []
            for row in top.get("Processes") or []:
                pid, ppid, etimes, comm = int(row[0]), int(row[1]), int(row[2]), row[3]
                rows.append((pid, ppid, t - etimes, comm))
            # The server: the oldest child of the container's init (started by its command).
            children = sorted((r for r in rows if r[1] == init), key=lambda r: r[2])
            server = children[0][0] if children else None
            procs = tuple(
                Proc(pid=pid, started=started, command=comm)
                for pid, _, started, comm in rows
                if pid not in (init, server)
            )
            return Observation(
                t=t,
                procs=procs,
                gpu_pids=tuple(nvml_compute_pids(uuids)),
                cpu=self._container_cpu(client, container),
            )

        return await asyncio.to_thread(look)

    @staticmethod
    def _container_cpu(client: Any, container: str) -> tuple[tuple[str, float], ...] | None:
        """The CPU seconds the whole container consumed (the engine's cgroup counter, the
        server's own process included), or None if the engine does not say."""
        try:
            stats = client.stats(container, stream=False, one_shot=True)
            total = stats["cpu_stats"]["cpu_usage"]["total_usage"]
        except (docker.errors.APIError, requests.exceptions.RequestException, KeyError, TypeError):
            return None
        return (("container", int(total) / 1e9),)

    def _simulated_uuid(self, uuid: str) -> bool:
        device = self.pool.inventory.by_uuid(uuid)
        return device is None or device.simulated

    async def gpulab_signal_processes(self) -> tuple[list[int], list[int]]:
        """SIGUSR1 to the container's processes that catch it: (signalled, skipped) pids, as the
        container sees them (what `ps` shows in the user's terminal)."""
        if not self.object_id:
            return [], []
        code, out, err = await asyncio.to_thread(self._exec_agent, ["signal"])
        if code != 0:
            raise RuntimeError(self._agent_failure("Signalling its processes", code, out, err))
        lines = out.strip().splitlines()
        try:
            result = SignalReport.model_validate_json(lines[-1] if lines else b"")
        except ValueError:
            raise RuntimeError(
                "Signalling its processes: the agent's report was not valid"
            ) from None
        return result.signalled, result.skipped

    async def gpulab_run_checkpoint(
        self,
        command: str,
        limit: float,
        env: dict[str, str] | None = None,
        on_start: Callable[[dict[str, Any]], None] | None = None,
        on_result: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """The user's checkpoint command, run in the container like a local server's.

        As the server's user, in its home, with the server's environment plus ``env``; output
        in ``~/.gpulab/checkpoints/<UTC time>.log`` in the home volume (the path the user sees in
        JupyterLab); killed after ``limit`` seconds. ``on_start`` gets the running result.
        ``on_result`` is not called: the result is known only when the exec ends, and returned
        then."""
        log = checkpoint_log(self.home_mount)
        result: dict[str, Any] = {
            "command": command,
            "state": "running",
            "log": log,
            "started_at": time.time(),
            "container": self.container_name,
        }
        if not self.object_id:
            return {**result, "error": "server not running", "state": "failed"}
        loop = asyncio.get_running_loop()

        def started() -> None:
            if on_start is not None:
                loop.call_soon_threadsafe(on_start, dict(result))

        spec = json.dumps({"command": command, "home": self.home_mount, "log": log, "limit": limit})
        try:
            # The agent kills the command at `limit`; the margin covers its start and report.
            code, out, err = await asyncio.to_thread(
                self._exec_agent, ["checkpoint", spec], env or {}, limit + 30, started
            )
        except (OSError, docker.errors.DockerException) as e:
            code, out, err = None, b"", f"{type(e).__name__}: {e}".encode()
        report = out.decode(errors="replace").strip().splitlines()
        parsed = None
        if code == 0 and report:
            try:
                parsed = CheckpointReport.model_validate_json(report[-1])
            except ValueError:
                err = b"the agent's report was not valid"
        if parsed is not None:
            result.update(parsed.model_dump(exclude_unset=True))
        else:
            # Stopped mid-run (the deadline came first), or no Python in the image.
            result["exit_code"] = None
            result["error"] = self._agent_failure("The checkpoint command", code, out, err)
            result["finished_at"] = time.time()
        result["state"] = checkpoint_state(result)
        return result
