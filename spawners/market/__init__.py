"""The spot market: prices from utilization, bids, the wait queue and preemption with a warning.

- :mod:`.core`: the pure order book and price rule (no I/O, no clock).
- :mod:`.store`: the market's small durable JSON files.
- :mod:`.preemption`: warning a reclaimed server (signals, webhook, checkpoint).
- :mod:`.hub`: :class:`SpotMarket`, the market's loop inside the hub process.
"""
