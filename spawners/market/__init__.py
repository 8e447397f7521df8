"""The spot market: prices from utilization, bids, the wait queue and preemption with a warning.

- :mod:`.core`: the pure order book and price rule (no I/O, no clock).
- :mod:`.admission`: the answers to a spawn that does not start now (queued, refused).
- :mod:`.hub`: :class:`SpotMarket`, the market's loop inside the hub process (prices, tick,
  admission, the queue).
- :mod:`.preemption`: the warning before a reclaim (signals, webhook, checkpoint), the deadline,
  and the records.
- :mod:`.settings`: per-user spot settings and webhook secrets.
- :mod:`.hub_client`: the REST client that starts and stops servers through the hub's API.
- :mod:`.views`: the market as JSON (prices, queue, status, preemptions).
- :mod:`.store`: the market's small durable JSON files.
"""
