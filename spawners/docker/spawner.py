"""The production path: every server in a Docker container from a preloaded image, pinned to its GPUs.

- GPU servers get a device request for exactly their allocated GPU UUIDs (driver ``nvidia``,
  capabilities ``gpu``) plus ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``; no-GPU servers get
  no device request; simulated GPUs (no driver on the node) get the environment only, labelled so.
- One home per user, the same in GPU and no-GPU mode: where the hub's home store enforces quotas
  (``pool.homes.enforced``: an ext4 image per user, loop-mounted on the host) the home is that host
  folder bind-mounted at ``home_mount``, so a write past the quota fails with ENOSPC in the user's
  code; else (a hub that cannot loop-mount, e.g. unprivileged in Compose) a named volume, not
  bounded. A user's files in an older named volume are copied once into their bounded home, by a
  container running as the user (never by root on the user's paths). ``/tmp`` is a tmpfs of the
  catalog's ``storage.tmp_gb`` and ``/dev/shm`` of ``storage.shm_gb`` (both gone with the
  container); JupyterLab's runtime files live in ``/tmp``, outside the quota, so a full home still
  opens. The container's log (its stdout, the user's to fill) is capped by Docker's json-file
  rotation. Datasets are read-only bind mounts at ``/datasets/SLUG``, linked from
  ``~/datasets``. CPU and memory limits come from the catalog. Containers are never privileged, drop every capability, never see the
  Docker socket and run as a non-root user.
- Container labels carry user, server, allocation id, GPU UUIDs and pricing, so a hub killed with
  SIGKILL finds on restart which container holds which cards, even if its ledger was lost.
- ``start()`` returns only once the server accepts connections (polled every few milliseconds
  instead of the hub's backoff); a container that exits first fails the spawn with its last log
  lines. Images are never pulled at spawn time: a missing image fails at once with the fix.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import docker
import requests
from docker.types import Mount
from dockerspawner import DockerSpawner
from jupyterhub.traitlets import ByteSpecification
from traitlets import Bool, Float, Integer, Unicode, default, validate

from gpulab.catalog import App, gpu_choice
from gpulab.spawners.docker.agent import ContainerAgentMixin
from gpulab.spawners.docker.images import image_status
from gpulab.spawners.docker.jobs import ContainerJobsMixin
from gpulab.spawners.docker.labels import (
    L_ALLOC,
    L_CREATED,
    L_CURRENCY,
    L_GPU_TYPE,
    L_GPUS,
    L_HUB,
    L_IMAGE,
    L_PRICE,
    L_PRICING,
    L_SERVER,
    L_SIMULATED,
    L_USER,
)
from gpulab.spawners.docker.recovery import RecoveryMixin, reap_containers
from gpulab.spawners.images import ImageStatus
from gpulab.spawners.inside.launcher import SCRATCH_RUNTIME
from gpulab.spawners.mixin import GpuSpawnerMixin, SpawnError
from gpulab.spawners.node.allocator import Allocation
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.request import SpawnRequest
from gpulab.spawners.storage.datasets import mount_name

DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
# Run as the image user in a container with the old volume at /from and the new home at /to:
# copy into a staging folder, then move each entry up (merging, never overwriting, where the
# home has it already), then drop the staging folder.
MOVE_HOME_SCRIPT = """set -e
stage=/to/.gpulab-moving-home
rm -rf "$stage"
cp -a /from/. "$stage"
cd "$stage"
for f in .[!.]* ..?* *; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  if [ -e "/to/$f" ] || [ -L "/to/$f" ]; then cp -a -n "$f" /to/; else mv "$f" /to/; fi
done
cd /
rm -rf "$stage"
"""


def network_gateway(network: str) -> str:
    """The host's address on a Docker network (where containers reach the hub)."""
    client = docker.APIClient(version="auto")
    try:
        info = client.inspect_network(network)
    except docker.errors.NotFound:
        raise SystemExit(
            f"GPULAB_DOCKER_NETWORK: Docker network {network!r} does not exist "
            f"(create it with `docker network create {network}`)"
        ) from None
    except docker.errors.DockerException as e:
        raise SystemExit(f"gpulab: the Docker spawner needs a running Docker Engine: {e}") from None
    finally:
        client.close()
    for cfg in (info.get("IPAM") or {}).get("Config") or []:
        if cfg.get("Gateway"):
            return cfg["Gateway"]
        if cfg.get("Subnet") and ":" not in cfg["Subnet"]:
            # Docker gives a network without an explicit gateway (e.g. the default bridge) the
            # first address of its subnet.
            return str(next(ipaddress.ip_network(cfg["Subnet"]).hosts()))
    raise SystemExit(
        f"Docker network {network!r} has no gateway address; set GPULAB_HUB_IP and "
        "GPULAB_HUB_CONNECT_IP"
    )


