"""How a job's attempt is classified when it ends, and what comes next (issue 26: "preemption
that does not lose the run"): hub_config/jobs/resume.py decides from the spot market's own
preemption records (real :class:`Preemption` models) and the durable price history (a real
:class:`PriceHistory` file), never from what the job's server says.

The end to end run (a real hub, spot market and training script preempted twice) is
tests/e2e/test_job_preemption.py; these pin the decisions one by one.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from types import SimpleNamespace

import pytest

from gpulab.catalog.price_history import PriceHistory
from gpulab.hub_config.jobs import resume
from gpulab.spawners.jobs.model import (
    BALANCE,
    CANCELLED_END,
    EXITED,
    FAILED,
    LOST,
    NODE_FAILED,
    PREEMPTED,
    QUEUED,
    SUCCEEDED,
    Attempt,
    Job,
)
from gpulab.spawners.jobs.spec import JobSpec
from gpulab.spawners.market.preemption import Preemption

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


class Records:
    """The market's records, as :class:`Preemptions` answers ``of_owner``."""

    def __init__(self, records: list[Preemption]) -> None:
        self.records = records

    def of_owner(self, owner: str) -> list[Preemption]:
        return sorted((p for p in self.records if p.owner == owner), key=lambda p: p.warned_at)


def market(tmp_path, records=(), prices=()) -> SimpleNamespace:
    history = PriceHistory(tmp_path / "prices.jsonl")
    for t, price in prices:
        history.record("rtx-4090", t, Decimal(price))
    return SimpleNamespace(
        preemptions=Records(list(records)),
        checkpoint_timeout=240.0,
        warning_seconds=30.0,
        history=history,
        pool=SimpleNamespace(catalog=SimpleNamespace(currency="CNY")),
    )


def job(**spec) -> Job:
    fields = {
        "command": "python train.py",
        "gpu": "rtx-4090",
        "gpus": 1,
        "image": "default",
        "pricing": "spot",
        "max_price": Decimal("0.40"),
        "max_attempts": 3,
        **spec,
    }
    return Job(id=7, owner="alice", spec=JobSpec(**fields), submitted_at=T0, updated_at=T0)


def attempt(j: Job, start: float, end: float | None = None, exit_code=None) -> Attempt:
    a = Attempt(
        n=len(j.attempts) + 1,
        started_at=start,
        running_at=start + 2,
        ended_at=end,
        exit_code=exit_code,
        servers=["job-7"],
    )
    j.attempts.append(a)
    return a


def preemption(warned: float, stop_sent: float | None, **extra) -> Preemption:
    fields = {
        "id": f"p-{int(warned)}",
        "owner": "alice/job-7",
        "user": "alice",
        "server": "job-7",
        "gpu_type": "rtx-4090",
        "reason": "price-above-max",
        "status": "stopped" if stop_sent else "warning",
        "price": "0.60",
        "max_price": "0.40",
        "warned_at": warned,
        "deadline": warned + 60,
        "signalled_pids": [4242],
        "stop_sent_at": stop_sent,
        **extra,
    }
    return Preemption(**fields)


def info(**kw) -> dict:
    return {
        "exit_code": None,
        "stopped_by": None,
        "owner_keys": ["alice/job-7"],
        "start_error": "",
        "server_gone": False,
        **kw,
    }


def test_a_reclaimed_attempt_is_requeued_with_lost_work_and_the_markets_compensation(tmp_path):
    """Issue 26, preemption: the market's record of the job's server (warned, stop sent at the
    deadline) makes the end "preempted" even though the runner's exit code (143, SIGTERM) was
    seen and the stop came through the platform's own token; the job goes back to the queue
    saying why it waits, the work since the warning's checkpoint signal is the lost work, and
    the note carries the market's compensation decision."""
    j = job()
    a = attempt(j, T0, end=T0 + 400, exit_code=143)
    rec = preemption(T0 + 340, T0 + 400)
    m = market(tmp_path, [rec])
    a.end = resume.classify_end(j, a, info(exit_code=143, stopped_by="scheduler"), market=m)
    assert a.end == PREEMPTED
    resume.after_attempt(j, a, market=m)
    assert j.state == QUEUED and j.exit_code is None
    assert j.reason == "preempted at 08:06 UTC; waiting for a card within your bid"
    # The queue's next pass says what it waits for now, still led by why it waits again.
    plan = "spot price CNY 0.60/h is above your bid CNY 0.40/h"
    assert resume.waiting_reason(j, plan) == f"preempted at 08:06 UTC; {plan}"
    assert resume.requeue_event(j) == "job-requeued"
    # Signalled at the warning and given its 30 s: what ran after the signal is lost.
    assert a.lost_seconds == 60.0
    assert "price-above-max, spot CNY 0.60/h, your bid CNY 0.40/h" in a.note
    assert "checkpoint signal to 1 process(es)" in a.note
    # No checkpoint command: the signal was the checkpoint asked for, and it had its time.
    assert a.note.endswith("no compensation: the job had its 30 s after the checkpoint signal")


