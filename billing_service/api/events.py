"""``POST events``: usage events. Reporters post their own server's (bounded, ``bounds``), the
hub and admins post anything (``BaseHandler.require_report``)."""

from __future__ import annotations

import time

from gpulab.billing_service.api.base import BaseHandler, FieldError, now_us
from gpulab.billing_service.metering import ingest
from gpulab.billing_service.schemas import BatchError, parse_batch


class EventsHandler(BaseHandler):
    async def post(self) -> None:
        self.require_login()
        try:
            events = parse_batch(self.json_body(), time.time())
        except BatchError as e:
            raise FieldError.of(e) from None
        admin = self.require_report(events)
        result = await self.billing.run_db(
            ingest,
            self.billing.engine,
            events,
            self.billing.prices,
            self.billing.trial_micro,
            now_us(),
            None if admin else self.billing.limits,
        )
        # Billing's metrics: what was taken, and how long from received to committed.
        self.billing.metrics.ingested(result.kinds)
        self.billing.metrics.ingest_latency.observe(self.request.request_time())
        if result.rejected and not result.accepted and not result.duplicates:
            # Nothing of the batch was taken: answer like any other refused input.
            first = result.rejected[0]
            body = {"status": 400, "message": f"{first.field}: {first.message}"}
            self.write_json({**body, "field": first.field, **result.to_json()}, 400)
            return
        self.write_json(result.to_json())
