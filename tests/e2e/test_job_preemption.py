"""A spot training job that is preempted twice finishes by itself with the result of an
uninterrupted run (issue 26: "preemption that does not lose the run").

Real parts: a root hub with the local spawner and the spot market (a 4 s warning, fast ticks),
the job scheduler, the job runner in the job's server as the user's own account, and
tests/job_scripts/train.py (PyTorch, CPU), run from the checkout as the user. Prices are driven as an
operator would (``PUT /hub/api/gpulab/spot/prices/TYPE``): above the job's bid, the market warns
(SIGUSR1, which the runner forwards to the script, which checkpoints) and reclaims the card at
the deadline; back under the bid, the job starts again by itself with ``GPULAB_RESUME`` naming
its newest checkpoint. The reference loss is the same script run directly, uninterrupted.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time

import pytest
from harness import REPO, Hub, wait_for
from jobs_helpers import Jobs, run_reference

WARNING = 4
SCRIPT = REPO / "tests" / "job_scripts" / "train.py"
STEPS = 90
ARGS = f"--steps {STEPS} --ckpt-every 0 --sleep 0.2"
FINAL_RE = re.compile(r"^final loss (\S+)$", re.M)
STEP_RE = re.compile(r"^step (\d+) loss ", re.M)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")


@pytest.fixture(scope="module")
def hub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "jobspot",
        simulate="RTX-4090:1",
        extra_args=[
            f"--SpotMarket.warning_seconds={WARNING}",
            "--SpotMarket.tick_interval=0.5",
            "--JobScheduler.interval=0.5",
            "--JobScheduler.retry_seconds=1",
        ],
    )


@pytest.fixture(scope="module")
def reference_loss(tmp_path_factory) -> str:
    """The final loss of the same run, uninterrupted, run directly."""
    cwd = tmp_path_factory.mktemp("reference")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAB_", "WORLD_SIZE"))}
    env["GPULAB_CHECKPOINT_DIR"] = str(cwd / "checkpoints")
    out = run_reference(
        [sys.executable, str(SCRIPT), *ARGS.replace("--sleep 0.2", "").split()], cwd, env
    )
    return FINAL_RE.findall(out)[-1]


def pin(hub: Hub, price: str | None) -> None:
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": price})
    assert r.status_code == 200, r.text


def steps_after(text: str, offset: int) -> list[int]:
    return [int(n) for n in STEP_RE.findall(text[offset:])]


def job_servers(hub: Hub, user: str) -> list[str]:
    return [name for name in hub.user(user)["servers"] if name.startswith("job-")]


def preempt(hub: Hub, jobs: Jobs, job_id: int, n: int) -> dict:
    """Raise the price above the bid, wait for the reclaim and the requeue; the card is free and
    nothing of the job holds it while it waits."""
    pin(hub, "0.60")
    job = wait_for(
        lambda: (j := jobs.get(job_id))["state"] == "queued" and len(j["attempts"]) == n and j,
        timeout=WARNING + 40,
        interval=0.2,
        what=f"preemption {n} to requeue the job",
    )
    assert job["attempts"][-1]["end"] == "preempted", job
    assert job["reason"].startswith("preempted at "), job["reason"]
    assert hub.free("rtx-4090") == 1
    assert job_servers(hub, jobs.user) == []
    # It waits while the price is above its bid: nothing starts, nothing is held.
    time.sleep(1.5)
    job = jobs.get(job_id)
    assert job["state"] == "queued" and len(job["attempts"]) == n, job
    return job


def test_a_spot_job_preempted_twice_finishes_by_itself_with_the_uninterrupted_loss(
    hub: Hub, reference_loss: str
) -> None:
    """Issue 26, "Preemption that does not lose the run" and its test "a spot job preempted
    twice mid-run that finishes by itself with the same result": each reclaim is a warning
    (SIGUSR1: the script saves a checkpoint), a stop at the deadline, a requeue with the reason
    the user reads; each next attempt starts by itself once the price is back within the bid,
    with GPULAB_RESUME naming the newest checkpoint. 3 attempts, 2 preempted, lost work and
    the time to resume recorded, the final loss equal to an uninterrupted run's."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    home = hub.data_dir / "users" / user
    pin(hub, "0.30")
    try:
        job = jobs.submit(
            command=f"{sys.executable} {SCRIPT} {ARGS}",
            name="preempted twice",
            gpu="rtx-4090",
            gpus=1,
            pricing="spot",
            max_price="0.40",
            checkpoint_interval=0,
            max_attempts=3,
        )
        job_id = job["id"]

        offset = 0
        for n in (1, 2):
            # Running, and some steps past where this attempt began: then reclaim it.
            text = wait_for(
                lambda o=offset: len(steps_after(t := jobs.log(job_id), o)) >= 12 and t,
                timeout=90,
                interval=0.3,
                what=f"attempt {n} to train",
            )
            assert jobs.get(job_id)["state"] == "running"
            if n == 2:
                assert "resumed from " in text[offset:], text[offset:]
                # The API shows the checkpoint this attempt resumed from while it runs.
                named = re.findall(r"^resumed from (\S+) at step", text[offset:], re.M)[0]
                running = wait_for(
                    lambda: (a := jobs.get(job_id)["attempts"][-1])["resumed_from"] and a,
                    timeout=30,
                    interval=0.3,
                    what="attempt 2's resumed_from",
                )
                assert running["n"] == 2 and running["resumed_from"] == named, running
            before = max(steps_after(text, offset))
            preempt(hub, jobs, job_id, n)
            text = jobs.log(job_id)
            saved = re.findall(r"^checkpoint step (\d+) ", text[offset:], re.M)
            assert saved, f"no checkpoint on the warning's SIGUSR1: {jobs.get(job_id)}\n{text}"
            assert int(saved[-1]) >= before
            offset = len(text)
            pin(hub, "0.30")  # back within the bid: the job starts again by itself

        job = wait_for(
            lambda: (j := jobs.get(job_id))["state"] in ("succeeded", "failed") and j,
            timeout=120,
            interval=0.5,
            what="the job to finish",
        )
        text = jobs.log(job_id)
        assert job["state"] == "succeeded" and job["exit_code"] == 0, (job, text[-2000:])
        ends = [a["end"] for a in job["attempts"]]
        assert ends == ["preempted", "preempted", "exited"], job["attempts"]
        # Attempts 2 and 3 resumed from the checkpoint the previous one saved on its warning.
        resumed = re.findall(r"^resumed from (\S+) at step (\d+)$", text, re.M)
        assert len(resumed) == 2, text
        assert all(f"/.gpulab/jobs/{job_id}/checkpoints/step-" in p for p, _ in resumed), resumed
        assert int(resumed[1][1]) > int(resumed[0][1]) > 0
        # ... and the third attempt trained only the steps after it, not the run again.
        assert steps_after(text, offset)[0] == int(resumed[1][1]) + 1
        assert FINAL_RE.findall(text) == [reference_loss]

        first, second, third = job["attempts"]
        # Which checkpoint each attempt resumed from, as the runner named it ("": a fresh start).
        assert [a["resumed_from"] for a in job["attempts"]] == ["", *(p for p, _ in resumed)]
        for a in (first, second):
            assert a["lost_seconds"] is not None and 0 <= a["lost_seconds"] < 60, a
            assert "preempted at" in a["note"] and "price-above-max" in a["note"], a
            assert "compensation" in a["note"], a
        for a in (second, third):
            assert a["card_free_at"] is not None and a["resume_seconds"] is not None, a
            assert 0 <= a["resume_seconds"] < 60, a
        # Nothing left: no job server, the card free, no checkpoint half-written in the folder.
        assert job_servers(hub, user) == []
        assert hub.free("rtx-4090") == 1
        ckdir = home / ".gpulab" / "jobs" / str(job_id) / "checkpoints"
        assert sorted(p.name for p in ckdir.iterdir()) and all(
            p.name.startswith("step-") for p in ckdir.iterdir()
        )
    finally:
        pin(hub, None)
        for j in hub.api("GET", "/gpulab/admin/jobs").json().get("jobs", []):
            if j["owner"] == user and j["state"] not in ("succeeded", "failed", "cancelled"):
                jobs.cancel(j["id"])