def test_the_compensation_decided_after_the_end_completes_the_note_later(tmp_path):
    """The market decides a checkpoint command's compensation once the cards are released,
    possibly after the scheduler saw the end: the note is completed when the next attempt runs."""
    j = job()
    a = attempt(j, T0, end=T0 + 400, exit_code=143)
    # The user's checkpoint command still ran: the market decides once the cards are back.
    rec = preemption(T0 + 340, T0 + 400, checkpoint={"command": "save", "state": "running"})
    m = market(tmp_path, [rec])
    a.end = resume.classify_end(j, a, info(exit_code=143), market=m)
    resume.after_attempt(j, a, market=m)
    assert a.note.endswith(resume.PENDING)
    assert "checkpoint command running" in a.note
    m.preemptions.records = [
        rec.model_copy(update={"compensation": {"due": True, "reason": "compensated: cut"}})
    ]
    nxt = attempt(j, T0 + 500)
    resume.on_running(j, nxt, market=m)
    assert a.note.endswith("compensated: cut")


def test_a_job_that_finished_during_the_warning_simply_exited(tmp_path):
    """The command ended by itself (exit 0) before the market sent the stop: succeeded, not
    preempted, no requeue."""
    j = job()
    a = attempt(j, T0, end=T0 + 350, exit_code=0)
    m = market(tmp_path, [preemption(T0 + 340, None)])
    a.end = resume.classify_end(j, a, info(exit_code=0), market=m)
    assert a.end == EXITED
    resume.after_attempt(j, a, market=m)
    assert (j.state, j.exit_code, a.lost_seconds) == (SUCCEEDED, 0, None)


def test_a_cancelled_warning_or_another_attempts_record_is_no_preemption(tmp_path):
    j = job()
    old = preemption(T0 - 900, T0 - 840)  # an earlier attempt's
    fell_back = preemption(T0 + 100, None, status="cancelled", cancelled_at=T0 + 110)
    a = attempt(j, T0, end=T0 + 400, exit_code=3)
    m = market(tmp_path, [old, fell_back])
    a.end = resume.classify_end(j, a, info(exit_code=3), market=m)
    assert a.end == EXITED
    resume.after_attempt(j, a, market=m)
    assert (j.state, j.exit_code, j.reason) == (FAILED, 3, "exited with code 3")


@pytest.mark.parametrize(
    ("kw", "cancel", "end"),
    [
        ({"stopped_by": "user", "exit_code": 143}, False, CANCELLED_END),
        ({"stopped_by": None, "exit_code": 143}, True, CANCELLED_END),
        ({"stopped_by": "billing", "exit_code": 143}, False, BALANCE),
        ({"server_gone": True}, False, NODE_FAILED),
        ({"lost": True, "server_gone": True}, False, LOST),
    ],
)
def test_who_stopped_it_decides_before_the_exit_code(tmp_path, kw, cancel, end):
    j = job()
    j.cancel_requested = cancel
    a = attempt(j, T0, end=T0 + 100)
    assert resume.classify_end(j, a, info(**kw), market=market(tmp_path)) == end


def test_balance_is_final_and_node_failure_requeues_until_max_attempts(tmp_path):
    m = market(tmp_path)
    j = job()
    a = attempt(j, T0, end=T0 + 100)
    a.end = BALANCE
    resume.after_attempt(j, a, market=m)
    assert (j.state, j.reason) == (FAILED, "balance ran out")

    j = job(max_attempts=2)
    for i in range(2):
        a = attempt(j, T0 + 1000 * i, end=T0 + 1000 * i + 100)
        a.end = NODE_FAILED
        resume.after_attempt(j, a, market=m)
        assert a.lost_seconds == 98.0  # no checkpoint: everything since it ran
    assert j.state == FAILED
    assert "gave up after 2 attempt(s)" in j.reason and "max_attempts 2" in j.reason
    assert [x.end for x in j.attempts] == [NODE_FAILED, NODE_FAILED]


