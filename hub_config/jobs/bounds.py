"""What a job submit may not exceed beyond its spec's own fields (issue 26, F7).

- The queue: a user may have at most ``JobScheduler.max_queued_per_user`` jobs waiting to start
  (each is a permanent record in the append-only job store and weighed by every scheduler pass);
  one more is refused with 429 naming the limit, and nothing is created.
- A spot bid the market can never meet: the spot price of a GPU type never goes below its
  catalog's ``spot_floor_price`` (the market's curve starts there, and an operator's pin must lie
  between the floor and the on-demand price), so a ``max_price`` under the floor is a job that
  would wait forever; it is refused with 400 naming ``max_price`` and the floor.
"""

from __future__ import annotations

from typing import Any

from gpulab.spawners.jobs.spec import JobSpec, JobSpecError


class QueueFull(JobSpecError):
    """A submit over the user's queue limit (429: the same submit may pass later)."""

    status = 429


def check(spec: JobSpec, catalog: Any, queued: list[Any], scheduler: Any) -> None:
    """Refuse ``spec`` (``JobSpecError``) when its owner already has ``queued`` jobs up to the
    scheduler's ``max_queued_per_user``, or when it bids below its GPU type's spot floor."""
    limit = int(scheduler.max_queued_per_user)
    if limit > 0 and len(queued) >= limit:
        raise QueueFull(
            "queue",
            f"you have {len(queued)} jobs queued, the most one user may have waiting "
            f"(JobScheduler.max_queued_per_user = {limit}); cancel one or wait until one starts",
            f"at most {limit} queued jobs per user",
            f"You already have {len(queued)} jobs waiting to start, the most allowed "
            f"({limit}). Cancel one, or submit again once one has started.",
        )
    gt = catalog.gpu_types.get(spec.gpu)
    if spec.pricing != "spot" or spec.max_price is None or gt is None:
        return
    floor = gt.spot_floor_price
    if spec.max_price < floor:
        raise JobSpecError(
            "max_price",
            f"{spec.max_price} {catalog.currency}/card-hour is below the lowest spot price of "
            f"{spec.gpu} (its floor, {floor}): the job could never start; bid at least {floor}",
            f"at least the spot floor {floor} of {spec.gpu}",
            f"A max price of {spec.max_price} {catalog.currency} per card-hour is below the "
            f"lowest spot price {gt.display_name} ever has ({floor} {catalog.currency}): the "
            f"job would wait forever. Bid at least {floor}.",
        )
