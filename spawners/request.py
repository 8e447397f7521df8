"""One spawn as one typed value: :class:`SpawnRequest`, made once per spawn and handed on.

A spawn's facts used to travel as attributes the hub set on the spawner object. Now they travel
in one frozen value, each fact decided once and added on the way (``dataclasses.replace``):

1. **made**: the raw options parsed against the catalog and the course rules applied, once
   (:func:`make_request`, through ``GpuSpawnerMixin.spawn_request``), with who pays (a course
   staff's start: the course's pool only, ``courses.payer_of``).
2. **paid**: the balance asked once (``GpuSpawnerMixin.check_affordable``, billing's
   ``afford_hook``): ``afforded`` and the monthly reservation it runs on (``hold_id``), or the
   refusal (``refused``) the start then raises without asking again.
3. **admitted**: the spot market's answer (``admission``), asked once: admission changes the
   market's state (bids, the queue, reclaims).
4. **seated** and **launched** by the spawner's start: the user's courses (``seats``) and, once
   the cards are allocated, the server's GPU environment (``env``), handed to ``_launch``.

How the hub hands a request to the spawner (it never sets attributes on the spawner): the hub's
start gate (``hub_config/overrides/queue.py``) makes the request through the spawner, checks the
money and asks the market, then :func:`hand_over` files it here under the server's owner key
("user/server"). JupyterHub's spawn then runs the spawner's ``apply_user_options`` (gpulab's own)
or, when a deployment replaced that hook, its ``start``; either way the spawner :func:`take` s the
request handed over for exactly these raw options (once; a stale one, older than
:data:`HANDOVER_TTL`, is dropped), or makes its own when none was (the spot queue's starts, a
JupyterHub hub without gpulab's gate). The spawner keeps the request as its own state
(``GpuSpawnerMixin.gpulab_request``) until its server stops.

No GPU: the user's choice of GPU type is always a string, spelled one way on every floor:
a catalog slug, or ``gpulab.catalog.NO_GPU`` (``"none"``) for a server without GPUs. The form,
the JSON API, ``ServerOptions.gpu`` (there is no ``gpu_type`` property mapping it to None), the
course limits, the launch plan, billing's events, sessions and statements, the container labels
and ``GPULAB_GPU_TYPE`` all hold it; code compares with ``NO_GPU``, never with a bare word
(``tests/unit/test_no_gpu_spelling.py`` fails on one). Billing reads an empty or missing ``gpu``
as ``NO_GPU`` once, when it validates the event. One different fact keeps None: the type of the
cards a server *holds* (the allocator's ``Allocation.gpu_type``, persisted in its ledger; None:
no cards), which crosses to and from the choice only through ``gpulab.catalog.card_type`` and
``gpu_choice`` (see :mod:`gpulab.catalog.no_gpu`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from gpulab.catalog import Catalog
from gpulab.spawners.courses import apply_course_rules, payer_of, student_courses
from gpulab.spawners.market.admission import Admission
from gpulab.spawners.node.allocator import owner_key
from gpulab.spawners.options import FIELDS, ServerOptions, parse_options

# A request handed over but never taken (JupyterHub refused the spawn before it began) is not
# used for a later spawn after this many seconds: its money check and market answer are old.
HANDOVER_TTL = 120.0


@dataclass(frozen=True)
class CourseSeat:
    """One course of a server's user, as the hub's ``course_seats_hook`` reports it: the user's
    ``role`` in it (``student``, ``teacher`` or ``ta``) and the course's people by hub name."""

    course: str
    role: str
    students: tuple[str, ...] = ()
    staff: tuple[str, ...] = ()  # teachers and TAs

    @property
    def is_staff(self) -> bool:
        return self.role in ("teacher", "ta")


@dataclass(frozen=True)
class SpawnRequest:
    """Everything one spawn of one server carries, from the hub's start gate to the launch."""

    owner: str  # "user/server", the allocator's owner key
    raw: dict[str, Any]  # the options as asked (JupyterHub's user_options)
    options: ServerOptions  # parsed once, the course rules applied
    paid_by: str | None = None  # "course": the course's pool only (a course staff's start)
    afforded: bool = False  # the balance was asked and pays (asked once per spawn)
    refused: tuple[int, str] | None = None  # the money check's refusal: (status, message)
    hold_id: str | None = None  # the reservation billing was told this start runs on
    admission: Admission | None = None  # the market's answer, when it was asked already
    seats: tuple[CourseSeat, ...] = ()  # the user's courses at this start
    env: dict[str, str] = field(default_factory=dict)  # the GPU environment, once allocated
    made_at: float = field(default_factory=time.monotonic)

    @property
    def course(self) -> str | None:
        return self.options.course

    def paid(self, hold_id: str | None) -> SpawnRequest:
        return replace(self, afforded=True, refused=None, hold_id=hold_id)

    def refuse(self, status: int, message: str) -> SpawnRequest:
        return replace(self, afforded=False, refused=(status, message))

    def admitted(self, admission: Admission) -> SpawnRequest:
        return replace(self, admission=admission)

    def seated(self, seats: tuple[CourseSeat, ...]) -> SpawnRequest:
        return replace(self, seats=tuple(seats))

    def launched(self, env: dict[str, str]) -> SpawnRequest:
        return replace(self, env=dict(env))


def make_request(
    raw: Any, catalog: Catalog, user: Any, server: str, *, strict: bool = True
) -> SpawnRequest:
    """Parse ``raw`` options for ``user``'s ``server`` and apply the course rules: the request.

    ``strict``: every key must be a gpulab option (gpulab's own ``apply_user_options``). A
    deployment that set its own hook owns the keys that are not gpulab's: they are left to it.
    Raises OptionsError (bad field) or CourseRuleError (a course rule)."""
    raw = dict(raw or {}) if isinstance(raw, dict) else raw
    gpulab_raw = raw
    if not strict and isinstance(raw, dict):
        gpulab_raw = {k: v for k, v in raw.items() if k in FIELDS}
    options = parse_options(gpulab_raw, catalog)
    options = apply_course_rules(options, student_courses(user), catalog)
    return SpawnRequest(
        owner=owner_key(user.name, server),
        raw=raw if isinstance(raw, dict) else {},
        options=options,
        paid_by=payer_of(user.name, server),
    )


_HANDED: dict[str, SpawnRequest] = {}


def hand_over(request: SpawnRequest) -> None:
    """The hub's gate files ``request`` for the spawn about to begin on its server."""
    _HANDED[request.owner] = request


def take(owner: str, raw: Any) -> SpawnRequest | None:
    """The request handed over for ``owner``'s spawn of ``raw`` options (removed: it serves
    one spawn), or None. ``raw`` is what the gate was asked, or the options it made of them
    (JupyterHub spawns a request without options with the server's last ones, which gpulab
    saved as made)."""
    request = _HANDED.pop(owner, None)
    if request is None or time.monotonic() - request.made_at > HANDOVER_TTL:
        return None
    raw = raw or {}
    return request if raw in (request.raw, request.options.to_json()) else None


def drop(owner: str) -> None:
    """Forget a request handed over for ``owner`` (its spawn will not begin)."""
    _HANDED.pop(owner, None)