def test_an_automatic_checkpoint_counts_only_once_given_its_time(tmp_path):
    """Lost work runs from the last checkpoint signal the job kept running
    ``checkpoint_seconds`` after; a signal too close to the end does not count."""
    m = market(tmp_path)
    j = job()
    a = attempt(j, T0, end=T0 + 1000)
    j.checkpoints = [T0 + 600, T0 + 990]  # the second had 10 s of its 30
    a.end = NODE_FAILED
    resume.after_attempt(j, a, market=m)
    assert a.lost_seconds == 400.0


def test_checkpoints_are_due_every_interval_of_running():
    j = job(checkpoint_interval=60)
    a = attempt(j, T0)
    assert not resume.checkpoint_due(j, T0 + 61)  # ran at T0 + 2
    assert resume.checkpoint_due(j, T0 + 62)

    class Spawner:
        async def gpulab_signal_processes(self):
            return [11, 12], [13]

    out = asyncio.run(resume.signal_checkpoint(j, [Spawner(), None], T0 + 62))
    assert out == {"signalled": [11, 12], "skipped": [13]}
    assert j.checkpoints == [T0 + 62] and j.last_checkpoint_at == T0 + 62
    assert not resume.checkpoint_due(j, T0 + 121)
    assert resume.checkpoint_due(j, T0 + 122)
    assert not resume.checkpoint_due(job(checkpoint_interval=0), T0 + 10**6)
    a.ended_at = T0 + 200
    assert not resume.checkpoint_due(j, T0 + 10**6)


def test_the_time_to_resume_starts_when_a_card_within_the_bid_is_free(tmp_path):
    """Resume time = running again - card free; for a spot job the card is "free within the
    bid" only once the spot price came back under it (the durable price history)."""
    m = market(tmp_path, prices=[(T0, "0.30"), (T0 + 300, "0.60"), (T0 + 900, "0.35")])
    j = job()
    first = attempt(j, T0, end=T0 + 400, exit_code=143)
    first.end = PREEMPTED
    second = attempt(j, T0 + 905)
    second.running_at = T0 + 920
    resume.on_running(j, second, market=m)
    assert second.card_free_at == T0 + 900
    assert second.resume_seconds() == 20.0
    summary = resume.attempt_summary(j)
    assert summary["preemptions"] == 1 and summary["last_resume_seconds"] == 20.0

    # On-demand (or a node failure): the card was free when the last attempt ended.
    j = job(pricing="on-demand", max_price=None)
    first = attempt(j, T0, end=T0 + 400)
    first.end = NODE_FAILED
    second = attempt(j, T0 + 401)
    resume.on_running(j, second, market=m)
    assert second.card_free_at == T0 + 400


def test_a_checkpoint_signal_cut_short_is_compensated_once_through_the_markets_hook(tmp_path):
    """Issue 26: "compensation applies when a checkpoint the platform asked for was not given
    time". A job with no checkpoint command was promised ``checkpoint_seconds`` (the warning
    period, 30 s here) after SIGUSR1; stopped 10 s after it, the credit is posted through the
    market's compensation hook with the key the market uses (billing credits it once). Given
    its time, or with no process handling the signal, nothing is posted."""
    posted = []

    async def hook(**kw):
        posted.append(kw)

    async def run(rec: Preemption) -> Attempt:
        m = market(tmp_path, [rec])
        m.compensation_hook = hook
        j = job()
        a = attempt(j, T0, end=T0 + 400, exit_code=143)
        a.end = resume.classify_end(j, a, info(exit_code=143), market=m)
        resume.after_attempt(j, a, market=m)
        await asyncio.sleep(0)
        return a

    cut = asyncio.run(run(preemption(T0 + 390, T0 + 400)))
    assert cut.end == PREEMPTED
    assert cut.note.endswith(
        "compensated: the job was stopped 10 s after its checkpoint signal; it was promised 30 s"
    )
    assert posted == [
        {
            "user": "alice",
            "server": "job-7",
            "at": T0 + 390 + 60,
            "reason": "spot-preemption",
            "checkpoint": "cut-short",
            "key": f"preemption-p-{int(T0 + 390)}",
        }
    ]
    posted.clear()
    given = asyncio.run(run(preemption(T0 + 340, T0 + 400)))
    assert given.note.endswith("no compensation: the job had its 30 s after the checkpoint signal")
    deaf = asyncio.run(run(preemption(T0 + 390, T0 + 400, signalled_pids=[])))
    assert deaf.note.endswith("no process of the job handles the checkpoint signal")
    assert posted == []
