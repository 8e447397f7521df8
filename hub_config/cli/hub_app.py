"""The JupyterHub application ``gpulab up`` runs: JupyterHub's own, changed in how it starts and
how it stops.

1. **How to log in comes last.** ``gpulab up`` used to print the admin's log-in line before
   JupyterHub started, so some sixty lines of JupyterHub's start-up log (and, under ``make run``
   on a fresh machine, thousands of install lines before them) buried it. :class:`GpulabHub`
   prints it once JupyterHub says it is running (``login_banner``).

2. **On shutdown the servers stop before the services.** JupyterHub's ``cleanup`` (Ctrl-C,
   SIGTERM) stops its managed services first, billing among them, and only then the users'
   servers: every server's stop then went to a billing service that was gone ("server_stop ...
   not delivered yet: billing unreachable"), so billing never recorded when those sessions
   ended. Here each running server is stopped first, its stop reported to billing through the
   spawner's ``post_stop_hook`` while billing still answers; JupyterHub's own cleanup then finds
   no server left and stops the services and the proxy as before. The job scheduler stops
   first: a training job stopped by the shutdown is requeued by the next hub, not failed.

A hand-written config run with plain ``jupyterhub -f`` gets JupyterHub's own order; with an
external billing service (docker-compose) the order does not matter.
"""

from __future__ import annotations

import asyncio
import sys

from jupyterhub.app import JupyterHub
from traitlets import List, Unicode


class GpulabHub(JupyterHub):
    """JupyterHub, printing how to log in once it runs and stopping servers before services."""

    login_banner = List(
        Unicode(),
        config=True,
        help="""Lines printed to standard output once the hub runs, after JupyterHub's start-up
        log: how to open it and log in (``gpulab up`` fills them in).""",
    )

    async def start(self) -> None:
        await super().start()
        if self.subapp or self.generate_config or not self.login_banner:
            return
        sys.stderr.flush()
        print("\n" + "\n".join(self.login_banner) + "\n", flush=True)

    async def cleanup(self) -> None:
        if self.cleanup_servers:
            # Training jobs: no more starts, and the running ones are requeued by the next hub
            # (the stop below is the platform's, not their command's failure).
            from gpulab.hub_config.jobs.scheduler import JobScheduler

            if JobScheduler.initialized():
                JobScheduler.instance().shutdown()
            await self.stop_servers()
        await super().cleanup()

    async def stop_servers(self) -> None:
        """Stop every active server and wait for each stop (its ``post_stop_hook`` included)."""
        stops = [
            user.stop(name)
            for user in list(self.users.values())
            for name, spawner in list(user.spawners.items())
            if spawner.active
        ]
        if not stops:
            return
        self.log.info("Stopping %i server(s) before the services they report to...", len(stops))
        for result in await asyncio.gather(*stops, return_exceptions=True):
            if isinstance(result, Exception):
                self.log.error("Failed to stop a server: %s", result)
