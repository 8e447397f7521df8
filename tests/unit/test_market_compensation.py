"""Whether a reclaimed spot server is compensated: only when the platform broke its promise to
the checkpoint (attack 03: a user's own failing checkpoint must not refund their session)."""

from __future__ import annotations

from typing import Any

import pytest

from gpulab.spawners.market.preemption import Preemption, compensation_decision

WARNED = 1_780_000_000.0
WARNING = 300.0  # warning_seconds
TIMEOUT = 240.0  # checkpoint_timeout


def record(checkpoint: dict[str, Any] | None) -> Preemption:
    return Preemption(
        id="p-1",
        owner="u/",
        user="u",
        server="",
        gpu_type="h100",
        reason="on-demand-reclaim",
        status="stopped",
        price="1.0",
        max_price="2.0",
        warned_at=WARNED,
        deadline=WARNED + WARNING,
        checkpoint=checkpoint,
    )


def ran(state: str, ended: float | None, **result: Any) -> dict[str, Any]:
    """A checkpoint as the market recorded it: started 0.2 s into the warning, ``ended`` on
    the market's clock (None: still running when the stop was sent)."""
    return {"command": "x", "state": state, "started_at": WARNED + 0.2, "ended_at": ended, **result}


@pytest.mark.parametrize(
    ("checkpoint", "says"),
    [
        # Attack 03: `exit 3` at once, then the reclaim at the deadline.
        (ran("failed", WARNED + 1, exit_code=3), "your checkpoint command exited 3"),
        (
            ran("failed", WARNED + 0.2 + TIMEOUT, exit_code=None, error="timed out after 240s"),
            "ran past its 240 s limit",
        ),
        (ran("failed", WARNED + 2, error="OSError: no such file"), "failed (OSError"),
        (ran("done", WARNED + 5, exit_code=0), "saved the work"),
        (None, "no checkpoint command was set"),
        # Still running at the stop, but it had all the time it was promised (e.g. it ignores
        # its deadline with checkpoint_timeout above the warning period).
        (ran("running", None), "still ran after the 240 s it was promised"),
    ],
    ids=["exit-3", "own-timeout", "error", "saved", "no-command", "ran-over"],
)
def test_a_checkpoint_that_failed_on_its_own_is_not_compensated(checkpoint, says) -> None:
    due, why = compensation_decision(record(checkpoint), TIMEOUT, WARNED + WARNING)
    assert not due
    assert why.startswith("no compensation: ") and says in why


@pytest.mark.parametrize(
    "checkpoint",
    [
        ran("running", None),  # the stop came while it ran
        ran("failed", WARNED + 31, exit_code=-9),  # killed by that stop, a moment later
    ],
    ids=["running-at-the-stop", "killed-by-the-stop"],
)
def test_a_checkpoint_stopped_before_its_promised_time_is_compensated(checkpoint) -> None:
    """A forced early stop, a node lost, a restart cutting the warning short: the server was
    stopped 30 s after the warning while the checkpoint was promised 240 s."""
    due, why = compensation_decision(record(checkpoint), TIMEOUT, WARNED + 30)
    assert due and why.startswith("compensated: ") and "promised 240 s" in why


def test_the_promise_is_bounded_by_the_announced_deadline() -> None:
    """With a checkpoint timeout longer than the warning, the promise is the warning period:
    a command still running at the deadline had all it was promised."""
    p = record(ran("running", None))
    assert not compensation_decision(p, 600.0, WARNED + WARNING)[0]
    assert compensation_decision(p, 600.0, WARNED + WARNING - 10)[0]


def test_the_market_posts_no_compensation_for_a_users_failing_checkpoint(tmp_path) -> None:
    """Attack 03 through the market's own records: the checkpoint `exit 3` ended on its own, the
    reclaim stopped the server at the deadline. No credit is posted; the record says why. A
    stop sent before the promised time is posted, with the platform's outcome."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from gpulab.spawners.market.preemption import Preemptions

    posted: list[dict[str, Any]] = []

    async def hook(**kw: Any) -> None:
        posted.append(kw)

    market = SimpleNamespace(
        log=logging.getLogger("test"),
        dir=tmp_path,
        checkpoint_timeout=TIMEOUT,
        compensation_hook=hook,
    )
    books = Preemptions(market)
    own = record(ran("failed", WARNED + 1, exit_code=3)).model_copy(
        update={"stop_sent_at": WARNED + WARNING}
    )
    asyncio.run(books._compensate(own))
    assert posted == []
    assert books.records["p-1"].compensation == {
        "due": False,
        "reason": "no compensation: your checkpoint command exited 3",
    }
    cut = record(ran("running", None)).model_copy(update={"id": "p-2", "stop_sent_at": WARNED + 30})
    asyncio.run(books._compensate(cut))
    assert [(c["key"], c["checkpoint"]) for c in posted] == [("preemption-p-2", "cut-short")]
    assert books.records["p-2"].compensation["due"] is True
    # The reasons survive a restart (the records' file).
    assert Preemptions(market).records["p-1"].compensation["due"] is False


def test_a_hub_restart_that_loses_a_running_checkpoint_is_compensated(tmp_path) -> None:
    """The hub restarted 10 s into the warning while the checkpoint ran: the market lost the
    command and its outcome. On load it marks the checkpoint lost (its own clock); at the
    deadline the reclaim is compensated. A checkpoint that had ended is not touched."""
    import logging
    import time
    from types import SimpleNamespace

    from gpulab.spawners.market.preemption import Preemptions
    from gpulab.spawners.market.store import PREEMPTIONS_FILE, append_jsonl

    now = time.time()
    running = record(ran("running", None)).model_copy(
        update={"status": "warning", "warned_at": now - 10, "deadline": now - 10 + WARNING}
    )
    ended = running.model_copy(
        update={"id": "p-2", "owner": "v/", "checkpoint": ran("failed", now - 9, exit_code=3)}
    )
    append_jsonl(tmp_path / PREEMPTIONS_FILE, running.model_dump())
    append_jsonl(tmp_path / PREEMPTIONS_FILE, ended.model_dump())
    market = SimpleNamespace(log=logging.getLogger("test"), dir=tmp_path)
    books = Preemptions(market)
    lost = books.records["p-1"]
    assert lost.checkpoint["lost_at"] >= now
    due, why = compensation_decision(lost, TIMEOUT, lost.deadline)
    assert due and "the hub restarted 10 s after the warning" in why
    assert "lost_at" not in books.records["p-2"].checkpoint
    assert not compensation_decision(books.records["p-2"], TIMEOUT, lost.deadline)[0]
