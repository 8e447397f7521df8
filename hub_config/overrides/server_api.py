"""``POST /hub/api/users/USER/server[s/NAME]``: JupyterHub's ``UserServerAPIHandler``, except
that a request the spot market queues answers 202 with its queue entry and starts nothing
(JupyterHub would begin a spawn that then fails), and that its errors carry the plain sentence
(``human``) next to JupyterHub's ``message`` (:mod:`gpulab.hub_config.overrides.errors`).
Everything else is JupyterHub's own handling.
"""

from __future__ import annotations

import json

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.hub_config.overrides.errors import PlainErrors
from gpulab.hub_config.overrides.queue import count_rate_limited, gate_start, idle_spawner


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


ROUTES = [
    (r"/api/users/([^/]+)/server", ServerAPIHandler),
    (r"/api/users/([^/]+)/servers/([^/]*)", ServerAPIHandler),
]
