"""What every gpulab spawner shares: option validation, GPU allocation, GPU env, state, progress.

A concrete spawner (local processes, Docker) mixes this in and implements ``_launch`` (start the
server its :class:`~gpulab.spawners.request.SpawnRequest` describes, with the request's GPU
environment, and return its URL) and its own stop/poll.

A spawn is one :class:`SpawnRequest` (see :mod:`gpulab.spawners.request` for how the hub hands
it over): gpulab's ``apply_user_options`` takes the one the hub's gate made for these options, or
makes it (parse and course rules, once); a deployment that replaced ``apply_user_options`` gets
it made by ``start`` from the gpulab fields of ``user_options``. The start then asks the balance
(``afford_hook``) unless the gate did, tells billing (``pre_allocate_hook``), asks the market
unless the gate did, allocates, and launches. The request is the spawner's own state
(``gpulab_request``); nothing outside the spawner sets it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from tornado import web
from traitlets import Any as AnyTrait
from traitlets import Float, HasTraits, default

from gpulab.catalog import card_type, gpu_choice
from gpulab.spawners.activity import Observation
from gpulab.spawners.apps import AppServersMixin
from gpulab.spawners.courses import CourseRuleError, student_courses
from gpulab.spawners.form import render_form
from gpulab.spawners.jobs.launch import (
    JobLaunch,
    forget_exit,
    is_job_server,
    launch_for,
    note_exit,
)
from gpulab.spawners.market.admission import MarketAnswer
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node import counters
from gpulab.spawners.node.allocator import Allocation, NoCapacity, owner_key
from gpulab.spawners.node.holds import accounts_for
from gpulab.spawners.node.pool import GpuPool
from gpulab.spawners.node.procs import ENV_ALLOC, ENV_HUB
from gpulab.spawners.options import (
    OptionsError,
    ServerOptions,
    check_cards_fit,
    options_from_form,
    parse_options,
)
from gpulab.spawners.request import CourseSeat, SpawnRequest, make_request, take
from gpulab.spawners.storage.datasets import is_private
from gpulab.spawners.storage.homes import StorageError, home_name


class SpawnError(web.HTTPError):
    """A spawn failure whose message is meant for the person who clicked start: ``message`` in
    the API's words (field names), ``human`` in plain words for pages ("" when the message is
    plain already), ``details`` machine-readable extras of the JSON answer (``field``,
    ``confirm``)."""

    def __init__(
        self, status: int, message: str, human: str = "", details: dict | None = None
    ) -> None:
        super().__init__(status, log_message=message.replace("%", "%%"), reason=None)
        self.jupyterhub_message = message
        self.human = human
        self.details = dict(details or {})


class GpuSpawnerMixin(AppServersMixin, HasTraits):
    """Mixin for a JupyterHub Spawner class (put it first in the bases)."""

    # This server's spawn request (gpulab.spawners.request): made or taken by the spawner at
    # its start, restored from its state after a hub restart, gone when the server stops.
    gpulab_request: SpawnRequest | None = None
    allocation: Allocation | None = None
    # A job server's launch (spawners/jobs/launch.py): taken at its start from what the hub's
    # job scheduler filed, restored from its state after a hub restart, gone when it stops.
    gpulab_job: JobLaunch | None = None
    # The job runner's exit code once its process ended, as the hub saw it (kept past the stop,
    # for the scheduler; reset at the next start): see the _job_exit property.
    _gpulab_job_exit: int | None = None
    # Human label of the running mode, e.g. "A100-80G x1 (simulated)" or "No GPU".
    mode_label: str = ""
    # Seconds per phase of the last launch, as the concrete spawner measured them.
    launch_timings: dict[str, float] = {}  # replaced per launch, never mutated
    # The options of the last server, kept past its stop (clear_state empties the state): a
    # rejected request puts them back as the server's saved choices.
    _stopped_options: dict[str, Any] = {}  # replaced per stop, never mutated

    pre_allocate_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""An async callable(spawner, request) awaited at every start with its SpawnRequest,
        after the balance was asked (afford_hook) and before GPUs are allocated. Raise
        SpawnError to refuse the start with a message for the user (gpulab's billing reports the
        server's start here).""",
    )

    afford_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""An async callable(spawner, request) asked once per SpawnRequest, before anything
        is stopped, reserved or reclaimed for it (a switch, the hub's start gate, else the start
        itself): raise SpawnError (402) when the user cannot pay for the request's options;
        else return the id of the monthly reservation the server will run on, or None
        (gpulab's billing sets it).""",
    )

    course_seats_hook = AnyTrait(
        None,
        allow_none=True,
        config=True,
        help="""A callable(spawner), sync or async, returning the user's courses as CourseSeat
        objects (course, the user's role, the course's students and staff), asked at every
        start before GPUs are allocated. The spawner gives the server an nbgrader configuration
        and access to those courses' assignment exchanges only (gpulab's hub wiring sets it;
        None: no courses).""",
    )

    ready_redirect_wait = Float(
        3.0,
        config=True,
        help="""Seconds the spawn page waits for this server before showing JupyterHub's progress
        page. A server that is ready within this time is opened directly, without the progress
        page in between (JupyterHub itself waits 1 s and always goes through it). Longer spawns
        (image pulls, busy nodes) show progress after this many seconds.""",
    )

    @property
    def pool(self) -> GpuPool:
        return GpuPool.instance(config=self.config)

    @property
    def gpulab_options(self) -> ServerOptions | None:
        """The options of this server's request (None before a start and after a stop)."""
        return self.gpulab_request.options if self.gpulab_request is not None else None

    @property
    def course_seats(self) -> tuple[CourseSeat, ...]:
        """The user's courses at this start (course_seats_hook), for nbgrader's setup."""
        return self.gpulab_request.seats if self.gpulab_request is not None else ()

    def spawn_request(self, raw: Any) -> SpawnRequest:
        """The request for a spawn of ``raw`` options (parsed, the course rules applied); raise
        SpawnError 400 naming the field, or the course rule's status. With gpulab's own
        ``apply_user_options`` every key must be a gpulab option; a deployment's own hook owns
        the keys that are not."""
        own = type(self)._apply_gpulab_options
        strict = getattr(self, "apply_user_options", own) is own
        try:
            request = make_request(
                raw, self.pool.catalog, self.user, self.name or "", strict=strict
            )
        except OptionsError as e:
            raise SpawnError(400, f"Invalid spawn option {e}", e.human, e.details()) from None
        except CourseRuleError as e:
            raise SpawnError(e.status, f"Not allowed: {e}") from None
        self._check_cards_fit(request.options)
        self._check_private_datasets(request.options)
        return request

    def _check_cards_fit(self, options: ServerOptions) -> None:
        """No more cards than the largest node of the type has (400 naming gpus)."""
        if options.gpu not in self.pool.catalog.gpu_types:
            return
        try:
            check_cards_fit(options, self.pool.catalog, self.pool.max_cards_per_node(options.gpu))
        except OptionsError as e:
            raise SpawnError(400, f"Invalid spawn option {e}", e.human, e.details()) from None

    def _check_private_datasets(self, options: ServerOptions) -> None:
        """Users' own datasets (``@OWNER/NAME``) mount only for whom they are shared with (the
        one rule, spawners/storage/datasets.py; the server's user, whoever starts it): 400
        naming ``datasets``, in the same words for one that does not exist."""
        private = [d for d in options.datasets if is_private(d)]
        if not private:
            return
        courses = [c.name for c in student_courses(self.user)]
        try:
            self.pool.datasets.check_readable(private, self.user.name, courses)
        except StorageError as e:
            raise SpawnError(
                400,
                f"Invalid spawn option {e}",
                "A dataset you chose is not one you may use: it is neither yours nor shared "
                "with you.",
                {"field": "datasets"},
            ) from None

    async def check_affordable(self, request: SpawnRequest) -> SpawnRequest:
        """``request`` as billing answers it (see afford_hook), asked once per request: paid,
        with its reservation; raise SpawnError (402) when the user cannot pay."""
        if request.refused is not None:
            raise SpawnError(*request.refused)
        if request.afforded or self.afford_hook is None:
            return request
        return request.paid(await self.afford_hook(self, request))

    # ---- node hooks, called by the hub's plugin ------------------------------------------------

    @classmethod
    def prepare_node(cls, pool: GpuPool, config: Any) -> None:
        """Called once at hub start, before any spawn (e.g. warm a fork server). Default: none."""

    @classmethod
    async def sweep_node(cls, pool: GpuPool) -> None:
        """Called after each orphan sweep of the pool: remove what this spawner class left running
        for allocations no server holds any more (e.g. containers). Default: nothing to do."""

    # ---- options -----------------------------------------------------------------------------

    @default("args")
    def _default_args(self) -> list[str]:
        # Servers have no business phoning jupyter.org for news or updates: nodes and containers
        # may be offline, and renters should not get a consent pop-up on their first page.
        return [
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]

    @default("default_url")
    def _default_url(self) -> str:
        return "/lab"

    @default("poll_interval")
    def _default_poll_interval(self) -> int:
        # Polling is cheap (a pid, one inspect), and a dead server's GPUs should return to the
        # pool quickly.
        return 5

    @default("options_form")
    def _default_options_form(self):
        return render_form

    @default("options_from_form")
    def _default_options_from_form(self):
        return options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return type(self)._apply_gpulab_options

    def _apply_gpulab_options(self, raw: dict[str, Any]) -> None:
        try:
            request = self._take_or_make_request(raw)
        except SpawnError as e:
            # user.spawn saved the bad options as "future defaults" before calling us; put the
            # last good ones back so a failed request changes nothing.
            self.orm_spawner.user_options = self._last_good_options()
            self._record_spawn("refused", e, where="options", started=time.time(), duration=0.0)
            raise
        self.gpulab_request = request
        self.user_options = request.options.to_json()
        self.orm_spawner.user_options = request.options.to_json()

    def _take_or_make_request(self, raw: Any) -> SpawnRequest:
        """The request the hub's gate handed over for these options, else a new one."""
        handed = take(self.owner, raw)
        return handed if handed is not None else self.spawn_request(raw)

    def _start_request(self) -> SpawnRequest:
        """This start's request: the one apply_user_options made, or (a deployment's own hook
        applied the options) made now from the gpulab fields of user_options."""
        if self.gpulab_request is None:
            self.gpulab_request = self._take_or_make_request(self.user_options)
        return self.gpulab_request

    def _last_good_options(self) -> dict[str, Any]:
        if self.gpulab_options is not None:
            return self.gpulab_options.to_json()
        return dict(self._stopped_options)

    # ---- allocation --------------------------------------------------------------------------

    @property
    def owner(self) -> str:
        # JupyterHub's own spawner tests make spawners without a user (load_state, clear_state).
        user = getattr(self, "user", None)
        return owner_key(user.name if user is not None else "", self.name)

    def _allocate(self, request: SpawnRequest) -> Allocation:
        """Take this server's cards, once the spot market admits the spawn (the request's
        admission, when the hub's gate asked the market already: it is not asked again)."""
        opts = request.options
        launch = self.gpulab_job
        if launch is not None and launch.alloc_id:
            return self._adopt_job_cards(launch.alloc_id)
        refusal = None
        if request.admission is not None:
            refusal = request.admission.refusal
        else:
            try:
                # The spot market decides first: spot price vs bid, queueing, on-demand reclaims.
                SpotMarket.instance(config=self.config).admit(self, opts)
            except MarketAnswer as e:
                refusal = e
        if refusal is not None:
            raise SpawnError(refusal.status, refusal.message, refusal.human)
        self._spawn_stage = "allocator"  # a refusal from here on: no free card (metrics)
        try:
            alloc = self.pool.allocator.allocate(
                self.owner,
                card_type(opts.gpu),
                opts.gpus,
                opts.pricing,
                accounts=accounts_for(self.user.name, opts.course),
                hold_id=request.hold_id,
            )
        except NoCapacity as e:
            raise SpawnError(409, str(e), e.human) from None
        self.allocation = alloc
        self.mode_label = self._label(alloc)
        return alloc

    def _adopt_job_cards(self, alloc_id: str) -> Allocation:
        """A gang's rank runs on the cards the scheduler allocated ahead for all ranks at once
        (all or nothing, the market asked for the whole gang): this server takes its own."""
        self._spawn_stage = "allocator"
        alloc = self.pool.allocator.adopt(self.owner, alloc_id)
        if alloc is None:
            raise SpawnError(
                409,
                f"The job's cards (allocation {alloc_id}) are no longer held for {self.owner}",
                "The cards set aside for this job are gone; it waits for cards again.",
            )
        self.allocation = alloc
        self.mode_label = self._label(alloc)
        return alloc

    def _label(self, alloc: Allocation) -> str:
        catalog = self.pool.catalog
        if alloc.gpu_type is None:
            return catalog.no_gpu.display_name
        devices = [self.pool.inventory.by_uuid(u) for u in alloc.uuids]
        simulated = any(d is not None and d.simulated for d in devices)
        label = f"{catalog.gpu_types[alloc.gpu_type].display_name} x{len(alloc.uuids)}"
        return label + (" (simulated)" if simulated else "")

    def _release(self) -> None:
        if self.allocation is not None:
            released = self.pool.allocator.release(self.owner, self.allocation.alloc_id)
            if released is not None:
                self.log.info(
                    "Released %s of %s (GPUs: %s)",
                    released.alloc_id,
                    self.owner,
                    ", ".join(released.uuids) or "none",
                )
            self.allocation = None

    def resource_limits(self, alloc: Allocation) -> tuple[float, str]:
        """(CPUs, memory such as "32G") of a server with this allocation, from the catalog."""
        catalog = self.pool.catalog
        if alloc.gpu_type is None:
            return catalog.no_gpu.cpus, catalog.no_gpu.mem
        gpu_type = catalog.gpu_types[alloc.gpu_type]
        n = len(alloc.uuids)
        number, unit = gpu_type.mem_per_card[:-1], gpu_type.mem_per_card[-1]
        return gpu_type.cpus_per_card * n, f"{float(number) * n:g}{unit}"

    def gpu_env(self, alloc: Allocation) -> dict[str, str]:
        """The environment that pins a server to its cards (and says what it is)."""
        simulated = any(
            (d := self.pool.inventory.by_uuid(u)) is not None and d.simulated for u in alloc.uuids
        )
        opts = self.gpulab_options
        env = {
            ENV_ALLOC: alloc.alloc_id,
            ENV_HUB: self.pool.hub_id,
            "GPULAB_MODE": self.mode_label,
            "GPULAB_GPU_TYPE": gpu_choice(alloc.gpu_type),
            "GPULAB_GPU_COUNT": str(len(alloc.uuids)),
            "GPULAB_GPUS_SIMULATED": "1" if simulated else "0",
            "GPULAB_PRICING": alloc.pricing,
            "GPULAB_PRICE_PER_HOUR": str(opts.price_per_hour(self.pool.catalog)) if opts else "",
            "GPULAB_CURRENCY": self.pool.catalog.currency,
            "GPULAB_IMAGE": opts.image if opts else "",
            "GPULAB_DATASETS": ",".join(opts.datasets) if opts else "",
            "GPULAB_APP": opts.app if opts else "",
            # The user's courses and roles (nbgrader's --course names), e.g. "ml101:teacher".
            "GPULAB_COURSES": ",".join(f"{s.course}:{s.role}" for s in self.course_seats),
            **self.app_env(),
        }
        if alloc.uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(alloc.uuids)
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(alloc.uuids)
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    # ---- jobs (issue 26) ---------------------------------------------------------------------

    def _take_job_launch(self) -> JobLaunch | None:
        """This start's job launch, for a ``job-*`` server: filed by the hub's job scheduler
        (spawners/jobs/launch.py). A ``job-*`` server nobody filed a launch for is refused
        (403 naming server_name): only the platform starts job servers."""
        if not is_job_server(self.name or ""):
            return None
        launch = launch_for(self.owner)
        if launch is None:
            raise SpawnError(
                403,
                f"server_name: {self.name!r}: servers named job-* are started by the job "
                "scheduler only; submit a job instead (POST /hub/api/gpulab/users/NAME/jobs)",
                "Job servers are started by gpulab's job queue: submit a job instead.",
                {"field": "server_name"},
            )
        return launch

    def job_env(self, alloc: Allocation) -> dict[str, str]:
        """What the job runner (spawners/inside/jobrunner.py) needs besides the GPU environment:
        the command, the attempt, the rank, the server's CPUs, the rendezvous. Empty for a
        server that is no job's."""
        launch = self.gpulab_job
        if launch is None:
            return {}
        cpus, _ = self.resource_limits(alloc)
        return {
            **launch.env,
            "GPULAB_JOB_ID": str(launch.job_id),
            "GPULAB_JOB_ATTEMPT": str(launch.attempt),
            "GPULAB_JOB_COMMAND": launch.command,
            "GPULAB_JOB_CWD": launch.cwd,
            "GPULAB_JOB_NODES": str(launch.nodes),
            "GPULAB_JOB_RANK": str(launch.rank),
            "GPULAB_JOB_GPUS": str(len(alloc.uuids)),
            "GPULAB_JOB_CPUS": str(max(1, int(cpus))),
            "GPULAB_CHECKPOINT_SECONDS": f"{launch.checkpoint_seconds:g}",
        }

    def job_shm_bytes(self, per_card: int) -> int:
        """A job's /dev/shm: the catalog's shm per card for each of its cards (data loaders
        share batches through it), the catalog's one share for any other server."""
        if self.gpulab_job is None or self.allocation is None:
            return per_card
        return per_card * max(1, len(self.allocation.uuids))

    async def gpulab_exit_status(self) -> int | None:
        """The job runner's exit code once its process ended (128+N when a signal N ended it),
        from the hub's own observation of the process or container; None while it runs or
        where the spawner cannot tell (e.g. a server adopted after a hub restart)."""
        return self._job_exit

    @property
    def _job_exit(self) -> int | None:
        """The job runner's exit code as this spawner saw it (None while it runs or unknown)."""
        return self._gpulab_job_exit

    @_job_exit.setter
    def _job_exit(self, code: int | None) -> None:
        # Every spawner sets its runner's exit code here, whatever saw it (poll, stop, Popen,
        # Docker's ExitCode): it is also filed in the hub's memory under the owner key and
        # attempt, where the scheduler finds it after JupyterHub dropped this spawner.
        self._gpulab_job_exit = code
        if code is not None and self.gpulab_job is not None:
            note_exit(self.owner, self.gpulab_job.attempt, code)

    @staticmethod
    def exit_code_of(status: int) -> int:
        """A process's exit status as a shell shows it: 128+N for a process killed by N."""
        return 128 - status if status < 0 else status

    # ---- progress ----------------------------------------------------------------------------

    def _progress_reset(self) -> None:
        self._progress_events: list[dict[str, Any]] = []
        self._progress_steps: list[tuple[float, str]] = []  # (seconds, message): the spawn log
        self._progress_changed = asyncio.Event()
        self._progress_done = False
        self._spawn_t0 = time.perf_counter()
        self._spawn_wall0 = time.time()

    def emit_progress(self, progress: int, message: str) -> None:
        if not hasattr(self, "_progress_events"):
            self._progress_reset()
        elapsed = time.perf_counter() - self._spawn_t0
        self._progress_events.append(
            {"progress": progress, "message": f"{message} ({elapsed:.2f}s)"}
        )
        self._progress_steps.append((elapsed, message))
        self._progress_changed.set()

    def _progress_finish(self) -> None:
        self._progress_done = True
        if hasattr(self, "_progress_changed"):
            self._progress_changed.set()

    def progress_events(self) -> list[dict[str, Any]]:
        """The steps of the current (or last) spawn so far, as ``progress()`` yields them."""
        return list(getattr(self, "_progress_events", []))

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """Yield the real spawn steps as they happen (allocating, datasets, starting, waiting)."""
        if not hasattr(self, "_progress_events"):
            self._progress_reset()
        sent = 0
        while True:
            while sent < len(self._progress_events):
                yield self._progress_events[sent]
                sent += 1
            if self._progress_done:
                return
            self._progress_changed.clear()
            try:
                await asyncio.wait_for(self._progress_changed.wait(), timeout=1)
            except TimeoutError:
                pass

    # ---- state -------------------------------------------------------------------------------

    def gpulab_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.allocation is not None:
            state["allocation"] = self.allocation.to_json()
        if self.gpulab_options is not None:
            state["options"] = self.gpulab_options.to_json()
        if self.mode_label:
            state["mode_label"] = self.mode_label
        if self.gpulab_job is not None:
            state["job"] = self.gpulab_job.to_json()
        return state

    def _launched(self) -> bool:
        """Whether a server process or container exists to save state for."""
        raise NotImplementedError

    def clear_state(self) -> None:
        # Called on every stop path: clean stop, server found dead, failed spawn. Everything
        # gpulab_state() saves goes: a stopped server holds no GPUs, options or mode.
        self._release()
        if self.gpulab_request is not None:
            self._stopped_options = self.gpulab_request.options.to_json()
        self.gpulab_request = None
        self.gpulab_job = None
        self.mode_label = ""
        super().clear_state()

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self._launched():
            state.update(self.gpulab_state())
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.load_gpulab_state(state)

    def load_gpulab_state(self, state: dict[str, Any]) -> None:
        rec = state.get("allocation")
        if rec:
            alloc = self.pool.allocator.adopt(self.owner, rec["alloc_id"])
            if alloc is None:
                self.log.warning(
                    "%s: stored allocation %s is not in the ledger; not claiming GPUs %s",
                    self.owner,
                    rec["alloc_id"],
                    rec.get("uuids"),
                )
            self.allocation = alloc
        if state.get("options"):
            try:
                self.gpulab_request = self.restored_request(state["options"])
            except OptionsError as e:
                self.log.warning("%s: stored options no longer valid: %s", self.owner, e)
        self.mode_label = state.get("mode_label", "")
        if state.get("job"):
            try:
                self.gpulab_job = JobLaunch.from_json(state["job"])
            except (KeyError, TypeError, ValueError) as e:
                self.log.warning("%s: stored job launch unreadable: %s", self.owner, e)

    def restored_request(self, options: dict[str, Any]) -> SpawnRequest:
        """The request of a server that runs already (its saved options; raises OptionsError)."""
        return SpawnRequest(
            owner=self.owner, raw=options, options=parse_options(options, self.pool.catalog)
        )

    # ---- the spawn ---------------------------------------------------------------------------

    async def gpulab_start(self) -> str | tuple[str, int]:
        """Allocate, then launch; on any failure end what was launched, then give the GPUs back."""
        self._progress_reset()
        self._spawn_stage = "balance"  # who refuses, for the refusals' metric
        self._job_exit = None
        forget_exit(self.owner)
        try:
            self.gpulab_job = self._take_job_launch()
            request = await self.check_affordable(self._start_request())
            self.gpulab_request = request
            refusal = request.admission.refusal if request.admission is not None else None
            if refusal is not None:
                # The market refused at the hub's gate: billing is not told of a start that
                # never was (it would open a session for it).
                self._spawn_stage = "market"
                raise SpawnError(refusal.status, refusal.message, refusal.human)
            self._spawn_stage = "billing"
            if self.pre_allocate_hook is not None:
                await self.pre_allocate_hook(self, request)
            request = request.seated(await self.gpulab_course_seats())
            self.gpulab_request = request
            self._spawn_stage = "market"
            self.emit_progress(10, "Allocating GPUs")
            alloc = self._allocate(request)
            self.emit_progress(
                20,
                f"Allocated {self.mode_label}"
                + (f": {', '.join(alloc.uuids)}" if alloc.uuids else ""),
            )
            t_alloc = time.perf_counter() - self._spawn_t0
            request = request.launched({**self.gpu_env(alloc), **self.job_env(alloc)})
            self.gpulab_request = request
            self._spawn_stage = "launch"
            url = await self._launch(request)
            total = time.perf_counter() - self._spawn_t0
            opts = self.gpulab_options
            what = "JupyterLab" if opts is None or opts.app == "jupyterlab" else "The server"
            self.emit_progress(100, f"{what} is ready on {self.mode_label}")
            # Parsed by benchmarks/spawn.py for its breakdown: keep the format.
            phases = " ".join(f"{k}={v:.3f}s" for k, v in self.launch_timings.items())
            self.log.info(
                "gpulab spawn timing %s: allocate=%.3fs launch=%.3fs total=%.3fs %s",
                self.owner,
                t_alloc,
                total - t_alloc,
                total,
                phases,
            )
            self._record_spawn("success")
            return url
        except BaseException as e:
            self._record_spawn("failure", e)
            await self._end_failed_start()
            raise
        finally:
            self._progress_finish()

    @property
    def gpulab_spawner_kind(self) -> str:
        """``local``, ``docker``, ``swarm`` (the class name without Gpu...Spawner)."""
        name = type(self).__name__
        name = name[3:] if name.startswith("Gpu") else name
        return (name[: -len("Spawner")] if name.endswith("Spawner") else name).lower()

    def _record_spawn(
        self,
        outcome: str,
        error: BaseException | None = None,
        where: str | None = None,
        started: float | None = None,
        duration: float | None = None,
    ) -> None:
        """Count this spawn's end for the hub's metrics (:mod:`gpulab.spawners.node.counters`):
        a refusal (an answer below 500 before the launch) by its reason, else success or
        failure, with its duration and steps. Never raises."""
        try:
            status = getattr(error, "status_code", None)
            where = where or getattr(self, "_spawn_stage", "")
            message = str(getattr(error, "jupyterhub_message", "") or error or "")
            if error is not None and status is not None and status < 500 and where != "launch":
                outcome = "refused"
            opts = self.gpulab_options
            app = opts.app if opts is not None and opts.app != "jupyterlab" else ""
            counters.record_spawn(
                owner=self.owner,
                spawner=self.gpulab_spawner_kind,
                app=app,
                gpu=opts.gpu if opts is not None else "",
                outcome=outcome,
                started=started if started is not None else self._spawn_wall0,
                duration=(
                    duration if duration is not None else time.perf_counter() - self._spawn_t0
                ),
                steps=list(getattr(self, "_progress_steps", [])) if duration is None else [],
                reason=counters.refusal_reason(status, message, where) if error else "",
                status=status,
                message=message,
            )
        except Exception:
            self.log.exception("Could not record the spawn of %s for the metrics", self.owner)

    async def _end_failed_start(self) -> None:
        """A start failed (or JupyterHub cancelled it at ``start_timeout``): end everything its
        launch started, and only then give the cards back. A card back in the pool while a
        process of this server still runs could be handed to someone else while that process
        still uses it; a clean-up that fails keeps the cards (the stop JupyterHub runs after a
        failed start, or the orphan sweep, ends the processes and then releases them)."""
        if self.allocation is None:
            return
        try:
            await self.gpulab_end_launch()
        except BaseException:
            self.log.exception(
                "Could not end what the failed start of %s left; its cards stay held until it "
                "is stopped",
                self.owner,
            )
            return
        self._release()

    async def gpulab_end_launch(self) -> None:
        """End every process or container that ``_launch`` started, after a failed start; raise
        if some may still run. Default: nothing (a launch that leaves nothing running)."""

    async def gpulab_course_seats(self) -> tuple[CourseSeat, ...]:
        """The user's courses now, from ``course_seats_hook`` (none without one)."""
        if self.course_seats_hook is None:
            return ()
        seats = self.course_seats_hook(self)
        if inspect.isawaitable(seats):
            seats = await seats
        return tuple(seats or ())

    async def _launch(self, request: SpawnRequest) -> str | tuple[str, int]:
        """Start the server ``request`` describes, with its GPU environment (``request.env``)
        added; return its URL or (ip, port), as start()."""
        raise NotImplementedError

    # ---- observation, called by the hub's activity observer ------------------------------------

    async def observe_activity(self) -> Observation | None:
        """This server's processes besides the single-user server itself, found where the user
        cannot hide them (its cgroup, its container), the GPU processes on its cards, and the CPU
        time everything in it consumed, the server's own process included (``Observation.cpu``:
        per cgroup, container or process, as the kernel accounts it; None if not measurable,
        then any process counts as work); None when the spawner cannot tell (then nothing is
        observed, nothing billed from it)."""
        return None

    # ---- preemption warning (spot), called by the market ----------------------------------------

    async def gpulab_signal_processes(self) -> tuple[list[int], list[int]]:
        """Send SIGUSR1 to this server's processes that catch it, where they run.

        Only processes with a SIGUSR1 handler installed (they opted in, e.g. with
        ``gpulab_spot.on_preempt``) get it: its default action would kill the others. Returns
        (signalled, skipped) pids, as the user sees them in the server. May raise; the market
        records the failure and goes on with the warning."""
        raise NotImplementedError

    async def gpulab_run_checkpoint(
        self,
        command: str,
        limit: float,
        env: dict[str, str] | None = None,
        on_start: Callable[[dict[str, Any]], None] | None = None,
        on_result: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Run the user's checkpoint ``command`` where the server runs, and wait for it.

        With bash, as the server's user, in its home, with the server's environment plus
        ``env``; its output in ``~/.gpulab/checkpoints/<UTC time>.log``; killed with its process
        group after ``limit`` seconds. ``on_start`` gets the running record (``command``,
        ``state`` "running", ``log``, ``started_at``) once the command runs. Returns the record
        with ``exit_code`` (None if killed or it could not run, with ``error``),
        ``finished_at`` and ``state`` ("done" or "failed"). A spawner that knows the result
        before it can return (a process still to reap) may pass it to ``on_result`` first, so
        the user sees "running" no longer than the command ran."""
        raise NotImplementedError

    def user_home_name(self) -> str:
        """The user name made safe as one path component, never another user's (one rule for
        every spawner and the hub: :func:`gpulab.spawners.storage.homes.home_name`)."""
        return home_name(self.user.name)
