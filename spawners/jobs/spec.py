"""What a user submits as a training job, checked field by field before anything is queued.

``POST /hub/api/gpulab/users/NAME/jobs``, ``gpulab jobs submit`` and the JupyterLab panel all end
up in :func:`parse_job_spec`::

    {"command": "torchrun train.py", "cwd": "runs/a", "name": "llama-ft",
     "gpu": "a100-80g", "gpus": 8, "nodes": 2, "image": "pytorch", "datasets": ["@alice/faces"],
     "pricing": "on-demand" | "spot", "max_price": "2.00", "confirm_max_price": false,
     "course": "ml101" | null, "priority": 0, "checkpoint_interval": 1800, "max_attempts": 10}

The server fields (gpu, gpus, image, datasets, pricing, max_price, confirm_max_price, course) go
through the spawn contract's own reader (:func:`gpulab.spawners.options.parse_options`), so a job
asks for exactly what a server may ask for and is refused in the same words; the job's own fields
are checked here. Every refusal is a :class:`JobSpecError` naming the field and what is allowed;
nothing is "fixed" quietly.

A job is run as ``bash -lc COMMAND`` in ``$HOME/CWD`` of the owner's own account, inside the
job's server(s): the command is the user's to choose and runs with only their rights, so it is
checked for what would break the runner (length, NUL), not for what it does.

The course rules (:func:`check_course_rules`) are checked at submission too, by the same function
a server start uses: a job its owner's courses do not allow (a course they are not a student of,
a GPU type or image their course does not allow) is refused with 400 naming the field, never
queued to wait for a start that will always be refused (issue 26, F0/F3).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpulab.catalog import NO_GPU, Catalog
from gpulab.spawners.courses import Course, CourseRuleError, apply_course_rules
from gpulab.spawners.options import OptionsError, parse_options

COMMAND_MAX = 4096
CWD_MAX = 255
NAME_MAX = 64
PRIORITY_MIN, PRIORITY_MAX = -10, 10
CHECKPOINT_INTERVAL_DEFAULT = 1800
CHECKPOINT_INTERVAL_MIN, CHECKPOINT_INTERVAL_MAX = 60, 86400
MAX_ATTEMPTS_DEFAULT = 10
MAX_ATTEMPTS_MAX = 100
PRICING_DEFAULT = "on-demand"

# The server's own options a job may set (read by parse_options); the rest are the job's.
SERVER_FIELDS = (
    "gpu",
    "gpus",
    "image",
    "datasets",
    "pricing",
    "max_price",
    "confirm_max_price",
    "course",
)
JOB_FIELDS = ("command", "cwd", "name", "nodes", "priority", "checkpoint_interval", "max_attempts")
FIELDS = (*JOB_FIELDS[:3], *SERVER_FIELDS, *JOB_FIELDS[3:])


class JobSpecError(ValueError):
    """A submitted job refused. ``field`` is the offending key, ``allowed`` says in words what
    it may be; ``str()`` is ``"FIELD: message naming what is allowed"`` (the API's answer) and
    ``human`` the same for a person in front of a form. ``status`` is the HTTP answer (400)."""

    status = 400

    def __init__(self, field: str, message: str, allowed: str = "", human: str | None = None):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.allowed = allowed or message
        self.human = human or str(self)

    def details(self) -> dict[str, Any]:
        """The machine-readable part for JSON answers."""
        return {"field": self.field, "allowed": self.allowed}


class JobSpec(BaseModel):
    """A validated job. Build it with :func:`parse_job_spec`, never directly from input (a stored
    job is read back with :meth:`from_json`)."""

    model_config = ConfigDict(frozen=True)

    command: str
    cwd: str = ""
    name: str = ""
    gpu: str  # a catalog GPU type slug, or NO_GPU
    gpus: int  # cards per node: 0 with NO_GPU
    nodes: int = 1
    image: str
    datasets: tuple[str, ...] = ()
    pricing: str = PRICING_DEFAULT
    max_price: Decimal | None = None  # per card-hour; spot only
    # Spot only: the user confirmed a bid above ten times the on-demand price (as for servers).
    confirm_max_price: bool = False
    course: str | None = None
    priority: int = 0
    checkpoint_interval: int = CHECKPOINT_INTERVAL_DEFAULT
    max_attempts: int = MAX_ATTEMPTS_DEFAULT

    def server_options(self) -> dict[str, Any]:
        """The ``user_options`` each rank's server is started with: what
        :func:`~gpulab.spawners.options.parse_options` reads back to the same server."""
        out: dict[str, Any] = {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "image": self.image,
            "datasets": list(self.datasets),
            "pricing": self.pricing,
        }
        if self.pricing == "spot" and self.max_price is not None:
            out["max_price"] = str(self.max_price)
            if self.confirm_max_price:
                out["confirm_max_price"] = True
        if self.course is not None:
            out["course"] = self.course
        return out

    def cards(self) -> int:
        """All the cards the job holds while it runs: cards per node times nodes."""
        return self.gpus * self.nodes

    def to_json(self) -> dict[str, Any]:
        """As stored and shown: the bid as a decimal string (a float would round it)."""
        out = self.model_dump(mode="json")
        out["datasets"] = list(self.datasets)
        out["max_price"] = None if self.max_price is None else str(self.max_price)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobSpec:
        """A stored spec read back as it was accepted (limits checked at submission only: a job
        queued before an operator lowered a limit is not made unreadable by it)."""
        return cls.model_validate(data)


def _int(field: str, value: Any, lo: int, hi: int, allowed: str) -> int:
    if isinstance(value, bool) or not (
        isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    ):
        raise JobSpecError(field, f"must be a whole number {allowed}, not {value!r}", allowed)
    n = int(value)
    if not lo <= n <= hi:
        raise JobSpecError(field, f"must be {allowed}, not {n}", allowed)
    return n


def _text(field: str, value: Any, limit: int) -> str:
    if not isinstance(value, str):
        raise JobSpecError(field, f"must be a string, not {value!r}", "a string")
    if len(value) > limit:
        raise JobSpecError(
            field, f"at most {limit} characters, not {len(value)}", f"at most {limit} characters"
        )
    if "\x00" in value:
        raise JobSpecError(field, "must not contain a NUL character", "text without NUL")
    return value


def _command(value: Any) -> str:
    allowed = f"a shell command line of 1 to {COMMAND_MAX} characters, run as bash -lc COMMAND"
    if value is None:
        raise JobSpecError("command", f"is required: {allowed}", allowed)
    if isinstance(value, list):
        raise JobSpecError(
            "command", f"must be one string (a shell command line), not a list: {allowed}", allowed
        )
    command = _text("command", value, COMMAND_MAX)
    if not command.strip():
        raise JobSpecError("command", f"must not be empty: {allowed}", allowed)
    return command


def _cwd(value: Any) -> str:
    allowed = (
        f"a folder relative to your home, without '..', at most {CWD_MAX} characters "
        "(empty: the home itself)"
    )
    cwd = _text("cwd", value, CWD_MAX)
    if cwd.startswith("/") or cwd.startswith("~"):
        raise JobSpecError("cwd", f"must be relative to your home, not {cwd!r}: {allowed}", allowed)
    if any(part == ".." for part in cwd.split("/")):
        raise JobSpecError("cwd", f"must not contain '..', not {cwd!r}: {allowed}", allowed)
    if not cwd.isprintable():
        raise JobSpecError("cwd", f"must be printable characters, not {cwd!r}", allowed)
    return cwd


def _name(value: Any) -> str:
    allowed = f"a label of at most {NAME_MAX} printable characters"
    name = _text("name", value, NAME_MAX)
    if not name.isprintable():
        raise JobSpecError("name", f"must be printable characters, not {name!r}", allowed)
    return name


def parse_job_spec(
    raw: Any,
    catalog: Catalog,
    *,
    max_nodes: int,
    max_gpus: Callable[[str], int],
    max_priority: int = PRIORITY_MAX,
    checkpoint_interval: int = CHECKPOINT_INTERVAL_DEFAULT,
) -> JobSpec:
    """Validate a submitted job (a JSON object) against the catalog and this hub's capacity.

    ``max_nodes``: the most nodes one job may span (1 where the spawner runs no gangs);
    ``max_gpus(gpu_type)``: the most cards of that type any one node has (0: none has it);
    ``max_priority``: the highest priority this submitter may ask for (an API may let only
    admins raise a job above 0); ``checkpoint_interval``: the hub's default when the job names
    none. Unknown keys are refused, naming the key.
    """
    if not isinstance(raw, dict):
        allowed = f"a JSON object with keys {', '.join(FIELDS)}"
        raise JobSpecError("job", f"must be {allowed}", allowed)
    unknown = sorted(str(k) for k in set(raw) - set(FIELDS))
    if unknown:
        allowed = f"the fields {', '.join(FIELDS)}"
        raise JobSpecError(unknown[0], f"unknown field; allowed: {', '.join(FIELDS)}", allowed)

    command = _command(raw.get("command"))
    cwd = _cwd(raw.get("cwd", "") if raw.get("cwd") is not None else "")
    name = _name(raw.get("name", "") if raw.get("name") is not None else "")

    server = {k: raw[k] for k in SERVER_FIELDS if k in raw}
    try:
        opts = parse_options(server, catalog)
    except OptionsError as e:
        message = str(e).split(": ", 1)[1] if ": " in str(e) else str(e)
        raise JobSpecError(e.field, message, message, e.human) from None
    if opts.pricing != "spot" and raw.get("max_price") is not None:
        allowed = 'a bid for spot jobs only; set "pricing": "spot" or omit max_price'
        raise JobSpecError("max_price", f"is {allowed}", allowed)

    if opts.gpu != NO_GPU:
        most = max_gpus(opts.gpu)
        display = catalog.gpu_types[opts.gpu].display_name
        if most < 1:
            allowed = "a GPU type some node of this hub has"
            raise JobSpecError(
                "gpu", f"no node of this hub has {display} cards: choose {allowed}", allowed
            )
        if opts.gpus > most:
            allowed = f"at most {most} {display} cards on one node"
            raise JobSpecError(
                "gpus",
                f"{allowed}, not {opts.gpus} (ask for more nodes with nodes)",
                allowed,
            )

    nodes = raw.get("nodes", 1) if raw.get("nodes") is not None else 1
    if max_nodes <= 1:
        nodes = _int("nodes", nodes, 1, 1, "1 (this hub runs a job on one node)")
    else:
        nodes = _int("nodes", nodes, 1, max_nodes, f"between 1 and {max_nodes}")
    if nodes > 1 and opts.gpu == NO_GPU:
        allowed = "1 in no-GPU mode (a job on many nodes needs a GPU type)"
        raise JobSpecError("nodes", f"must be {allowed}, not {nodes}", allowed)

    top = min(max_priority, PRIORITY_MAX)
    priority = raw.get("priority", 0) if raw.get("priority") is not None else 0
    priority = _int("priority", priority, PRIORITY_MIN, top, f"between {PRIORITY_MIN} and {top}")

    interval = raw.get("checkpoint_interval")
    interval = checkpoint_interval if interval is None else interval
    allowed = f"0 (off) or between {CHECKPOINT_INTERVAL_MIN} and {CHECKPOINT_INTERVAL_MAX} seconds"
    interval = _int("checkpoint_interval", interval, 0, CHECKPOINT_INTERVAL_MAX, allowed)
    if 0 < interval < CHECKPOINT_INTERVAL_MIN:
        raise JobSpecError("checkpoint_interval", f"must be {allowed}, not {interval}", allowed)

    attempts = raw.get("max_attempts")
    attempts = MAX_ATTEMPTS_DEFAULT if attempts is None else attempts
    attempts = _int(
        "max_attempts", attempts, 1, MAX_ATTEMPTS_MAX, f"between 1 and {MAX_ATTEMPTS_MAX}"
    )

    return JobSpec(
        command=command,
        cwd=cwd,
        name=name,
        gpu=opts.gpu,
        gpus=opts.gpus,
        nodes=nodes,
        image=opts.image,
        datasets=opts.datasets,
        pricing=opts.pricing,
        max_price=opts.max_price if opts.pricing == "spot" else None,
        confirm_max_price=opts.confirm_max_price,
        course=opts.course,
        priority=priority,
        checkpoint_interval=interval,
        max_attempts=attempts,
    )


def check_course_rules(spec: JobSpec, courses: list[Course], catalog: Catalog) -> None:
    """Refuse (:class:`JobSpecError`, 400 naming the field) a job its owner's ``courses`` (their
    courses as a student, :func:`gpulab.spawners.courses.student_courses`) do not allow, by the
    rules every server start applies (:func:`~gpulab.spawners.courses.apply_course_rules`):
    a user in no course may name none; a student's job must fit one of their courses."""
    opts = parse_options(spec.server_options(), catalog)
    try:
        apply_course_rules(opts, list(courses), catalog)
    except CourseRuleError as e:
        message = str(e).split(": ", 1)[1] if ": " in str(e) else str(e)
        raise JobSpecError(e.field, message, message) from None
