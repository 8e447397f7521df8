"""What the preemption agent (:mod:`gpulab.spawners.inside.agent`) may report, checked.

The agent runs inside the user's server, as the user, so its output is the user's to shape (a
process that writes to the same pipe, a Python they replaced where they could). Whatever it
prints is read capped, parsed into these models (unknown keys and wrong types refused, texts
bounded) and only then stored in the market's records.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# More than any report of the agent needs (a signal report lists pids).
AGENT_OUTPUT_LIMIT = 64 * 1024

Pid = Annotated[int, Field(ge=1, le=2**31)]


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SignalReport(_Report):
    signalled: list[Pid] = Field(max_length=10_000)
    skipped: list[Pid] = Field(max_length=10_000)


class CheckpointReport(_Report):
    state: Literal["running", "done", "failed"]
    pid: Pid | None = None
    exit_code: Annotated[int, Field(ge=-255, le=255)] | None = None
    error: Annotated[str, Field(max_length=500)] | None = None
    finished_at: float | None = None
