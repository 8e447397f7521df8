"""The hub's own Prometheus metrics and card telemetry (issue 24).

- :mod:`.sampler`: :class:`~.sampler.CardSampler` reads every card periodically, off the event
  loop, and keeps the readings, idle times and 24 hours of per-type utilisation;
- :mod:`.snapshot`: :func:`~.snapshot.snapshot`, one typed value of the pool, queue, holds and
  recent spawns, read by the collector and by the admin console;
- :mod:`.spawns`: the ring of the last 200 spawns;
- :mod:`.collector`: the ``gpulab_*`` and ``DCGM_FI_DEV_*`` families, computed at scrape time on
  JupyterHub's own ``/hub/metrics`` (docs/metrics.md lists them).
"""