def test_automatic_checkpoints_signal_the_running_job_every_interval(hub: Hub) -> None:
    """Issue 26, "Automatic checkpoints every checkpoint_interval via the signal the job
    handles": with no preemption at all, a job whose script saves only on SIGUSR1 has a
    checkpoint after its interval (60 s, the least allowed), and the job records the signal."""
    user = hub.create_user()
    jobs = Jobs(hub, user)
    home = hub.data_dir / "users" / user
    job = jobs.submit(
        command=f"{sys.executable} {SCRIPT} --steps 100000 --ckpt-every 0 --sleep 0.2",
        gpu="rtx-4090",
        gpus=1,
        checkpoint_interval=60,
    )
    job_id = job["id"]
    try:
        wait_for(lambda: jobs.get(job_id)["state"] == "running", 60, 0.3, "the job to run")
        ckdir = home / ".gpulab" / "jobs" / str(job_id) / "checkpoints"
        t0 = time.time()
        saved = wait_for(
            lambda: ckdir.is_dir() and sorted(ckdir.iterdir()),
            timeout=100,
            interval=0.5,
            what="a checkpoint saved on the automatic signal",
        )
        assert time.time() - t0 > 45, "saved long before the interval"
        assert saved[0].name.startswith("step-")
        job = jobs.get(job_id)
        assert job["state"] == "running"
        assert len(job["checkpoints"]) == 1 and job["last_checkpoint_at"], job
        assert re.search(r"^checkpoint step \d+ ", jobs.log(job_id), re.M)
    finally:
        jobs.cancel(job_id)
        wait_for(lambda: jobs.get(job_id)["state"] == "cancelled", 60, 0.3, "the cancel")
        wait_for(lambda: hub.free("rtx-4090") == 1, 30, 0.3, "the card to be free")
    shutil.rmtree(ckdir, ignore_errors=True)
