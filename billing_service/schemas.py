"""The ingestion contract: batches of events, each with a unique id, as typed models.

Reporter events (from inside a user's server, with the server's own token)::

    {"id": "…", "kind": "kernel_start" | "kernel_restart" | "kernel_stop",
     "user": "alice", "server": "", "t": 1767225600.25, "kernel": "KERNEL-ID", "name": "python3"}
    {"id": "…", "kind": "app_start" | "app_stop", "user": "alice", "server": "", "t": …,
     "app": "sd-webui-4242-1a2b3c4d", "name": "sd-webui"}
    {"id": "…", "kind": "heartbeat", "user": "alice", "server": "", "t": …, "kernels": ["KERNEL-ID"],
     "apps": ["sd-webui-4242-1a2b3c4d"]}

Apps are web apps run by jupyter-server-proxy (e.g. Stable Diffusion WebUI). They are metered as
kernel-like units: ``app`` names one *run* of an app's process (a restarted process is a new run),
so that, exactly like a kernel, a run's span is [earliest report, latest report] and a gap between
two runs is never billed. ``apps`` is optional on a heartbeat, so reporters that predate apps still
send valid events. Apps are separate kinds with their own id field (not kernels with a naming
convention) so that the contract says what each id is and a kernel id can never be mistaken for
an app; kernel ids may not start with ``app:``, the prefix under which the metering stores app
runs next to kernels (see ``metering.APP_PREFIX``).

Hub events (from the hub's spawner hooks, with a token holding ``admin:users``)::

    {"id": "…", "kind": "server_start", "user": "alice", "server": "", "t": …,
     "gpu": "a100-80g" | "none", "gpus": 1, "pricing": "on-demand", "options": {…}}
    {"id": "…", "kind": "server_stop", "user": "alice", "server": "", "t": …}
    {"id": "…", "kind": "activity", "user": "alice", "server": "", "t": LAST,
     "span": "ALLOC-1", "first": FIRST}

``activity`` is what the hub itself saw (``gpulab.spawners.activity``): the server had processes
besides the single-user server (kernels, terminals, apps, anything they started) from ``first``
to ``t``. It is stored as a span keyed ``observed:SPAN`` next to kernel spans, so a server is
billed for the union of what the hub observed and what its reporter reported: reports add detail
but can never remove observed time.

``gpu`` is a catalog GPU type slug or ``"none"`` (``gpulab.catalog.NO_GPU``); an empty or missing
``gpu`` is read as ``"none"``.

``t`` is seconds since the Unix epoch (a number); it is stored as integer microseconds.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from gpulab.catalog import NO_GPU

REPORTER_KINDS = (
    "kernel_start",
    "kernel_restart",
    "kernel_stop",
    "app_start",
    "app_stop",
    "heartbeat",
)
HUB_KINDS = ("server_start", "server_stop", "activity")
MAX_BATCH = 10_000
# Events from further ahead than this (clock skew) are refused: they could extend a span forever.
MAX_FUTURE_S = 300

Id = Annotated[str, Field(min_length=1, max_length=128)]
Name = Annotated[str, Field(max_length=255)]
# Spans of app runs and of the hub's observed activity are stored under these prefixes, next to
# kernel spans (see the module doc).
APP_PREFIX = "app:"
OBSERVED_PREFIX = "observed:"


def _not_app_id(value: str) -> str:
    for prefix, what in ((APP_PREFIX, "apps"), (OBSERVED_PREFIX, "the hub's observations")):
        if value.startswith(prefix):
            raise ValueError(f"a kernel id may not start with {prefix!r} (reserved for {what})")
    return value


KernelId = Annotated[Id, AfterValidator(_not_app_id)]


class BatchError(ValueError):
    """A malformed batch; ``field`` names the offending field, e.g. ``events[3].t``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Id
    user: Annotated[str, Field(min_length=1, max_length=255)]
    server: Name = ""
    t: float

    @field_validator("t", mode="before")
    @classmethod
    def _finite_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number of seconds since the Unix epoch")
        if not math.isfinite(value) or value <= 0:
            raise ValueError("must be a positive finite number of seconds since the Unix epoch")
        return value

    @property
    def t_us(self) -> int:
        return round(self.t * 1_000_000)


