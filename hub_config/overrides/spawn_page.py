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

2. Nothing starts on a GET. JupyterHub's ``GET /hub/spawn[/USER[/SERVER]]?opt-...`` starts the
server straight away with the query's options: any site could link a logged-in user's browser
into a paid 2-card server without a click. Here the query's options only fill in the form (200,
the choices preselected, nothing started, nothing held); starting is the form's POST, which
carries JupyterHub's XSRF token. For someone else's server the form is shown only to staff of a
course the owner takes (the staff rule, ``courses/staff.py``), and a link naming a course they
do not share is refused (403).

3. A form POST that the spot market queues (a spot bid waiting for its price or a card) is not a
spawn: the browser is sent back to the form (303, so a reload does not queue again), which shows
the request's place in the queue with a Cancel button. JupyterHub would report it as a failed
spawn.

4. A refusal is shown to the person in plain words (``human``, see
:mod:`gpulab.hub_config.overrides.errors`), above the form as they filled it in (the form is
rendered from the POST's choices, not the last server's); a max price that only needs
confirming comes with a checkbox in the form that confirms it on the next Start.

5. A server named ``job-*`` is a training job's (``hub_config/jobs/``): only the platform starts
one, through the REST API, so its form is neither shown nor posted here (403 naming
``server_name``; :func:`gpulab.hub_config.overrides.server_api.refuse_job_server`).
"""

from __future__ import annotations

import asyncio

from jupyterhub.handlers.pages import SpawnHandler
from jupyterhub.scopes import needs_scope
from jupyterhub.utils import maybe_future, url_path_join
from tornado import web

from gpulab.hub_config.courses.groups import CourseError
from gpulab.hub_config.courses.staff import check_staff_view
from gpulab.hub_config.overrides.errors import confirm_field, for_people
from gpulab.hub_config.overrides.queue import count_rate_limited, gate_start, idle_spawner
from gpulab.hub_config.overrides.server_api import refuse_job_server


def refuse_job_server_for_people(handler: SpawnHandler, server_name: str) -> None:
    """The job-server guard (5.), its refusal in plain words for the page."""
    try:
        refuse_job_server(handler, server_name)
    except web.HTTPError as e:
        error = for_people(e)
        error.reason = "Reserved for training jobs"  # the page's heading (JupyterHub's error page)
        raise error from None


# JupyterHub's own wait, for spawners that do not say.
DEFAULT_WAIT = 1.0


class SpawnPageHandler(SpawnHandler):
    """JupyterHub's SpawnHandler with a spawner-configurable wait, a direct redirect, and
    queued requests shown in the form."""

    async def _wrap_spawn_single_user(
        self, user, server_name, display_name, spawner, pending_url, options=None
    ):
        if self.request.method != "POST":
            # JupyterHub spawns from a GET when the spawner has no form: never here (2.).
            raise web.HTTPError(
                405, "a server is started with the spawn form's POST (Start), never by a link"
            )
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
                    count_rate_limited(error)  # JupyterHub's 429, for the metrics
                    # A refusal (bad option, no free card, balance) is the user's answer, not a
                    # hub fault: JupyterHub's own line says it (one line at INFO, hub_log.py).
                    log = self.log.debug if error.status_code < 500 else self.log.error
                    log("Not starting %s: %s", name, error)
                    # JupyterHub renders the form again with the error, through
                    # ``user.spawner.handler`` (its spawn cleared it; after an earlier failure
                    # ``user.spawner`` is the failed spawner this POST replaced): this handler,
                    # with what was posted (4.) and the field that confirms what only needs it.
                    self.gpulab_confirm = confirm_field(error)
                    spawner.handler = user.spawner.handler = self
                    raise for_people(error)
                self.log.error("Error starting server %s: %s", name, error)
                raise web.HTTPError(500, f"Unhandled error starting server {name}")
            if spawner.ready:
                default = url_path_join(user.server_url(server_name), "")
                return self.redirect(self.get_next_url(user, default=default))
        return self.redirect(pending_url)

    @needs_scope("servers")
    async def _get(self, user_name: str, server_name: str, display_name: str) -> None:
        refuse_job_server_for_people(self, server_name)
        # JupyterHub's _get spawns when the query has options (or when there is no form): here
        # the options are taken out of the query and kept for the form to show (render_form reads
        # them through ``spawner.handler``, which JupyterHub sets to this handler before it asks
        # for the form), and a spawn from a GET is refused below whatever path reaches it.
        query = {
            key: [b.decode("utf8", "replace") for b in values]
            for key, values in self.request.query_arguments.items()
            if key not in ("next", "display_name")
        }
        prefill = self._get_user_options(query) if query else {}
        owner = self.current_user if user_name == self.current_user.name else None
        owner = owner or self.find_user(user_name)
        self.gpulab_prefill: dict = {}
        if prefill:
            # Only ``next`` and ``display_name`` stay in the query JupyterHub reads. The form's
            # POST URL (the page's own) keeps the rest, unread: the POST reads the form's fields.
            self.request.query_arguments = {
                k: v
                for k, v in self.request.query_arguments.items()
                if k in ("next", "display_name")
            }
            if owner is not None:
                try:
                    self.gpulab_prefill = dict(
                        await maybe_future(owner.spawner.options_from_query(prefill))
                    )
                except Exception:
                    self.gpulab_prefill = {}  # a link's bad values: the form shows its defaults
        if owner is not None:
            try:
                check_staff_view(self, owner, self.gpulab_prefill.get("course"))
            except CourseError as e:
                raise web.HTTPError(e.status, str(e)) from None
        try:
            return await super()._get(user_name, server_name, display_name)
        finally:
            self.gpulab_prefill = {}

    @needs_scope("servers")
    async def _post(self, user_name: str, server_name: str, display_name: str) -> None:
        refuse_job_server_for_people(self, server_name)
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
            # A refused POST shows the form as the person filled it in (4.).
            self.gpulab_posted = dict(options or {})
            entry = await gate_start(self, user, spawner, options or {})
            if options is not None and entry is not None:
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
