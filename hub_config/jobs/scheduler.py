"""The hub's job scheduler: queued jobs become running servers, and ended servers become
finished (or requeued) jobs.

A job attempt is one or more named servers of the job's owner (``job-<id>``, or
``job-<id>-<rank>`` for a gang), started and stopped through the hub's own REST API with the
platform's service token (:class:`~gpulab.spawners.market.hub_client.HubClient`, as the spot
market does), so every check a server start passes (balance 402, the market's admission, the
allocator's 409, the staff rule) applies to a job unchanged, and billing bills what it observes.

One pass (:meth:`JobScheduler.tick`, every ``interval`` seconds, jittered, and at once after a
submit or a cancel):

1. every starting or running job is watched through its spawners: all ready -> running; the
   runner's exit (``gpulab_exit_status``), a server that is gone, or a cancel -> the attempt ends
   (:meth:`_end_attempt`): its servers are stopped (cards freed at once), its output archived
   (:mod:`.logs`), why it ended is classified and what comes next decided (:mod:`.resume`), the
   owner told (:mod:`.notify`: webhook, home-page notice);
2. the queue is planned (:func:`gpulab.spawners.jobs.queue.plan`, pure) against the pool's free
   cards, and each job that may start gets its :class:`~gpulab.spawners.jobs.launch.JobLaunch`
   filed in the hub's memory before its server is asked for (:meth:`_start_attempt`); a job
   that waits keeps the plain reason the plan gave.

Everything the scheduler decides is saved in the job store (``DATA_DIR/jobs/jobs.jsonl``) before
it acts, so a hub killed at any point neither loses a job nor starts one twice: a job saved as
starting whose server never appeared is requeued as a lost attempt, and a running job whose
server JupyterHub restored is watched on.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from traitlets import Dict, Float, Integer
from traitlets.config import SingletonConfigurable

from gpulab.catalog import NO_GPU
from gpulab.hub_config.jobs import bounds, gang, logs, notify, resume, tokens
from gpulab.hub_config.jobs.starts import RETRY_STATUSES
from gpulab.hub_config.jobs.starts import answer as _answer
from gpulab.hub_config.jobs.starts import start_error as _start_error
from gpulab.spawners.courses import Course
from gpulab.spawners.jobs import launch as launches
from gpulab.spawners.jobs.model import (
    ACTIVE,
    CANCELLED,
    QUEUED,
    RUNNING,
    STARTING,
    TERMINAL,
    Attempt,
    Job,
)
from gpulab.spawners.jobs.queue import Decision, Free, Limits, plan
from gpulab.spawners.jobs.spec import check_course_rules, parse_job_spec
from gpulab.spawners.jobs.store import JobStore
from gpulab.spawners.market.hub_client import HubClient, server_path
from gpulab.spawners.node.allocator import owner_key
from gpulab.spawners.node.holds import accounts_for


class JobScheduler(SingletonConfigurable):
    """Starts queued jobs as their owners' ``job-*`` servers and follows them to their end."""

    interval = Float(
        1.0,
        help="""Seconds between two passes of the job scheduler (each pass watches starting and
        running jobs and starts what the queue allows; +-20 % jitter). A submit or a cancel
        runs a pass at once.""",
    ).tag(config=True)
    max_nodes = Integer(
        8,
        help="""The most nodes one job may span (a gang: one server per node). Only a spawner
        that runs gangs (the Swarm spawner) accepts more than 1.""",
    ).tag(config=True)
    max_running_per_user = Integer(
        4, help="How many jobs of one user may be starting or running at once."
    ).tag(config=True)
    max_queued_per_user = Integer(
        100, help="Most jobs a user may have queued; one more is 429, nothing made (0: no limit)."
    ).tag(config=True)
    max_cards_per_user = Integer(
        16, help="How many cards one user's starting and running jobs may hold together."
    ).tag(config=True)
    course_max_cards = Dict(
        help="""Per course (its slug): how many cards the jobs of that course may hold
        together, e.g. {"ml101": 8}. Courses not named have no limit of their own.""",
    ).tag(config=True)
    course_max_running = Dict(
        help="""Per course (its slug): how many of that course's jobs may be starting or running
        at once, e.g. {"ml101": 4}.""",
    ).tag(config=True)
    checkpoint_interval = Integer(
        1800,
        help="""Seconds between the automatic checkpoints of a job that names no
        checkpoint_interval of its own (the job is sent its checkpoint signal, SIGUSR1); 0 turns
        them off for such jobs.""",
    ).tag(config=True)
    max_user_priority = Integer(
        0,
        help="""The highest priority a user may give their own job (-10..10; jobs of higher
        priority start first). Admins may use up to 10.""",
    ).tag(config=True)
    log_max_bytes = Integer(
        64 * 1024 * 1024,
        help="""The most bytes of one attempt's output the hub keeps for a job (the newest
        output is kept).""",
    ).tag(config=True)
    retry_seconds = Float(
        15.0,
        help="""Seconds a job waits before its start is tried again after the hub refused it
        (balance, no free card, spot price above the bid).""",
    ).tag(config=True)
    reserve_after_seconds = Float(
        900.0,
        help="""Seconds a queued job that cannot start yet must have waited before it keeps the
        free cards of its type from other users' later jobs (so that a stream of small jobs does
        not starve a big one). Even then it keeps them only on nodes where the jobs running now
        will give it the cards it needs by ending: cards in notebook servers are never waited
        for at other users' expense. Until then, later jobs of other users that fit start
        (backfill); the owner's own later jobs always wait behind it.""",
    ).tag(config=True)
    stop_timeout = Float(
        120.0,
        help="Seconds the scheduler waits for an ended attempt's servers to stop.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pool: Any = None
        self.market: Any = None
        self.store: JobStore | None = None
        self.hub: HubClient | None = None
        self.notices: Any = None
        self.find_spawner: Callable[[str], Any] = lambda owner: None
        self.spawner_record: Callable[[str], Any] = lambda owner: None
        self._busy: set[int] = set()  # jobs a start or an end task is working on
        self._not_before: dict[int, float] = {}  # job -> no start tried before then
        self._planned: dict[int, tuple[str, ...]] = {}  # starting job -> nodes planned for it
        self._own_stops: set[str] = set()  # owner keys the scheduler itself is stopping
        self._tasks: set[asyncio.Task] = set()
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._since = time.time()  # attempts running from before are restored servers
        self._stopping = False

    # ---- wiring -------------------------------------------------------------------------------

    def attach(
        self,
        pool: Any,
        market: Any,
        hub: HubClient,
        find_spawner: Callable[[str], Any],
        notices: Any = None,
        spawner_record: Callable[[str], Any] | None = None,
    ) -> None:
        """Give the scheduler the hub's pool, market, REST client and spawner lookup
        (``spawner_record``: also a stopped server's, made from JupyterHub's record)."""
        self.spawner_record = spawner_record or find_spawner
        self.pool = pool
        self.market = market
        self.hub = hub
        self.find_spawner = find_spawner
        self.notices = notices
        self.store = JobStore.instance(pool.data_dir)

    def start(self, after: Any = None) -> None:
        """Run the passes on the hub's loop, from when ``after`` is done (the hub answers)."""
        if self._loop_task is None:
            self._loop_task = asyncio.ensure_future(self._loop(after))

    async def _loop(self, after: Any) -> None:
        self._wake = asyncio.Event()
        if after is not None:
            await after
        while True:
            try:
                await self.tick()
            except Exception:
                self.log.exception("Job scheduler pass failed")
            self._wake.clear()
            delay = self.interval * random.uniform(0.8, 1.2)
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass

    def shutdown(self) -> None:
        """The hub is stopping (and stops every server): no more passes, and the jobs running
        now are marked stopped by the hub, so that the next hub requeues them (their command
        did not fail: the platform stopped it) instead of reading the stop's exit code."""
        self._stopping = True
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self.store is None:
            return
        for job in self.store.list(states=ACTIVE):
            if job.stopped_by is None:
                job.stopped_by = "hub"
                self.store.save(job)

    def wake(self) -> None:
        """Run a pass now (after a submit or a cancel)."""
        if self._wake is not None:
            self._wake.set()

    def spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- what users do ------------------------------------------------------------------------

    def max_gpus(self, gpu_type: str) -> int:
        """The most cards of ``gpu_type`` any one node has."""
        counter = getattr(self.pool, "max_cards_per_node", None)
        if counter is not None:
            return int(counter(gpu_type))
        return sum(1 for d in self.pool.allocator.devices if d.gpu_type == gpu_type)

    def nodes_allowed(self, spawner_class: Any) -> int:
        """``max_nodes`` where the spawner runs gangs, else 1."""
        return self.max_nodes if getattr(spawner_class, "supports_gangs", False) else 1

    def submit(
        self,
        owner: str,
        raw: Any,
        *,
        admin: bool = False,
        gangs: bool = False,
        courses: Sequence[Course] = (),
    ) -> Job:
        """Validate and queue ``owner``'s job (``JobSpecError``, 400, naming the field).
        ``courses``: the owner's courses as a student; the job must pass their rules exactly as
        its server's start will (a course not theirs is refused here, not at every start)."""
        assert self.store is not None
        spec = parse_job_spec(
            raw,
            self.pool.catalog,
            max_nodes=self.max_nodes if gangs else 1,
            max_gpus=self.max_gpus,
            max_priority=10 if admin else self.max_user_priority,
            checkpoint_interval=self.checkpoint_interval,
        )
        check_course_rules(spec, list(courses), self.pool.catalog)
        bounds.check(spec, self.pool.catalog, self.store.list(owner, [QUEUED]), self)
        job = self.store.submit(owner, spec)
        self.log.info("Job %s of %s queued: %s", job.id, owner, spec.command[:80])
        self.wake()
        return job

    def cancel(self, job: Job) -> Job:
        """Cancel ``job``: a queued job at once; a starting or running one has its servers stopped
        by the next pass and ends cancelled. A finished job is left as it is."""
        assert self.store is not None
        current = self.store.get(job.id) or job
        if current.terminal:
            return current
        current.cancel_requested = True
        if current.state == QUEUED and current.id not in self._busy:
            current.state, current.reason = CANCELLED, "cancelled before it started"
            self._planned.pop(current.id, None)
        elif current.stopped_by is None:
            current.stopped_by = "user"
        self.store.save(current)
        if current.terminal:
            self._notify(current, "job-cancelled")
        self.wake()
        return current

    def note_stop(self, user: str, server: str, who: str) -> None:
        """Record who asked to stop a job's server (the REST DELETE override calls this): the
        owner or an admin ("user": cancel), billing ("billing": the balance ran out), the
        market ("market": preemption), or the scheduler itself."""
        from gpulab.spawners.jobs.model import parse_server_name

        parsed = parse_server_name(server)
        if parsed is None or self.store is None:
            return
        if who == "market" and owner_key(user, server) in self._own_stops:
            who = "scheduler"
        job = self.store.get(parsed[0])
        if job is None or job.owner != user or job.state not in ACTIVE:
            return
        if who == "scheduler" or job.stopped_by is not None:
            return
        job.stopped_by = who
        if who == "user":
            job.cancel_requested = True
        self.store.save(job)
        self.wake()

    # ---- one pass -----------------------------------------------------------------------------

    async def tick(self) -> None:
        """Watch active jobs, then start what the queue allows."""
        if self.store is None:
            return
        now = time.time()
        for job in self.store.list(states=ACTIVE):
            if job.id not in self._busy:
                await self._watch(job, now)
        self._start_planned(now)

    def spawner_of(self, job: Job, server: str) -> Any:
        try:
            return self.find_spawner(owner_key(job.owner, server))
        except Exception:
            return None

    async def _watch(self, job: Job, now: float) -> None:
        attempt = job.attempt
        if attempt is None:
            job.state, job.reason = QUEUED, "waiting to start"
            self.store.save(job)
            return
        spawners = [self.spawner_of(job, name) for name in attempt.servers]
        active = [s is not None and s.active for s in spawners]
        if job.cancel_requested:
            self._begin_end(job, {"stopped_by": job.stopped_by or "user"})
            return
        if job.state == STARTING:
            if not all(active):
                codes = [await _exit_status(s, job, i) for i, s in enumerate(spawners)]
                if all(c is not None for c in codes):  # it ran and ended before a pass saw it
                    self._begin_end(job, {"exit_codes": codes})
                    return
                error, status = _start_error(spawners)
                if status in RETRY_STATUSES and job.spec.nodes == 1:
                    # The card went to someone else between the plan and the start, or the
                    # balance fell: not an attempt, the job waits again.
                    self._back_to_queue(job, error, now)
                    return
                # A gang's other ranks are stopped first (all or nothing), then it waits again.
                retry = status in RETRY_STATUSES
                info = {"start_error": error or "", "lost": not error, "retry": retry}
                self._begin_end(job, info)
                return
            if all(s.ready for s in spawners):
                job.state, job.reason = RUNNING, ""
                attempt.running_at = now
                attempt.nodes = [self._node_of(job, s) for s in attempt.servers]
                self._planned.pop(job.id, None)
                resume.on_running(job, attempt)
                self.store.save(job)
                self.log.info("Job %s of %s running (attempt %s)", job.id, job.owner, attempt.n)
            return
        codes = [await _exit_status(s, job, i) for i, s in enumerate(spawners)]
        if self.restored(attempt) and all(c is None for c in codes):
            # The hub restarted while it ran: it is no longer the runner's parent (no exit code
            # of its own), so it asks the spawner whether the server still runs.
            polled = [await _poll(s) for s in spawners]
            if any(p is not None for p in polled):
                active = [a and p is None for a, p in zip(active, polled, strict=True)]
        ended = any(c is not None and c != 0 for c in codes) or all(c is not None for c in codes)
        if ended or not all(active):
            self._begin_end(job, {"exit_codes": codes})
            return
        if await logs.note_resumed(attempt, spawners[0], now):  # display only: the user's text
            self.store.save(job)
        if resume.checkpoint_due(job, now):
            await resume.signal_checkpoint(job, spawners, now)
            self.store.save(job)

    def restored(self, attempt: Attempt) -> bool:
        """Whether ``attempt`` was started by an earlier hub process (its servers restored)."""
        return attempt.started_at < self._since

    def _node_of(self, job: Job, server: str) -> str:
        alloc = self.pool.allocator.get(owner_key(job.owner, server))
        node = self.pool.allocator.node_of(alloc) if alloc is not None else None
        return node or "local"

    def _back_to_queue(self, job: Job, reason: str, now: float) -> None:
        if job.attempts and job.attempts[-1].running_at is None:
            job.attempts.pop()  # a refused start is not an attempt
        for server in job.server_names():
            launches.withdraw(owner_key(job.owner, server))
        job.state, job.reason = QUEUED, reason or "waiting to start"
        self._not_before[job.id] = now + self.retry_seconds
        self._planned.pop(job.id, None)
        self.store.save(job)

    # ---- starting -----------------------------------------------------------------------------

    def free_capacity(self, holding: dict[int, tuple[str, ...]] | None = None) -> Free:
        """Free cards by node and type: held cards and what reservations and bookings claim
        now are taken out (the allocator's own rule), and so are the cards of jobs started but
        not yet allocated (``holding``: job -> nodes)."""
        allocator = self.pool.allocator
        held = allocator.held_uuids()
        by_node: dict[str, dict[str, int]] = {}
        for d in allocator.devices:
            if d.uuid not in held:
                types = by_node.setdefault(d.node or "local", {})
                types[d.gpu_type] = types.get(d.gpu_type, 0) + 1
        now = time.time()
        for slug in {d.gpu_type for d in allocator.devices}:
            claim = allocator.held_out(slug, now)
            for node in sorted(by_node, key=lambda n: by_node[n].get(slug, 0)):
                take = min(claim, by_node[node].get(slug, 0))
                if take:
                    by_node[node][slug] -= take
                    claim -= take
        for job_id, nodes in (holding or {}).items():
            job = self.store.get(job_id)
            if job is None or job.spec.gpu == NO_GPU:
                continue
            for node, server in zip(nodes, job.server_names(), strict=False):
                if allocator.get(owner_key(job.owner, server)) is None and node in by_node:
                    left = by_node[node].get(job.spec.gpu, 0) - job.spec.gpus
                    by_node[node][job.spec.gpu] = max(left, 0)
        return Free(by_node=by_node)

    def limits(self) -> Limits:
        return Limits(
            max_running_per_user=self.max_running_per_user,
            max_cards_per_user=self.max_cards_per_user,
            course_max_cards={str(k): int(v) for k, v in self.course_max_cards.items()},
            course_max_running={str(k): int(v) for k, v in self.course_max_running.items()},
        )

    def _spot_price(self, slug: str) -> Decimal | None:
        try:
            return self.market.current_price(slug) if self.market is not None else None
        except Exception:
            return None

    def _start_planned(self, now: float) -> None:
        queued = []
        for job in self.store.list(states=[QUEUED]):
            if job.id in self._busy:
                continue
            if job.cancel_requested:  # cancelled while its start was being refused
                job.state, job.reason = CANCELLED, "cancelled before it started"
                self.store.save(job)
                self._notify(job, "job-cancelled")
                continue
            queued.append(job)
        if not queued:
            return
        running = self.store.list(states=ACTIVE)
        decisions = plan(
            queued,
            running,
            self.free_capacity(self._planned),
            self.limits(),
            spot_price=self._spot_price,
            now=now,
            reserve_after=self.reserve_after_seconds,
            catalog=self.pool.catalog,
        )
        by_id = {j.id: j for j in queued}
        for decision in decisions:
            job = by_id.get(decision.job_id)
            if job is None:
                continue
            waiting = self._not_before.get(job.id, 0) > now
            if not decision.start and self._on_its_own_hold(job, decision):
                # Cards reserved or booked for the owner (or their course) are kept out of
                # what everyone may take, and are theirs: the allocator takes them from the hold.
                decision = Decision(job.id, True, "starting on cards held for you")
            if decision.start and not waiting:
                self._not_before.pop(job.id, None)
                self._begin_start(job, decision, now)
            elif not decision.start and decision.reason:
                reason = resume.waiting_reason(job, decision.reason)
                if reason != job.reason:
                    job.reason = reason
                    self.store.save(job)

    def _on_its_own_hold(self, job: Job, decision: Decision) -> bool:
        """Whether a job that waits for cards (not for a limit or its bid) may start on a
        reservation or lab-session booking of its owner's or its course's right now."""
        spec = job.spec
        if spec.nodes != 1 or spec.gpu == NO_GPU or not decision.reason.startswith("waiting for"):
            return False
        accounts = accounts_for(job.owner, spec.course)
        return self.pool.allocator.usable_hold(accounts, spec.gpu, spec.gpus) is not None

    def make_launch(
        self,
        job: Job,
        attempt: Attempt,
        rank: int,
        *,
        env: dict[str, str] | None = None,
        alloc_id: str | None = None,
        network: str | None = None,
    ) -> launches.JobLaunch:
        """Rank ``rank``'s launch for ``attempt``, filed under its server's owner key."""
        launch = launches.JobLaunch(
            job_id=job.id,
            attempt=attempt.n,
            rank=rank,
            nodes=job.spec.nodes,
            gpus=job.spec.gpus,
            command=job.spec.command,
            cwd=job.spec.cwd,
            checkpoint_seconds=resume.checkpoint_seconds(self.market),
            env=dict(env or {}),
            alloc_id=alloc_id,
            network=network,
        )
        launches.offer(owner_key(job.owner, attempt.servers[rank]), launch)
        return launch

    async def start_rank(self, job: Job, rank: int) -> tuple[int, str]:
        """Ask the hub to start rank ``rank``'s server (as the platform): (status, body)."""
        assert self.hub is not None
        server = job.server_names()[rank]
        body = {"display_name": server, "user_options": job.spec.server_options()}
        return await self.hub.request("POST", server_path(job.owner, server), body)

    async def stop_rank(self, job: Job, rank: int) -> tuple[int, str]:
        """Ask the hub to stop rank ``rank``'s server (as the platform)."""
        assert self.hub is not None
        server = job.server_names()[rank]
        key = owner_key(job.owner, server)
        self._own_stops.add(key)
        try:
            return await self.hub.request("DELETE", server_path(job.owner, server))
        finally:
            self._own_stops.discard(key)

    def _begin_start(self, job: Job, decision: Decision, now: float) -> None:
        attempt = Attempt(n=len(job.attempts) + 1, started_at=now, servers=job.server_names())
        job.attempts.append(attempt)
        job.state, job.reason, job.stopped_by = STARTING, "starting", None
        self.store.save(job)  # before anything starts: a crash now requeues it as lost
        self._planned[job.id] = tuple(decision.nodes)
        self._busy.add(job.id)
        self.spawn_task(self._start_attempt(job.id, decision))

    async def _start_attempt(self, job_id: int, decision: Decision) -> None:
        # A start that fails (or whose command already ended) ends its attempt, but only after
        # this task's busy mark is gone: the end task sets its own (clearing it here afterwards
        # let a second pass end it again).
        ended: dict[str, Any] | None = None
        try:
            job = self.store.get(job_id)
            attempt = job.attempt
            if job.spec.nodes > 1:
                ended = await self._start_gang(job, attempt, decision)
                return
            self.make_launch(job, attempt, 0)
            code, body = await self.start_rank(job, 0)
            job = self.store.get(job_id)
            message, queued = _answer(body)
            if queued and self.market is not None:
                # The market would start it later on its own: the job queue waits instead.
                self.market.cancel_queued(owner_key(job.owner, attempt.servers[0]))
                self._back_to_queue(job, message, time.time())
            elif code in RETRY_STATUSES:
                self._back_to_queue(job, message, time.time())
            elif code >= 300 or code == 0:
                exited = await _exit_status(self.spawner_of(job, attempt.servers[0]), job, 0)
                if exited is not None:
                    # The command ran and ended before the hub saw its server answer; JupyterHub
                    # then calls the spawn failed ("Spawner failed to start [status=0]", after
                    # its slow_spawn_timeout on a busy hub): the job's end is its own exit.
                    self.log.info("Job %s exited (%s) while the hub started it", job_id, exited)
                    ended = {"exit_codes": [exited]}
                    return
                self.log.warning("Job %s could not start: %s %s", job_id, code, message)
                ended = {"start_error": message or f"HTTP {code}"}
                return
            self.log.info("Job %s of %s starting (attempt %s)", job.id, job.owner, attempt.n)
        except Exception:
            self.log.exception("Starting job %s failed", job_id)
        finally:
            self._busy.discard(job_id)
            if ended is not None:
                self._begin_end(self.store.get(job_id), ended)
            self.wake()

    async def _start_gang(
        self, job: Job, attempt: Attempt, decision: Decision
    ) -> dict[str, Any] | None:
        """Start a gang's ranks; the end info of a start that failed for good, else None."""
        try:
            await gang.start_gang(self, job, attempt, decision)
        except gang.GangNotStarted as e:
            job = self.store.get(job.id)
            if e.requeue:
                self._back_to_queue(job, e.reason, time.time())
                return None
            return {"start_error": e.reason}
        return None

    # ---- ending -------------------------------------------------------------------------------

    def _begin_end(self, job: Job, info: dict[str, Any]) -> None:
        if job.id in self._busy:
            return
        self._busy.add(job.id)
        self.spawn_task(self._end_attempt(job.id, info))

    async def _end_attempt(self, job_id: int, info: dict[str, Any]) -> None:
        try:
            await self._finish_attempt(job_id, info)
        except Exception:
            self.log.exception("Ending job %s's attempt failed", job_id)
        finally:
            self._busy.discard(job_id)
            self.wake()

    async def _finish_attempt(self, job_id: int, info: dict[str, Any]) -> None:
        job = self.store.get(job_id)
        attempt = job.attempt
        ended_at = time.time()
        codes = list(info.get("exit_codes") or [])
        servers = list(attempt.servers)
        spawners = [self.spawner_of(job, s) for s in servers]
        for i, spawner in enumerate(spawners):
            if i >= len(codes):
                codes.append(None)
            if codes[i] is None:
                codes[i] = await _exit_status(spawner, job, i)
        # Stop whatever still runs (the runner has exited, or it is cancelled): cards freed now.
        for rank, spawner in enumerate(spawners):
            if spawner is not None and (spawner.active or spawner.pending):
                await self.stop_rank(job, rank)
        await self._wait_stopped(job, servers)
        tokens.revoke(job.owner, servers, self.spawner_record, self.log)  # F6: die with it
        for i, spawner in enumerate(spawners):
            if codes[i] is None:  # the ranks the stop ended have their exit codes now
                codes[i] = await _exit_status(spawner, job, i)
        if info.get("retry"):
            # A gang whose rank was refused for now (a card taken, the balance): its started
            # ranks are stopped, nothing is archived, and it waits again.
            await logs.clear(spawners)
            for server in servers:
                launches.withdraw(owner_key(job.owner, server))
            if job.spec.nodes > 1:
                await gang.end_gang(self, job, attempt)
            self._back_to_queue(self.store.get(job_id), info.get("start_error", ""), time.time())
            return
        # A server JupyterHub found stopped (its wrapper dropped) still has its record and log.
        spawners = [
            s if s is not None else self.spawner_record(owner_key(job.owner, name))
            for s, name in zip(spawners, servers, strict=True)
        ]
        for i, spawner in enumerate(spawners):
            if codes[i] is None:  # a spawner that keeps its exit code past the drop (Swarm)
                codes[i] = await _exit_status(spawner, job, i)
        note = ""
        if self.restored(attempt) and codes and codes[0] is None:
            # No exit code the hub saw itself (it restarted meanwhile): the runner's own last
            # line in the server's log, the job's output (the user's to write: it decides only
            # their own job's state, never what is billed).
            output = await logs.server_output(spawners[0])
            output = output or await logs.archived(self.store.log_dir(job.id), attempt.n)
            codes[0] = logs.exit_code_in(output, job.id)
            if codes[0] is not None:
                note = "exit code read from the job's log (the hub restarted while it ran)"
        await logs.archive_attempt(
            self.store.log_dir(job.id), attempt.n, spawners, self.log_max_bytes
        )
        if job.spec.nodes > 1:
            await gang.end_gang(self, job, attempt)
        for server in servers:
            launches.withdraw(owner_key(job.owner, server))
        self._planned.pop(job.id, None)
        if self._stopping:
            return  # the hub is stopping: the next one decides from the saved record
        job = self.store.get(job_id)  # what arrived meanwhile (who stopped it, a cancel)
        attempt = job.attempt
        attempt.resumed_from = await logs.archived_resume(self.store.log_dir(job.id), attempt)
        exit_code = _job_exit_code(codes)
        if job.stopped_by == "hub":
            # Stopped by the hub's own shutdown: the command's exit is the stop's, not its own.
            exit_code, info = None, {**info, "lost": True}
        if job.spec.nodes > 1 and any(c is None for c in codes):
            # A rank without an exit code vanished with its node; the others' failure (a lost
            # peer) follows from it: the attempt is a node failure, not the command's.
            exit_code = None
        details = {
            "exit_code": exit_code,
            "stopped_by": job.stopped_by or info.get("stopped_by"),
            "owner_keys": [owner_key(job.owner, s) for s in servers],
            "start_error": info.get("start_error", ""),
            "server_gone": exit_code is None,
            "lost": bool(info.get("lost")),
        }
        attempt.ended_at = ended_at
        attempt.exit_code = exit_code
        attempt.end = resume.classify_end(job, attempt, details)
        if details["start_error"] and not attempt.note:
            attempt.note = details["start_error"]
        if note and not attempt.note:
            attempt.note = note
        resume.after_attempt(job, attempt)
        self.store.save(job)
        self.log.info(
            "Job %s of %s: attempt %s ended (%s, exit %s); job %s",
            job.id,
            job.owner,
            attempt.n,
            attempt.end,
            exit_code,
            job.state,
        )
        event = {
            "succeeded": "job-succeeded",
            "failed": "job-failed",
            "cancelled": "job-cancelled",
        }.get(job.state, "job-requeued")
        self._notify(job, event)

    async def _wait_stopped(self, job: Job, servers: list[str]) -> None:
        deadline = time.monotonic() + self.stop_timeout
        while time.monotonic() < deadline:
            spawners = [self.spawner_of(job, s) for s in servers]
            if all(s is None or not (s.active or s.pending) for s in spawners):
                return
            await asyncio.sleep(0.2)
        self.log.warning("Job %s's servers did not stop in %ss", job.id, self.stop_timeout)

    # ---- telling the owner --------------------------------------------------------------------

    def _notify(self, job: Job, event: str) -> None:
        notify.tell(self, job, event)

    # ---- the API's reads -----------------------------------------------------------------------

    async def output(self, job: Job) -> bytes:
        """The job's whole output so far (every attempt; see :mod:`.logs`)."""
        live = None
        if job.attempt is not None and job.state in ACTIVE | {STARTING}:
            live = self.spawner_of(job, job.attempt.servers[0])
        return await logs.job_output(self.store.log_dir(job.id), job, live)

    def finished(self, job_id: int) -> bool:
        """Whether the job has ended and its output is archived."""
        job = self.store.get(job_id)
        return job is None or (job.state in TERMINAL and job_id not in self._busy)


async def _poll(spawner: Any) -> int | None:
    """The spawner's own poll: None while its server runs."""
    if spawner is None:
        return 0
    try:
        return await spawner.poll()
    except Exception:
        return None


async def _exit_status(spawner: Any, job: Job | None = None, rank: int = 0) -> int | None:
    if job is not None:  # filed by its spawner, also one JupyterHub dropped since (launch.py)
        code = launches.exit_for(owner_key(job.owner, job.attempt.servers[rank]), job.attempt.n)
        if code is not None:
            return code
    reader = getattr(spawner, "gpulab_exit_status", None)
    if spawner is None or reader is None:
        return None
    try:
        return await reader()
    except Exception:
        return None


def _job_exit_code(codes: list[int | None]) -> int | None:
    """A gang's exit code: the first rank's that failed, else rank 0's."""
    failed = [c for c in codes if c is not None and c != 0]
    if failed:
        return failed[0]
    return codes[0] if codes else None
