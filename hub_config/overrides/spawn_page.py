"""The spawn page (``/hub/spawn[/USER[/SERVER]]``): JupyterHub's ``SpawnHandler`` with two changes.

1. Straight into JupyterLab when the server is ready in time.

JupyterHub's spawn page waits one second for the spawn, then always sends the browser to
``/hub/spawn-pending/…``, which renders a progress page (hub CSS, scripts, an event stream) or,
if the server is ready by then, redirects again. gpulab servers are usually ready in well under a
second, but a second is tight on a busy 2-core node, and then the user sits through a progress
page that flashes by. This handler (overriding the private
``SpawnHandler._wrap_spawn_single_user``, whose signature ``tests/unit/test_overrides.py`` pins)
waits up to the spawner's ``ready_redirect_wait`` and, when the
server is up, redirects to it (or to ``?next=``) directly; a slower spawn gets the progress page
as before, and errors are reported exactly as JupyterHub reports them.

2. A form POST that the spot market queues (a spot bid waiting for its price or a card) is not a
spawn: the browser is sent back to the form (303, so a reload does not queue again), which shows
the request's place in the queue with a Cancel button. JupyterHub would report it as a failed
spawn.
"""

from __future__ import annotations

import asyncio

from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.scopes import needs_scope
from jupyterhub.utils import maybe_future, url_path_join
from tornado import web

from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.staff import check_staff_start
from gpulab.hub_config.overrides.queue import idle_spawner, queue_instead_of_spawn

# JupyterHub's own wait, for spawners that do not say.
DEFAULT_WAIT = 1.0


class SpawnPageHandler(SpawnHandler):
    """JupyterHub's SpawnHandler with a spawner-configurable wait, a direct redirect, and
    queued requests shown in the form."""

    async def _wrap_spawn_single_user(
        self, user, server_name, display_name, spawner, pending_url, options=None
    ):
        wait = float(getattr(spawner, "ready_redirect_wait", DEFAULT_WAIT))
        name = f"{user.name}/{server_name}"
        if spawner._spawn_future is not None and spawner._spawn_future.done():
            # JupyterHub's own first step here: an explicit request replaces a finished (failed)
            # earlier attempt, which JupyterHub keeps to prevent implicit respawns.
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
                    log("Not starting %s: %s", name, error)
                    raise error
                self.log.error("Error starting server %s: %s", name, error)
                raise web.HTTPError(500, f"Unhandled error starting server {name}")
            if spawner.ready:
                default = url_path_join(user.server_url(server_name), "")
                return self.redirect(self.get_next_url(user, default=default))
        return self.redirect(pending_url)

    @needs_scope("servers")
    async def _post(self, user_name: str, server_name: str, display_name: str) -> None:
        user = self.current_user
        if user_name != user.name:
            user = self.find_user(user_name)
        spawner = idle_spawner(user, server_name)
        if spawner is not None:
            form_options = {
                key: [b.decode("utf8") for b in values]
                for key, values in self.request.body_arguments.items()
            }
            try:
                options = await maybe_future(spawner.run_options_from_form(form_options))
            except Exception:
                options = None  # JupyterHub's own handling reports it
            try:
                check_staff_start(self, user, options or {})
            except CourseError as e:
                raise web.HTTPError(e.status, str(e)) from None
            if options is not None and await queue_instead_of_spawn(spawner, options) is not None:
                # 303 to the form (which shows the queued request): answering the POST with the
                # page itself made a reload post the form again and queue a second request.
                self.redirect(self.request.path, status=303)
                return
        await super()._post(user_name, server_name, display_name)


ROUTES = [
    (r"/spawn", SpawnPageHandler),
    (r"/spawn/([^/]+)", SpawnPageHandler),
    (r"/spawn/([^/]+)/([^/]+)", SpawnPageHandler),
]
