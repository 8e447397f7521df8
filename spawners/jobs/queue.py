"""The fair queue of training jobs: which queued jobs start now, on which nodes, and why the
others wait, in words a person reads in ``gpulab jobs list``.

Pure: the hub's scheduler hands :func:`plan` the queued and running jobs, the free cards per node
(the pool's, with held cards, lab-session bookings and reservations already taken off) and the
limits; nothing here touches the clock, the disk or the hub.

The rules, in order of the queue (priority, highest first; then submission; then id):

1. **Limits** (:class:`Limits`): a user's running jobs and cards, a course's running jobs and
   cards. Running means starting or running, plus the jobs this pass starts, plus the waiting jobs
   ahead that hold a place for cards (rule 3): a user cannot hold the whole pool with a long line
   of big jobs. A job over a limit waits without holding a place.
2. **Spot price**: a spot job waits while the spot price of its type is above its bid, without
   holding a place (the cards stay free for others, and the price follows).
3. **Capacity**: a job starts where its cards are free: one node with ``gpus`` free cards of its
   type, or for a gang ``nodes`` distinct nodes with ``gpus`` free each, all or nothing. Nodes are
   chosen best-fit (fewest free cards that suffice), so whole nodes stay whole for big jobs. A job
   that cannot start may hold a place: the free cards it would use (on the nodes with the most
   free) are kept from the jobs after it, so a stream of small jobs never starves a big one. A
   later job that fits in what remains still starts (backfill).

   The place is bounded (issue 26, F2): **a waiting job keeps free cards from other users' later
   jobs only once it has waited ``reserve_after`` seconds, and only on nodes where the free cards
   and the cards jobs hold now are enough for it**, i.e. where the jobs running now give it what
   it needs by ending. Cards in notebook servers, which the queue cannot stop and which may never
   come back, are not waited for at other users' expense, and a fresh job takes nothing from
   anyone but its own owner's later jobs (a user's own small jobs never starve their big one).
   The reason a held-back job reads says so without naming anyone: "3 free, kept for an older
   job that has waited 20 min".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulab.catalog import NO_GPU
from gpulab.spawners.jobs.model import Job


@dataclass(frozen=True)
class Limits:
    """How much one user, or one course, may run at once (a course's limits only where set)."""

    max_running_per_user: int = 4
    max_cards_per_user: int = 16
    course_max_cards: Mapping[str, int] = field(default_factory=dict)
    course_max_running: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Free:
    """Free cards now: node -> GPU type -> cards nobody holds, books or reserved."""

    by_node: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class Decision:
    """For one queued job: start it now (on ``nodes``, rank order) or not, and why."""

    job_id: int
    start: bool
    reason: str
    nodes: tuple[str, ...] = ()


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


@dataclass
class _Hold:
    """The free cards a waiting job keeps from the jobs after it: always from its owner's own,
    from everyone's once ``aged`` (it has waited ``reserve_after``)."""

    job_id: int
    owner: str
    gpu: str
    waited: float
    aged: bool
    cards: dict[str, int]  # node -> cards kept there

    def applies_to(self, job: Job) -> bool:
        return self.gpu == job.spec.gpu and (self.aged or self.owner == job.owner)


def _waited(seconds: float) -> str:
    minutes = max(1, int(seconds // 60))
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@dataclass
class _Usage:
    running: int = 0
    cards: int = 0
    # Of the above, waiting jobs ahead holding a place (said so in the reason).
    waiting: int = 0

    def add(self, cards: int, waiting: bool = False) -> None:
        self.running += 1
        self.cards += cards
        self.waiting += int(waiting)


class _Pass:
    def __init__(
        self,
        running: list[Job],
        free: Free,
        limits: Limits,
        spot_price: Callable[[str], Decimal | None],
        gpu_name: Callable[[str], str],
        currency: str,
        now: float,
        reserve_after: float,
    ) -> None:
        self.limits = limits
        self.spot_price = spot_price
        self.gpu_name = gpu_name
        self.currency = currency
        self.now = now
        self.reserve_after = reserve_after
        # Free now, less what this pass starts (the places waiting jobs keep are in holds).
        self.free = {n: dict(types) for n, types in free.by_node.items()}
        self.holds: list[_Hold] = []
        self.users: dict[str, _Usage] = {}
        self.courses: dict[str, _Usage] = {}
        # The cards jobs hold now, node -> type -> cards (they come back when the jobs end); a
        # job still starting whose nodes are not known yet counts on every node ("anywhere").
        self.by_jobs: dict[str, dict[str, int]] = {}
        self.anywhere: dict[str, int] = {}
        for job in running:
            self._count(job)
            self._note_cards(job)

    def _note_cards(self, job: Job) -> None:
        spec = job.spec
        if spec.gpu == NO_GPU or spec.gpus == 0:
            return
        nodes = list(job.attempt.nodes) if job.attempt is not None else []
        if not nodes:
            self.anywhere[spec.gpu] = self.anywhere.get(spec.gpu, 0) + spec.cards()
            return
        for node in nodes:
            types = self.by_jobs.setdefault(node, {})
            types[spec.gpu] = types.get(spec.gpu, 0) + spec.gpus

    def _count(self, job: Job, waiting: bool = False) -> None:
        self.users.setdefault(job.owner, _Usage()).add(job.spec.cards(), waiting)
        if job.spec.course is not None:
            self.courses.setdefault(job.spec.course, _Usage()).add(job.spec.cards(), waiting)

    # ---- rule 1: limits --------------------------------------------------------------------

    def over_limit(self, job: Job) -> str | None:
        lim, cards = self.limits, job.spec.cards()
        use = self.users.get(job.owner, _Usage())
        if cards > lim.max_cards_per_user:
            return (
                f"it needs {_plural(cards, 'card')}, more than the {lim.max_cards_per_user} "
                "one user may hold at once; cancel it and submit a smaller one"
            )
        if use.running >= lim.max_running_per_user:
            return f"{self._yours(use)} (the limit is {lim.max_running_per_user} at once)"
        if use.cards + cards > lim.max_cards_per_user:
            held = "your jobs hold" if not use.waiting else "your jobs running or ahead need"
            return (
                f"{held} {_plural(use.cards, 'card')} and this one needs {cards} more "
                f"(the limit is {lim.max_cards_per_user} cards at once)"
            )
        course = job.spec.course
        if course is None:
            return None
        cuse = self.courses.get(course, _Usage())
        most_running = lim.course_max_running.get(course)
        if most_running is not None and cuse.running >= most_running:
            return (
                f"course {course} has {_plural(cuse.running, 'job')} running or first in line "
                f"(its limit is {most_running} at once)"
            )
        most_cards = lim.course_max_cards.get(course)
        if most_cards is not None and cards > most_cards:
            return (
                f"it needs {_plural(cards, 'card')}, more than the {most_cards} course {course} "
                "may hold at once"
            )
        if most_cards is not None and cuse.cards + cards > most_cards:
            return (
                f"course {course}'s jobs hold {_plural(cuse.cards, 'card')} and this one needs "
                f"{cards} more (its limit is {most_cards} cards at once)"
            )
        return None

    @staticmethod
    def _yours(use: _Usage) -> str:
        going = use.running - use.waiting
        if not use.waiting:
            return f"you have {_plural(going, 'job')} running"
        return (
            f"you have {_plural(going, 'job')} running and {use.waiting} waiting ahead of this one"
        )

    # ---- rule 2: spot price ----------------------------------------------------------------

    def above_bid(self, job: Job) -> str | None:
        spec = job.spec
        if spec.pricing != "spot" or spec.max_price is None:
            return None
        price = self.spot_price(spec.gpu)
        if price is None or price <= spec.max_price:
            return None
        return (
            f"the spot price of {self.gpu_name(spec.gpu)}, {self.money(price)} per card-hour, "
            f"is above your bid of {self.money(spec.max_price)}"
        )

    def money(self, amount: Decimal) -> str:
        return f"{self.currency} {amount:,.2f}".strip()

    # ---- rule 3: capacity ------------------------------------------------------------------

    def avail(self, job: Job) -> dict[str, int]:
        """Node -> cards of the job's type it may take: free, less the places kept from it."""
        gpu = job.spec.gpu
        out = {n: types.get(gpu, 0) for n, types in self.free.items()}
        for hold in self.holds:
            if hold.applies_to(job):
                for node, cards in hold.cards.items():
                    out[node] = out.get(node, 0) - cards
        return {n: max(c, 0) for n, c in out.items()}

    def place(self, job: Job, avail: dict[str, int] | None = None) -> tuple[str, ...] | None:
        """Best-fit distinct nodes for the job's ranks in what is available to it, or None."""
        gpus, nodes = job.spec.gpus, job.spec.nodes
        avail = self.avail(job) if avail is None else avail
        fits = sorted((cards, node) for node, cards in avail.items() if cards >= gpus)
        if len(fits) < nodes:
            return None
        return tuple(node for _, node in fits[:nodes])

    def take(self, gpu: str, gpus: int, nodes: tuple[str, ...]) -> None:
        for node in nodes:
            self.free[node][gpu] -= gpus  # what later reasons call free is what is left

    def comes_free(self, job: Job) -> list[str]:
        """The nodes where the free cards and the cards jobs hold now are enough for one rank of
        ``job``: there the jobs running now give it what it needs by ending."""
        gpu, gpus = job.spec.gpu, job.spec.gpus
        anywhere = self.anywhere.get(gpu, 0)
        nodes = set(self.free) | set(self.by_jobs)
        return [
            n
            for n in sorted(nodes)
            if self.free.get(n, {}).get(gpu, 0) + self.by_jobs.get(n, {}).get(gpu, 0) + anywhere
            >= gpus
        ]

    def hold_place(self, job: Job) -> None:
        """Keep from later jobs the free cards this waiting job would use first (its owner's
        always; everyone's once it has waited ``reserve_after``), on nodes that can give it
        what it needs when the jobs running now end; nowhere else."""
        gpu, gpus = job.spec.gpu, job.spec.gpus
        candidates = self.comes_free(job)
        if len(candidates) < job.spec.nodes:
            return  # it waits for cards no job holds (servers'): it keeps nothing from anyone
        avail = self.avail(job)
        most = sorted((-avail.get(n, 0), n) for n in candidates if avail.get(n, 0))
        cards = {n: min(avail[n], gpus) for _, n in most[: job.spec.nodes]}
        waited = max(0.0, self.now - job.submitted_at)
        aged = waited >= self.reserve_after
        self.holds.append(_Hold(job.id, job.owner, gpu, waited, aged, cards))

    def waiting_reason(self, job: Job) -> str:
        gpu, gpus, nodes = job.spec.gpu, job.spec.gpus, job.spec.nodes
        name = self.gpu_name(gpu)
        holds = [h for h in self.holds if h.applies_to(job)]
        free = {n: types.get(gpu, 0) for n, types in self.free.items()}
        kept = self._kept_by(job, holds) if self.place(job, free) is not None else ""
        ahead = len(holds)
        line = kept or (f"; {_plural(ahead, 'job')} ahead" if ahead else "")
        if nodes == 1:
            most = max(free.values(), default=0)
            return f"waiting for {gpus} x {name} on one node ({most} free{line})"
        enough = sum(1 for c in free.values() if c >= gpus)
        return (
            f"waiting for {nodes} nodes with {gpus} x {name} free each "
            f"({_plural(enough, 'such node')} now{line})"
        )

    @staticmethod
    def _kept_by(job: Job, holds: list[_Hold]) -> str:
        """Why cards free enough for ``job`` are not its: who keeps them, never by name."""
        holds = [h for h in holds if any(h.cards.values())]
        others = [h for h in holds if h.owner != job.owner]
        if others:
            first = max(h.waited for h in others)
            if len(holds) == 1:
                return f", kept for an older job that has waited {_waited(first)}"
            return f", kept for {len(holds)} older jobs; the first has waited {_waited(first)}"
        ids = ", ".join(str(h.job_id) for h in holds)
        return f", kept for your job{'s' if len(holds) > 1 else ''} {ids} ahead of this one"


def queue_order(jobs: list[Job]) -> list[Job]:
    """The order of the queue: priority (highest first), then submission, then id."""
    return sorted(jobs, key=lambda j: (-j.spec.priority, j.submitted_at, j.id))


def plan(
    queued: list[Job],
    running: list[Job],
    free: Free,
    limits: Limits,
    *,
    spot_price: Callable[[str], Decimal | None],
    now: float,
    reserve_after: float = 900.0,
    catalog: Any = None,
) -> list[Decision]:
    """One decision per queued job, in queue order: start now on these nodes, or why not.

    ``running``: the jobs starting or running now (they count towards the limits; their cards
    are already out of ``free``). ``spot_price(gpu_type)``: the spot price per card-hour now
    (None: none known, a spot job then is not held back for price). ``catalog`` (optional):
    GPU types' display names and the currency for the reasons. ``now`` (epoch seconds) and
    ``reserve_after``: a waiting job keeps cards from other users' later jobs only once it was
    submitted that many seconds before ``now`` (see the module's rule 3). Queued jobs whose
    cancel was asked get no decision.
    """
    gpu_types = getattr(catalog, "gpu_types", {}) or {}

    def gpu_name(slug: str) -> str:
        return gpu_types[slug].display_name if slug in gpu_types else slug

    currency = getattr(catalog, "currency", "")
    step = _Pass(running, free, limits, spot_price, gpu_name, currency, now, reserve_after)
    out: list[Decision] = []
    for job in queue_order([j for j in queued if not j.cancel_requested]):
        reason = step.over_limit(job) or step.above_bid(job)
        if reason is not None:
            out.append(Decision(job.id, False, reason))
            continue
        if job.spec.gpu == NO_GPU or job.spec.gpus == 0:
            step._count(job)
            out.append(Decision(job.id, True, "starting"))
            continue
        nodes = step.place(job)
        if nodes is not None:
            step.take(job.spec.gpu, job.spec.gpus, nodes)
            step._count(job)
            out.append(Decision(job.id, True, f"starting on {', '.join(nodes)}", nodes))
            continue
        out.append(Decision(job.id, False, step.waiting_reason(job)))
        step.hold_place(job)
        step._count(job, waiting=True)
    return out
