"""``POST /hub/api/users/USER/server[s/NAME]``: JupyterHub's ``UserServerAPIHandler``, except
that a request the spot market queues answers 202 with its queue entry and starts nothing
(JupyterHub would begin a spawn that then fails), and that its errors carry the plain sentence
(``human``) next to JupyterHub's ``message`` (:mod:`gpulab.hub_config.overrides.errors`).
A ``DELETE`` while the server is being switched (``hub_config/api/pool.py``) also tells the
switch to start nothing after its stop.

Training jobs' servers (``job-<id>``, ``job-<id>-<rank>``: :mod:`gpulab.hub_config.jobs`) are the
platform's to start: a start, creation or rename (POST, PUT, PATCH) of a server named ``job-*`` by
anyone but the ``gpulab-market`` service (the job scheduler's token) is 403 naming
``server_name``, whatever ``allow_named_servers`` says; the platform's own start is allowed even
where named servers are off (``allow_named_servers`` stays as configured for everything else),
and so is stopping one (the owner's DELETE cancels the job). Every DELETE of a job server tells
the scheduler who asked (the owner, billing, the market) so that the job ends as cancelled,
"balance ran out" or preempted. Everything else is JupyterHub's own handling.
"""

from __future__ import annotations

import json
from typing import Any

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.hub_config.jobs.scheduler import JobScheduler
from gpulab.hub_config.overrides.errors import PlainErrors, http_error
from gpulab.hub_config.overrides.queue import (
    STOP_DURING_SWITCH,
    SWITCHING,
    count_rate_limited,
    gate_start,
    idle_spawner,
)
from gpulab.hub_config.scopes import MARKET_SERVICE
from gpulab.spawners.jobs.launch import is_job_server
from gpulab.spawners.node.allocator import owner_key

BILLING_SERVICES = ("billing", "gpulab-billing")


def is_platform(handler: Any) -> bool:
    """Whether the caller is the platform's own service (the job scheduler, the market)."""
    user = handler.current_user
    return getattr(user, "kind", "") == "service" and getattr(user, "name", "") == MARKET_SERVICE


def refuse_job_server(handler: Any, server_name: str) -> None:
    """403 naming ``server_name`` unless the platform itself starts the job server."""
    if is_job_server(server_name) and not is_platform(handler):
        error = http_error(
            403,
            f"server_name: names starting with 'job-' are the platform's training-job servers "
            f"({server_name!r}); submit a job instead (POST /hub/api/gpulab/users/NAME/jobs)",
            field="server_name",
        )
        error.human = (  # type: ignore[attr-defined]
            f"“{server_name}” is the name of a training job's server, which only the platform "
            "starts. To run a job, submit it from the home page's Jobs card or with "
            "gpulab jobs submit."
        )
        raise error


def stopper(handler: Any) -> str:
    """Who asks for a stop, in the job scheduler's words."""
    user = handler.current_user
    if getattr(user, "kind", "") != "service":
        return "user"
    name = getattr(user, "name", "")
    if name == MARKET_SERVICE:
        return "market"
    return "billing" if name in BILLING_SERVICES else name


class ServerAPIHandler(PlainErrors, UserServerAPIHandler):
    @property
    def allow_named_servers(self) -> bool:
        # A job server is a named server even where named servers are off (see the docstring).
        args = getattr(self, "path_args", None) or []
        if len(args) > 1 and is_job_server(args[1]):
            return True
        return bool(self.settings.get("allow_named_servers", False))

    async def _check_named_server_request(
        self, user: Any, server_name: str, display_name: str, check_limit: bool = True
    ) -> None:
        # The named-server limit counts the user's own servers, never the platform's job servers.
        limit = check_limit and not is_job_server(server_name)
        await super()._check_named_server_request(user, server_name, display_name, limit)

    @needs_scope("start:servers")
    async def put(self, user_name: str, server_name: str = "") -> None:
        refuse_job_server(self, server_name)
        await super().put(user_name, server_name)

    @needs_scope("start:servers")
    async def patch(self, user_name: str, server_name: str = "") -> None:
        refuse_job_server(self, server_name)
        body = self.get_json_body()
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            refuse_job_server(self, body["name"])
        await super().patch(user_name, server_name)

    @needs_scope("start:servers")
    async def post(self, user_name: str, server_name: str = "") -> None:
        refuse_job_server(self, server_name)
        user = self.find_user(user_name)
        spawner = idle_spawner(user, server_name)
        if spawner is not None:
            body = self.get_server_json_body() or {}
            entry = await gate_start(self, user, spawner, body.get("user_options") or {})
            if entry is not None:
                self.set_status(202)
                answer = {"status": 202, "message": entry["message"], "queued": entry}
                if entry.get("human"):
                    answer["human"] = entry["human"]
                self.finish(json.dumps(answer))
                return
        try:
            await super().post(user_name, server_name)
        except web.HTTPError as e:
            count_rate_limited(e)
            raise

    @needs_scope("delete:servers")
    async def delete(self, user_name: str, server_name: str = "") -> None:
        user = self.find_user(user_name)
        if user is not None:
            owner = owner_key(user.name, server_name)
            if owner in SWITCHING:
                # JupyterHub answers 202 to a stop while the switch's own stop runs; the switch
                # would then start the new server all the same.
                STOP_DURING_SWITCH.add(owner)
            if is_job_server(server_name) and server_name in user.orm_spawners:
                JobScheduler.instance(config=self.settings["config"]).note_stop(
                    user.name, server_name, stopper(self)
                )
        await super().delete(user_name, server_name)


ROUTES = [
    (r"/api/users/([^/]+)/server", ServerAPIHandler),
    (r"/api/users/([^/]+)/servers/([^/]*)", ServerAPIHandler),
]
