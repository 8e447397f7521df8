"""``POST /hub/api/users/USER/server[s/NAME]``: JupyterHub's ``UserServerAPIHandler``, except
that a request the spot market queues answers 202 with its queue entry and starts nothing
(JupyterHub would begin a spawn that then fails), and that its errors carry the plain sentence
(``human``) next to JupyterHub's ``message`` (:mod:`gpulab.hub_config.overrides.errors`).
A ``DELETE`` while the server is being switched (``hub_config/api/pool.py``) also tells the
switch to start nothing after its stop. Everything else is JupyterHub's own handling.
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.hub_config.overrides.errors import PlainErrors
from gpulab.hub_config.overrides.queue import (
    STOP_DURING_SWITCH,
    SWITCHING,
    count_rate_limited,
    gate_start,
    idle_spawner,
)
from gpulab.spawners.node.allocator import owner_key


class ServerAPIHandler(PlainErrors, UserServerAPIHandler):
    @needs_scope("start:servers")
    async def post(self, user_name: str, server_name: str = "") -> None:
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
        await super().delete(user_name, server_name)


ROUTES = [
    (r"/api/users/([^/]+)/server", ServerAPIHandler),
    (r"/api/users/([^/]+)/servers/([^/]*)", ServerAPIHandler),
]
