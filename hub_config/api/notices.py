"""``GET /hub/api/gpulab/users/NAME/notices[?since=T]``: what the platform did to NAME's servers
by itself (an idle GPU moved to no-GPU mode, an idle server stopped), newest last.

Scope ``read:servers`` on that user: the server's own token may read it (JupyterLab shows it).
"""

from __future__ import annotations

import json

from jupyterhub.scopes import needs_scope
from tornado import web

from gpulab.hub_config.api.base import GpulabAPIHandler
from gpulab.hub_config.billing.notices import notices_for


class NoticesHandler(GpulabAPIHandler):
    @needs_scope("read:servers")
    def get(self, user_name: str) -> None:
        try:
            since = float(self.get_argument("since", "0"))
        except ValueError:
            raise web.HTTPError(400, "since: must be a Unix time in seconds") from None
        notices = notices_for(self.pool.data_dir).for_user(user_name, since)
        self.write(json.dumps({"notices": notices}))


ROUTES = [(r"/api/gpulab/users/([^/]+)/notices", NoticesHandler)]
