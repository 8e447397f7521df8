"""How the hub answered the job scheduler's start of a job server, and whether waiting helps.

The scheduler starts each attempt's servers through the hub's REST API, so a start is refused in
the hub's own words (JSON ``message``/``human``, or a failed spawn's exception). Some refusals
change by waiting (the balance, a card taken meanwhile, too many spawns at once): the job goes
back to the queue with the answer as its reason. Every other one (a bad option's 400, a course
rule's 403: e.g. the student left the course) will not, so the job ends failed with it instead of
waiting forever in its place in the queue, keeping cards from everyone behind it (issue 26, F0).
"""

from __future__ import annotations

import json
from typing import Any

# Answers to a start that mean "not now": the balance (402), no free card (409), too many
# spawns (429). Anything else fails the job.
RETRY_STATUSES = (402, 409, 429)


def answer(body: str) -> tuple[str, bool]:
    """(the hub's message for a person, whether the market queued the start) of an answer."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:500], False
    if not isinstance(data, dict):
        return str(data)[:500], False
    message = str(data.get("human") or data.get("message") or "")
    return message, bool(data.get("queued"))


def start_error(spawners: list[Any]) -> tuple[str, int | None]:
    """The error of a spawn that failed (its message and HTTP status), or ("", None)."""
    for spawner in spawners:
        future = getattr(spawner, "_spawn_future", None)
        if future is None or not future.done() or future.cancelled():
            continue
        error = future.exception()
        if error is None:
            continue
        status = getattr(error, "status_code", None)
        message = getattr(error, "jupyterhub_message", None) or getattr(error, "log_message", None)
        return str(message or error), status
    return "", None
