"""Whether a launched app answers yet, asked by the hub on the server's internal address.

Users' servers live on origins of their own (:mod:`.origin`), so the hub's home page may not
fetch an app's readiness URL itself (another origin: its Content-Security-Policy allows the hub
alone, and the answer would be opaque). The launch status (``GET /hub/api/gpulab/users/NAME/
launch``) asks here instead: the hub requests the app's readiness URL and its ``gpulab/status``
on the server's internal address with the server's own token (its ``access:servers`` scope
covers exactly that server), never following redirects. What comes back only tells the owner's
own page when to open the app; nothing of money or access rests on it.
"""

from __future__ import annotations

import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

# Answers larger than this are not a status; the request gives up after PROBE_TIMEOUT seconds.
MAX_BODY = 64 * 1024
PROBE_TIMEOUT = 5.0


async def _get(url: str, token: str) -> tuple[int, bytes]:
    body = bytearray()

    def keep(chunk: bytes) -> None:  # at most MAX_BODY bytes of whatever the server sends
        body.extend(chunk[: max(0, MAX_BODY - len(body))])

    try:
        r = await AsyncHTTPClient().fetch(
            url,
            headers={"Authorization": f"token {token}"},
            follow_redirects=False,
            request_timeout=PROBE_TIMEOUT,
            raise_error=False,
            streaming_callback=keep,
        )
    except (HTTPClientError, OSError, ValueError):
        return 0, b""
    return r.code, bytes(body)


async def probe_app(spawner: Any, app: Any) -> dict[str, Any]:
    """``{"status": HTTP status of the readiness URL (0: no answer), "stage", "error"}``.

    ``stage``/``error`` come from the app's ``gpulab/status`` when it has one.
    """
    server = getattr(spawner, "server", None)
    token = getattr(spawner, "api_token", "") or ""
    if server is None or not token:
        return {"status": 0, "stage": "", "error": ""}
    host = server.host  # the server's internal address, e.g. http://127.0.0.1:PORT
    status, _ = await _get(host + app.ready_url_path(server.base_url), token)
    out: dict[str, Any] = {"status": status, "stage": "", "error": ""}
    if status and status != 502 and not app.is_server:
        code, body = await _get(host + app.url_path(server.base_url) + "gpulab/status", token)
        if code == 200:
            try:
                data = json.loads(body)
            except ValueError:
                data = {}
            if isinstance(data, dict):
                out["stage"] = str(data.get("stage") or "")[:100]
                out["error"] = str(data.get("error") or "")[:500]
    return out
