"""What a job's owner is told when an attempt ends: a notice on the home page and, when they set
one, a signed webhook (``X-Gpulab-Event: job-succeeded | job-failed | job-cancelled |
job-requeued``), sent with the spot market's settings and sender so a user has one webhook for
everything the platform does to their work.
"""

from __future__ import annotations

import time
from typing import Any

from gpulab.spawners.jobs.model import Job
from gpulab.spawners.market.preemption import send_webhook


def tell(sched: Any, job: Job, event: str) -> None:
    """Tell ``job``'s owner that ``event`` happened: a home-page notice, and a signed POST to
    their webhook when they set one (the spot market's settings and sender)."""
    text = {
        "job-succeeded": f"Job {job.id} succeeded.",
        "job-failed": f"Job {job.id} failed: {job.reason}.",
        "job-cancelled": f"Job {job.id} was cancelled.",
        "job-requeued": f"Job {job.id} is queued again: {job.reason}.",
    }[event]
    if sched.notices is not None:
        try:
            sched.notices.add(job.owner, "job", text, at=time.time())
        except Exception:
            sched.log.exception("Could not note job %s's end", job.id)
    if sched.market is None:
        return
    settings = sched.market.settings.get(job.owner, create_secret=False)
    if not settings.get("webhook_url") or not settings.get("webhook_secret"):
        return
    n = job.attempt.n if job.attempt else 0
    sched.spawn_task(
        send_webhook(
            settings["webhook_url"],
            settings["webhook_secret"],
            event,
            f"job-{job.id}-{n}-{event}",
            {"job": job.to_api()},
            sched.market.webhook_networks,
        )
    )
