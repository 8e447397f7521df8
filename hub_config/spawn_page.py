"""The spawn page's redirect: straight into JupyterLab when the server is ready in time.

JupyterHub's spawn page waits one second for the spawn, then always sends the browser to
``/hub/spawn-pending/…``, which renders a progress page (hub CSS, scripts, an event stream) or,
if the server is ready by then, redirects again. gpulab servers are usually ready in well under a
second, but a second is tight on a busy 2-core node, and then the user sits through a progress
page that flashes by. This handler waits up to the spawner's ``ready_redirect_wait`` and, when the
server is up, redirects to it (or to ``?next=``) directly; a slower spawn gets the progress page
as before, and errors are reported exactly as JupyterHub reports them.
"""

from __future__ import annotations

import asyncio

from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.utils import url_path_join
from tornado import web

# JupyterHub's own wait, for spawners that do not say.
DEFAULT_WAIT = 1.0


class FastSpawnHandler(SpawnHandler):
    """JupyterHub's SpawnHandler with a spawner-configurable wait and a direct redirect."""

    async def _wrap_spawn_single_user(
        self, user, server_name, display_name, spawner, pending_url, options=None
    ):
        wait = float(getattr(spawner, "ready_redirect_wait", DEFAULT_WAIT))
        if spawner._spawn_future is not None and spawner._spawn_future.done():
            # An explicit request replaces a finished (failed) earlier attempt.
            spawner._spawn_future = None
        spawn = asyncio.ensure_future(
            self.spawn_single_user(user, server_name, display_name, options=options)
        )
        await asyncio.wait([spawn], timeout=wait)
        if spawn.done():
            error = spawn.exception()
            if error is not None:
                if isinstance(error, web.HTTPError):
                    # A refusal (bad option, no free card, balance) is the user's answer, not a
                    # hub fault: no error line for it here.
                    log = self.log.warning if error.status_code < 500 else self.log.error
                    log("Not starting %s: %s", spawner._log_name, error)
                    raise error
                self.log.error("Error starting server %s: %s", spawner._log_name, error)
                raise web.HTTPError(500, f"Unhandled error starting server {spawner._log_name}")
            if spawner.ready:
                default = url_path_join(user.server_url(server_name), "")
                return self.redirect(self.get_next_url(user, default=default))
        return self.redirect(pending_url)


def spawn_page_handlers(handler: type = FastSpawnHandler) -> list[tuple[str, type]]:
    """Routes that take precedence over JupyterHub's own spawn page (same URLs); ``handler``
    may extend FastSpawnHandler (the spot market's queue-aware form)."""
    return [
        (r"/spawn", handler),
        (r"/spawn/([^/]+)", handler),
        (r"/spawn/([^/]+)/([^/]+)", handler),
    ]