class KernelEvent(_Event):
    kind: Literal["kernel_start", "kernel_restart", "kernel_stop"]
    kernel: KernelId
    name: Name = ""

    @property
    def unit(self) -> str:
        """The metered unit's key in the span table."""
        return self.kernel


class AppEvent(_Event):
    """One run of a jupyter-server-proxy app started (first seen) or stopped (last seen)."""

    kind: Literal["app_start", "app_stop"]
    app: Id
    name: Name = ""

    @property
    def unit(self) -> str:
        return APP_PREFIX + self.app


class Heartbeat(_Event):
    kind: Literal["heartbeat"]
    kernels: list[KernelId] = Field(max_length=1000)
    apps: list[Id] = Field(default_factory=list, max_length=1000)


class ServerStart(_Event):
    kind: Literal["server_start"]
    # The user's choice: a catalog GPU type slug, or NO_GPU. An empty or missing one is NO_GPU,
    # here and only here, so that the sessions, the rating and the statements know one spelling.
    gpu: Annotated[str, Field(min_length=1, max_length=64)] = NO_GPU
    gpus: Annotated[int, Field(ge=0, le=64)]
    pricing: Literal["on-demand", "spot"]
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("gpu", mode="before")
    @classmethod
    def _no_gpu_spelled_once(cls, value: Any) -> Any:
        return NO_GPU if value is None or value == "" else value


class ServerStop(_Event):
    kind: Literal["server_stop"]


class ActivityEvent(_Event):
    """The hub observed the server active from ``first`` to ``t`` (one span, growing)."""

    kind: Literal["activity"]
    span: Id
    first: float

    @field_validator("first", mode="before")
    @classmethod
    def _first_is_a_time(cls, value: Any) -> Any:
        return _Event._finite_number(value)

    @property
    def unit(self) -> str:
        return OBSERVED_PREFIX + self.span

    @property
    def first_us(self) -> int:
        return min(round(self.first * 1_000_000), self.t_us)


AnyEvent = Annotated[
    KernelEvent | AppEvent | Heartbeat | ServerStart | ServerStop | ActivityEvent,
    Field(discriminator="kind"),
]
_ADAPTER = TypeAdapter(AnyEvent)
KINDS = (*REPORTER_KINDS, *HUB_KINDS)


def _field_name(loc: tuple[Any, ...], index: int) -> str:
    # Drop the discriminator tag pydantic inserts ("heartbeat", …) from the location.
    parts = [p for p in loc if p not in KINDS]
    out = f"events[{index}]"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def parse_batch(
    body: Any, now_s: float
) -> list[KernelEvent | AppEvent | Heartbeat | ServerStart | ServerStop]:
    """Validate a whole batch; raise BatchError for the first bad field (nothing is stored then)."""
    if not isinstance(body, dict) or set(body) != {"events"}:
        raise BatchError("events", 'the body must be a JSON object {"events": [...]}')
    raw = body["events"]
    if not isinstance(raw, list) or not raw:
        raise BatchError("events", "must be a non-empty list of events")
    if len(raw) > MAX_BATCH:
        raise BatchError("events", f"at most {MAX_BATCH} events per batch, not {len(raw)}")
    out = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BatchError(f"events[{i}]", "must be a JSON object")
        kind = item.get("kind")
        if kind not in KINDS:
            raise BatchError(
                f"events[{i}].kind", f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}"
            )
        try:
            ev = _ADAPTER.validate_python(item)
        except ValidationError as e:
            err = e.errors()[0]
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            raise BatchError(_field_name(err["loc"], i), msg) from None
        if ev.t > now_s + MAX_FUTURE_S:
            raise BatchError(f"events[{i}].t", f"is more than {MAX_FUTURE_S} s in the future")
        if ev.id in seen and _ADAPTER.dump_python(out[seen[ev.id]]) != _ADAPTER.dump_python(ev):
            raise BatchError(f"events[{i}].id", f"repeats events[{seen[ev.id]}].id with other data")
        seen.setdefault(ev.id, i)
        out.append(ev)
    return out
