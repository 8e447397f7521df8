"""Helpers for the reservation tests: reserve through the service's own transaction, and tagged
server starts (the API served in-process is :mod:`billing.service`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from billing.courses import PRICES, TRIAL
from billing.scenario import server_start
from gpulab.billing_service import reservations
from gpulab.billing_service.app import BillingService
from gpulab.billing_service.rating import PriceBook


def reserve(engine, body: dict, actor: str = "hub", prices: PriceBook = PRICES) -> dict:
    """POST reservations as the service runs it (parse, then ``BillingService.reserve``)."""
    app = SimpleNamespace(engine=engine, prices=prices, trial_micro=TRIAL, catalog=prices.catalog)
    return BillingService.reserve(app, reservations.parse(body, prices), actor)


def tagged_start(
    user: str,
    t: float,
    reservation: str | None,
    gpu: str = "a100-80g",
    gpus: int = 1,
    server: str = "",
    course: str | None = None,
) -> dict:
    """The hub's server_start of a server whose cards came from ``reservation``."""
    ev = server_start(user, t, gpu, gpus, server)
    options: dict[str, Any] = {**ev["options"], "reservation": reservation}
    if course is not None:
        options["course"] = course
    ev["options"] = options
    return ev