class GpuDockerSpawner(
    ContainerJobsMixin, ContainerAgentMixin, RecoveryMixin, GpuSpawnerMixin, DockerSpawner
):
    """Runs each server in a container from the catalog image the user picked, with its GPUs."""

    gpu_device_requests = Unicode(
        "auto",
        config=True,
        help="""When a GPU server's container gets a device request for its GPU UUIDs (driver
        nvidia, capabilities gpu): 'auto' (only for real GPUs; simulated cards get the
        environment alone, since Docker cannot start a container that requests a device no
        driver provides), 'always' (also for simulated cards: the container is created but
        cannot start without a driver; for checking requests on machines without a GPU), or
        'never' (environment only, e.g. when another runtime hands out GPUs).""",
    )

    home_volume = Unicode(
        "gpulab-home-{username}",
        config=True,
        help="""Name of each user's home volume; {username} is the escaped user name. The same
        volume serves GPU and no-GPU mode, so switching never loses a file.""",
    )

    home_mount = Unicode(
        "/home/jovyan",
        config=True,
        help="Where the home volume is mounted in the container (the image user's home).",
    )

    datasets_mount = Unicode(
        "/datasets",
        config=True,
        help="Directory in the container under which each dataset is bind-mounted read-only.",
    )

    models_mount = Unicode(
        "/models",
        config=True,
        help="""Directory in the container under which each model of the catalog's model store
        is bind-mounted read-only (and linked from ~/models/SLUG).""",
    )

    container_user = Unicode(
        "1000",
        config=True,
        help="""User (uid or uid:gid) the container runs as. Root is refused: a server never
        runs as root.""",
    )

    shm_fraction = Float(
        0.5,
        config=True,
        help="""Most of the container's memory limit /dev/shm may take: its size is the
        catalog's storage.shm_gb, capped at this fraction of the memory limit (shared memory is
        memory, charged to the container), and never below Docker's 64 MB (which breaks PyTorch
        DataLoader workers, passing batches through shared memory).""",
    )

    log_max_bytes = Integer(
        16 * 2**20,
        config=True,
        help="""Most bytes of a container's output (its stdout and stderr, its kernels': the
        user's to fill) Docker keeps on the node's disk: json-file logs rotated in two files of
        half this size each.""",
    )

    migrate_wait = Float(
        40.0,
        config=True,
        help="""Seconds a start waits for the copy of a user's older named volume into their
        bounded home (migrate_volumes); a longer copy goes on, and the start fails saying how far
        it got (the next start waits for the same copy).""",
    )

    migrate_volumes = Bool(
        True,
        config=True,
        help="""Where homes are bounded host folders (the home store enforces quotas), copy a
        user's files from their older named volume (home_volume) into their new home once, at
        their next start, by a container running as the image user. The volume itself is kept
        (remove it with `docker volume rm` once users have checked their files).""",
    )

    ready_poll_interval = Float(
        0.01,
        config=True,
        help="Seconds between attempts to connect to the starting server.",
    )

    exit_check_interval = Float(
        0.25,
        config=True,
        help="""Seconds between checks (while waiting for the server to answer) that the
        container is still running, so a crashed server fails the spawn at once.""",
    )

    log_tail_lines = Integer(
        20,
        config=True,
        help="How many of the container's last log lines a failed spawn shows.",
    )

    trim_imports = Bool(
        True,
        config=True,
        help="""gpulab's launcher in the image skips imports that only slow server start-up
        (jsonschema's rfc3987 grammar, used by no Jupyter event schema).""",
    )

    exec_python = Unicode(
        "python3",
        config=True,
        help="""The image's Python (3.8 or newer; every server image has one) that runs
        gpulab's preemption steps in the container with `docker exec`: SIGUSR1 to the
        processes that catch it, and the user's checkpoint command.""",
    )

    image_status_ttl = Float(
        10.0,
        config=True,
        help="Seconds the form reuses the list of images present on this node.",
    )

    @validate("gpu_device_requests")
    def _check_device_requests(self, proposal: dict) -> str:
        if proposal["value"] not in {"auto", "always", "never"}:
            raise ValueError(
                f"gpu_device_requests: {proposal['value']!r} is not allowed; "
                "allowed: auto, always, never"
            )
        return proposal["value"]

    @validate("container_user")
    def _check_user(self, proposal: dict) -> str:
        user = proposal["value"].strip()
        if not user or user.split(":")[0] in {"0", "root"}:
            raise ValueError(
                f"container_user: {proposal['value']!r} is root; servers never run as root "
                "(use the image user's uid, e.g. '1000')"
            )
        return user

    @validate("volumes", "read_only_volumes")
    def _no_docker_socket(self, proposal: dict) -> dict:
        for src in proposal["value"]:
            if str(src).rstrip("/") in DOCKER_SOCKETS or str(src).endswith("docker.sock"):
                raise ValueError(
                    f"{proposal['trait'].name}: {src} would give a server control of the Docker "
                    "Engine (root on the node); it is never mounted"
                )
        return proposal["value"]

    @default("prefix")
    def _default_prefix(self) -> str:
        return "gpulab"

    @default("remove")
    def _default_remove(self) -> bool:
        # Containers are disposable: the home lives in its volume.
        return True

    @default("pull_policy")
    def _default_pull_policy(self) -> str:
        # Never pull at spawn time; `gpulab images` preloads (checked in start()).
        return "never"

    @default("use_internal_ip")
    def _default_use_internal_ip(self) -> bool:
        return True

    # ---- images ------------------------------------------------------------------------------

    _image_cache: tuple[float, dict[str, ImageStatus]] | None = None

    async def image_availability(self) -> dict[str, ImageStatus]:
        """Which catalog images are present on this node (the spawn form greys out the rest)."""
        cls = type(self)
        now = time.monotonic()
        if cls._image_cache is not None and now - cls._image_cache[0] < self.image_status_ttl:
            return cls._image_cache[1]
        statuses = {}
        for slug, image in self.pool.catalog.images.items():
            statuses[slug] = await self._in_executor(
                image_status, self.client, slug, image.docker_image
            )
        cls._image_cache = (now, statuses)
        return statuses

    async def _in_executor(self, fn, *args):
        return await asyncio.wrap_future(self.executor.submit(fn, *args))

    # ---- volumes -----------------------------------------------------------------------------

    @property
    def home_volume_name(self) -> str:
        return self.home_volume.format(username=self.escaped_name)

    def _dataset_mounts(self) -> list[Mount]:
        """Read-only bind mounts of the chosen datasets at /datasets/SLUG.

        Mounts, not binds: for a source missing on the Docker host (e.g. a hub in a container
        whose dataset paths are not the host's) Docker refuses instead of mounting an empty
        directory it created.
        """
        opts = self.gpulab_options
        mounts = []
        for slug in opts.datasets if opts else ():
            src = self.pool.datasets.source_of(slug, self.pool.catalog)
            if not src.is_dir():
                raise SpawnError(500, f"Dataset {slug} is unavailable: {src} is not a directory")
            mounts.append(
                Mount(
                    target=f"{self.datasets_mount}/{mount_name(slug)}",
                    source=str(src),
                    type="bind",
                    read_only=True,
                )
            )
        return mounts

    def _model_mounts(self) -> list[Mount]:
        """Read-only bind mounts of the model store at /models/SLUG (linked from ~/models)."""
        return [
            Mount(
                target=f"{self.models_mount}/{slug}", source=str(src), type="bind", read_only=True
            )
            for slug, src in self.model_sources().items()
        ]

    @property
    def mount_binds(self) -> list[Mount]:
        return [
            *super().mount_binds,
            *self._home_mounts(),
            *self._dataset_mounts(),
            *self._model_mounts(),
        ]

    # ---- apps ----------------------------------------------------------------------------------

    def server_home(self) -> str:
        return self.home_mount

    def app_command(self, app: App) -> list[str] | None:
        # The app's image carries its command.
        return app.command or None

    async def app_unavailable(self, app: App) -> str:
        if app.image is None:
            return ""
        status = (await self.image_availability()).get(app.image)
        if status is None or not status.present:
            why = status.reason if status is not None else "not in the catalog"
            return f"its image {app.image!r} is not on this node ({why})"
        return ""

    @property
    def volume_binds(self) -> dict[str, dict[str, str]]:
        binds = super().volume_binds
        if self._home_source is None:
            binds[self.home_volume_name] = {"bind": self.home_mount, "mode": "rw"}
        return binds

    # ---- the home and its quota ---------------------------------------------------------------

    _home_source: str | None = None  # the bounded home's host folder, when homes are bounded

    def _home_mounts(self) -> list[Mount]:
        if self._home_source is None:
            return []
        return [Mount(target=self.home_mount, source=self._home_source, type="bind")]

    def container_ids(self) -> tuple[int, int]:
        """The uid and gid the container runs as (container_user 'uid' or 'uid:gid'; a bare
        uid's group is the same number, as useradd makes it in our images)."""
        uid, _, gid = self.container_user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            raise SpawnError(
                500, f"container_user {self.container_user!r}: numeric 'uid' or 'uid:gid' needed"
            )
        return int(uid), int(gid or uid)

    async def _prepare_home(self) -> None:
        """The user's home: their bounded host folder (made or mounted by the home store) where
        quotas are enforced, else their named volume."""
        homes = self.pool.homes
        self._home_source = None
        if not homes.enforced:
            await self.docker(
                "create_volume",
                self.home_volume_name,
                labels={L_USER: self.user.name, L_HUB: self.pool.hub_id},
            )
            return
        uid, gid = self.container_ids()
        home = await asyncio.to_thread(homes.ensure, self.user_home_name(), uid, gid)
        self._home_source = str(home)
        if self.migrate_volumes:
            await self._migrate_volume(home)

    def _migrated_mark(self) -> Path:
        return Path(self.pool.data_dir) / "storage" / "docker-volumes-moved" / self.user_home_name()

    async def _migrate_volume(self, home: Path) -> None:
        """Copy the files of the user's older named volume into ``home``, once. The copy runs in
        a container of its own as the image user (no capability, no network), so a link in the
        volume leads nowhere on the host and the home's quota bounds what is copied. It copies
        into a staging folder first (a copy cut short leaves no half file among the user's) and
        then moves each entry up, merging without overwriting what the home already has. It
        outlives the start that began it: a start that does not see it finish within
        migrate_wait seconds fails with how far it got, and the next start waits for the same
        copy. A failed copy (its reason shown) is tried afresh at the next start."""
        mark = self._migrated_mark()
        if await asyncio.to_thread(mark.exists):
            return
        name = f"{self.container_name}-move-home"
        try:
            mover = await self.docker("inspect_container", name)
        except docker.errors.NotFound:
            mover = None
        if mover is None:
            try:
                await self.docker("inspect_volume", self.home_volume_name)
            except docker.errors.NotFound:
                await asyncio.to_thread(_write_mark, mark, "no volume")
                return
            mover = await self._start_mover(name, home)
        self.emit_progress(
            20, f"Moving your files from volume {self.home_volume_name} into your home"
        )
        try:
            result = await self.docker("wait", mover["Id"], timeout=self.migrate_wait)
        except requests.exceptions.RequestException:  # Docker's wait timed out
            moved = await asyncio.to_thread(self.pool.homes.usage, self.user_home_name())
            raise SpawnError(
                503,
                f"Your files in volume {self.home_volume_name} are still being moved into your "
                f"home ({moved.used_bytes / 2**20:.0f} MiB so far); start again in a minute",
            ) from None
        tail = (await self.docker("logs", mover["Id"], tail=5)).decode(errors="replace")
        await self.docker("remove_container", mover["Id"], force=True)
        if result["StatusCode"] != 0:
            raise SpawnError(
                507 if "space" in tail.lower() or "quota" in tail.lower() else 500,
                f"Your files in volume {self.home_volume_name} could not be moved into your home "
                f"(quota {self.pool.homes.quota(self.user_home_name()) / 2**30:.2f} GB; raise it "
                f"or ask an operator): {tail.strip()}",
            )
        await asyncio.to_thread(_write_mark, mark, self.home_volume_name)

    async def _start_mover(self, name: str, home: Path) -> dict[str, Any]:
        uid, gid = self.container_ids()
        host_config = self.client.create_host_config(
            mounts=[
                Mount(target="/from", source=self.home_volume_name, type="volume", read_only=True),
                Mount(target="/to", source=str(home), type="bind"),
            ],
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            network_mode="none",
        )
        mover = await self.docker(
            "create_container",
            image=self.image,
            command=["sh", "-c", MOVE_HOME_SCRIPT],
            user=f"{uid}:{gid}",
            entrypoint=[],
            host_config=host_config,
            labels={L_USER: self.user.name, L_HUB: self.pool.hub_id},
            name=name,
        )
        await self.docker("start", mover["Id"])
        return mover

    # ---- environment and container config ----------------------------------------------------

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        # The request's GPU environment, made by gpulab_start once the cards were allocated.
        env.update(self.gpulab_request.env if self.gpulab_request is not None else {})
        opts = self.gpulab_options
        links = [
            [f"{self.datasets_mount}/{d}", f"{self.home_mount}/datasets/{d}"]
            for d in (mount_name(slug) for slug in (opts.datasets if opts else ()))
        ] + [
            [f"{self.models_mount}/{slug}", f"{self.home_mount}/models/{slug}"]
            for slug in (self.model_sources() if opts else ())
        ]
        # The launcher in the image links ~/datasets/SLUG to the read-only mounts (and removes
        # links of datasets no longer requested).
        env["GPULAB_DATASET_MODE"] = "symlink"
        env["GPULAB_DATASET_MOUNTS"] = json.dumps(links)
        env["GPULAB_TRIM_IMPORTS"] = "1" if self.trim_imports else "0"
        env["HOME"] = self.home_mount
        # Runtime files (the server's and kernels' connection files) in /tmp, outside the quota:
        # a full home still starts and opens.
        env["JUPYTER_RUNTIME_DIR"] = SCRATCH_RUNTIME
        if self.gpulab_job is not None:
            # The runner's scope for the checkpoint signal: every process of the container.
            env["GPULAB_JOB_SCOPE"] = "container"
        if self.allocation is not None and self.device_requests(self.allocation):
            # What the NVIDIA container toolkit injects: CUDA's driver library and nvidia-smi.
            env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        return env

    def _simulated(self, alloc: Allocation) -> bool:
        devices = [self.pool.inventory.by_uuid(u) for u in alloc.uuids]
        return any(d is not None and d.simulated for d in devices)

    def device_requests(self, alloc: Allocation) -> list[dict[str, Any]]:
        """The GPU device request for exactly the allocated cards (empty in no-GPU mode)."""
        if not alloc.uuids or self.gpu_device_requests == "never":
            return []
        if self._simulated(alloc) and self.gpu_device_requests == "auto":
            return []
        return [
            {
                "Driver": "nvidia",
                "DeviceIDs": list(alloc.uuids),
                "Capabilities": [["gpu"]],
                "Count": 0,
                "Options": {},
            }
        ]

    def labels(self, alloc: Allocation) -> dict[str, str]:
        opts = self.gpulab_options
        assert opts is not None
        catalog = self.pool.catalog
        return {
            L_HUB: self.pool.hub_id,
            L_USER: self.user.name,
            L_SERVER: self.name,
            L_ALLOC: alloc.alloc_id,
            L_GPU_TYPE: gpu_choice(alloc.gpu_type),
            L_GPUS: ",".join(alloc.uuids),
            L_SIMULATED: "1" if self._simulated(alloc) else "0",
            L_PRICING: alloc.pricing,
            L_PRICE: str(opts.price_per_hour(catalog)),
            L_CURRENCY: catalog.currency,
            L_CREATED: repr(alloc.created),
            L_IMAGE: opts.image,
        }

    def _container_config(self, alloc: Allocation) -> None:
        """Per-spawn settings DockerSpawner.create_object merges into the container."""
        cpus, mem = self.resource_limits(alloc)
        limits = self.pool.catalog.limits
        self.cpu_limit = cpus
        self.mem_limit = mem
        mem_bytes = ByteSpecification().validate(self, mem)
        self.extra_create_kwargs = {"labels": self.labels(alloc), "user": self.container_user}
        tmp_bytes, shm_bytes = self.scratch_sizes(mem_bytes)
        self.extra_host_config = {
            # Logs must outlive a crash so a failed spawn can show them; stop() removes.
            "auto_remove": False,
            "privileged": False,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "shm_size": shm_bytes,
            # Scratch in memory, sized by the catalog, gone with the container.
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={tmp_bytes},mode=1777"},
            "log_config": {
                "Type": "json-file",
                "Config": {"max-size": str(max(self.log_max_bytes // 2, 1024)), "max-file": "2"},
            },
            "device_requests": self.device_requests(alloc),
            # A fork bomb or a file-handle leak stays inside this server (catalog [limits]).
            "pids_limit": limits.pids,
            "ulimits": [{"name": "nofile", "soft": limits.open_files, "hard": limits.open_files}],
        }

    def scratch_sizes(self, mem_bytes: int) -> tuple[int, int]:
        """(/tmp, /dev/shm) sizes in bytes: the catalog's storage.tmp_gb and storage.shm_gb,
        /dev/shm capped at shm_fraction of the memory limit and at least 64 MiB. Both are tmpfs:
        what they hold is memory charged to the container, so neither can pass its limit."""
        storage = self.pool.catalog.storage
        shm = self.job_shm_bytes(storage.bytes_of(storage.shm_gb))
        shm = min(shm, int(mem_bytes * self.shm_fraction))
        return storage.bytes_of(storage.tmp_gb), max(64 * 2**20, shm)

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> str:
        # Check the image before anything is allocated: a missing image changes nothing.
        opts = self._start_request().options
        status = await self._in_executor(
            image_status, self.client, opts.image, self.pool.catalog.images[opts.image].docker_image
        )
        if not status.present:
            raise SpawnError(409, f"Image {opts.image!r} is unavailable: {status.reason}")
        self._image_status = status
        return await self.gpulab_start()

    async def _launch(self, request: SpawnRequest) -> str:
        alloc = self.allocation
        opts = request.options
        assert alloc is not None
        status = self._image_status
        self.image = status.docker_image
        self.emit_progress(25, f"Image {opts.image} ({self.image}) is present on this node")
        self._container_config(alloc)
        if opts.datasets:
            self.emit_progress(
                30,
                f"Mounting datasets read-only at {self.datasets_mount}: {', '.join(opts.datasets)}",
            )
        await self._prepare_home()

        old = await self.get_object()
        if old is not None:
            self.log.warning("Removing leftover container %s", self.container_name)
            await self.remove_object()
        requests = self.device_requests(alloc)
        gpu_note = (
            f"device request for {', '.join(alloc.uuids)}"
            if requests
            else ("simulated GPUs: environment only" if alloc.uuids else "no GPU")
        )
        self.emit_progress(
            40,
            f"Creating container {self.container_name} ({self.cpu_limit:g} CPUs, "
            f"{self.resource_limits(alloc)[1]} memory, {gpu_note})",
        )
        t0 = time.perf_counter()
        try:
            obj = await self.create_object()
        except docker.errors.APIError as e:
            raise SpawnError(
                500, f"Docker could not create the container: {_docker_reason(e)}"
            ) from None
        self.object_id = obj["Id"]
        self.emit_progress(50, "Starting the container")
        t1 = time.perf_counter()
        try:
            await self.start_object()
        except Exception as e:
            raise SpawnError(
                500, f"Docker could not start the container: {_docker_reason(e)}"
            ) from None
        info = await self.docker("inspect_container", self.object_id)
        ip = self.get_network_ip(info["NetworkSettings"])
        self.emit_progress(60, f"Container running; waiting for JupyterLab at {ip}:{self.port}")
        t2 = time.perf_counter()
        await self._wait_answering(ip, self.port)
        self.launch_timings = {
            "container_create": t1 - t0,
            "container_start": t2 - t1,
            "python_startup_to_listen": time.perf_counter() - t2,
        }
        return f"http://{ip}:{self.port}"

    async def gpulab_end_launch(self) -> None:
        """After a failed start, before its cards go back: the container is stopped at once
        (SIGKILL, and Docker answers once it has exited)."""
        if not self.object_id:
            return
        try:
            await self.docker("stop", self.object_id, timeout=0)
        except docker.errors.APIError as e:
            if e.status_code != 404:  # 404: gone already
                raise

    async def _wait_answering(self, ip: str, port: int) -> None:
        deadline = time.monotonic() + self.start_timeout
        next_check = time.monotonic() + self.exit_check_interval
        while time.monotonic() < deadline:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), 1)
            except (OSError, TimeoutError):
                pass
            else:
                writer.close()
                return
            if time.monotonic() >= next_check:
                await self._raise_if_exited()
                next_check = time.monotonic() + self.exit_check_interval
            await asyncio.sleep(self.ready_poll_interval)
        raise SpawnError(500, f"Server did not listen on {ip}:{port} in {self.start_timeout}s")

    async def _raise_if_exited(self) -> None:
        """Fail a spawn whose server died before it listened, with its own last words, rather
        than waiting out start_timeout."""
        state = (await self.docker("inspect_container", self.object_id))["State"]
        if not state["Running"]:
            raise SpawnError(500, await self._early_exit_message(state))

    async def _early_exit_message(self, state: dict[str, Any]) -> str:
        raw = await self.docker("logs", self.object_id, tail=self.log_tail_lines)
        tail = raw.decode(errors="replace").rstrip("\n")
        why = f"code {state.get('ExitCode')}"
        if state.get("OOMKilled"):
            why += ", out of memory"
        return f"Server exited with {why} before it answered. Last log lines:\n{tail}"

    @classmethod
    async def sweep_node(cls, pool: GpuPool) -> None:
        await reap_containers(pool)

    def clear_state(self) -> None:
        self._stored_alloc = None
        super().clear_state()

    def _launched(self) -> bool:
        return bool(self.object_id)

    _stored_alloc: dict[str, Any] | None = None

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._stored_alloc = state.get("allocation")

    async def poll(self):
        status = await super().poll()
        if isinstance(status, str) and self.gpulab_job is not None and self._job_exit is None:
            # DockerSpawner's "ExitCode=N, Error=..., FinishedAt=...": kept before the container
            # is removed below.
            found = re.match(r"ExitCode=(-?\d+)", status)
            if found:
                self._job_exit = self.exit_code_of(int(found.group(1)))
        if status is None and self.allocation is None:
            # Running, yet no allocation claimed: the ledger lost the record, or the hub died
            # between starting the container and saving the server's state. The container's
            # labels (checked against the hub database where it has a record) say what it holds.
            await self._claim_from_container()
        elif status is not None and self.object_id and self.remove:
            await self._remove_dead()
        return status


def _write_mark(mark: Path, text: str) -> None:
    mark.parent.mkdir(parents=True, exist_ok=True)
    tmp = mark.with_name(f".{mark.name}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, mark)


def _docker_reason(e: Exception) -> str:
    explanation = getattr(e, "explanation", None)
    return str(explanation or e)
