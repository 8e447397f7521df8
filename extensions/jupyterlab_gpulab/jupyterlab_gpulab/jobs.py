"""The Jobs panel's calls, under ``{base_url}gpulab/api/jobs``: this user's training jobs, asked of
the hub's jobs API (``/hub/api/gpulab/users/NAME/jobs``) with this server's own token.

- ``GET    jobs``             the user's jobs (``{"jobs": [...]}``, each with why it waits);
- ``POST   jobs``             submit one (a JSON object; the hub checks every field and answers
  400 naming it); a ``cwd`` is the file's folder as JupyterLab names it (relative to this
  server's root), turned here into the folder relative to the home that the hub expects;
- ``GET    jobs/ID``          one job; ``DELETE jobs/ID``: cancel it;
- ``GET    jobs/ID/log?offset=N`` its output from byte N, always as JSON
  ``{"text", "offset", "next_offset", "done"}`` (``done``: the job had ended when the hub read
  it, so nothing follows these bytes); a UTF-8 character cut by the read is left for the next.

The hub decides everything (whose job, what is allowed); nothing here widens what this server's
token may do, and no hub credential reaches the page.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from jupyterlab_gpulab.handlers import _Handler

# A job's states after which its output grows no more (the hub's spawners/jobs/model.py).
TERMINAL = ("succeeded", "failed", "cancelled")


def whole_utf8(data: bytes) -> int:
    """How many bytes of ``data`` are whole UTF-8 characters: a character cut at the end (at
    most 3 bytes of a longer sequence) is left out, to be read with the rest of it."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)  # ASCII: nothing cut
        if byte >= 0xC0:  # a lead byte: how long its character is
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


def home_relative(cwd: str, root_dir: str, home: str) -> str:
    """A folder JupyterLab names relative to this server's root, as the hub wants it: relative
    to the home. Unchanged when the root is the home (as gpulab starts servers) or the folder is
    not under the home (the hub then says what is allowed)."""
    if not cwd or not root_dir or not home:
        return cwd
    root, home = os.path.realpath(root_dir), os.path.realpath(home)
    if root == home:
        return cwd
    full = os.path.normpath(os.path.join(root, cwd))
    rel = os.path.relpath(full, home)
    return cwd if rel.startswith("..") else ("" if rel == "." else rel)


class _JobsHandler(_Handler):
    def jobs_path(self, rest: str = "") -> str:
        return f"gpulab/users/{quote(self.info.user, safe='')}/jobs{rest}"

    async def relay(self, method: str, rest: str = "", body: Any = None, listing=False) -> None:
        if not self.info.user:
            self.finish_json({"message": "this server was not started by JupyterHub"}, 409)
            return
        url = self.upstream.hub(self.jobs_path(rest))
        status, data, error = await self.upstream.call(url, method, body)
        if error or not status:
            message = self.hub_message(status, data, error, f"{method} jobs")
            self.finish_json({"message": message}, 502)
        elif isinstance(data, dict | list):
            if listing and isinstance(data, list):
                data = {"jobs": data}
            self.finish_json(data, status)
        else:
            message = self.hub_message(status, data, None, f"{method} jobs")
            self.finish_json({"message": message}, status if status >= 400 else 502)


class JobsHandler(_JobsHandler):
    @web.authenticated
    async def get(self) -> None:
        await self.relay("GET", listing=True)

    @web.authenticated
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            self.finish_json({"message": "job: the request body must be a JSON object"}, 400)
            return
        if not isinstance(body, dict):
            self.finish_json({"message": "job: the request body must be a JSON object"}, 400)
            return
        if isinstance(body.get("cwd"), str):
            root = self.settings.get("server_root_dir") or ""
            body["cwd"] = home_relative(body["cwd"], root, os.environ.get("HOME", ""))
        await self.relay("POST", "", body)


class JobHandler(_JobsHandler):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        await self.relay("GET", f"/{job_id}")

    @web.authenticated
    async def delete(self, job_id: str) -> None:
        await self.relay("DELETE", f"/{job_id}")


class JobLogHandler(_JobsHandler):
    @web.authenticated
    async def get(self, job_id: str) -> None:
        raw = self.get_argument("offset", "0")
        if not raw.isdigit():
            self.finish_json({"message": "offset: a whole number of bytes from 0"}, 400)
            return
        offset = int(raw)
        if not self.info.user:
            self.finish_json({"message": "this server was not started by JupyterHub"}, 409)
            return
        url = self.upstream.hub(self.jobs_path(f"/{job_id}/log?offset={offset}"))
        request = HTTPRequest(
            url,
            headers={"Authorization": f"token {self.upstream.token}"},
            request_timeout=self.gpulab_settings.hub_timeout,
            connect_timeout=self.gpulab_settings.hub_timeout,
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (HTTPClientError, OSError) as e:
            self.finish_json({"message": f"The hub did not answer (log): {e}"}, 502)
            return
        if response.code == 599:
            self.finish_json({"message": f"The hub did not answer (log): {response.error}"}, 502)
            return
        self.finish_json(*log_chunk(response.code, response.headers, response.body, offset))


def log_chunk(status: int, headers: Any, body: bytes | None, offset: int) -> tuple[dict, int]:
    """The hub's answer to a log read as the panel's JSON, and the status to answer with."""
    body = body or b""
    kind = headers.get("Content-Type", "") if headers is not None else ""
    if status != 200:
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        message = data.get("message") if isinstance(data, dict) else None
        return {"message": message or f"The hub answered HTTP {status} (log)"}, status
    if "application/json" in kind:
        try:
            data = json.loads(body)
        except ValueError:
            return {"message": "The hub's log answer was not JSON"}, 502
        text = data.get("data", data.get("text", "")) if isinstance(data, dict) else ""
        raw = text.encode() if isinstance(text, str) else b""
        nxt = data.get("next_offset") if isinstance(data, dict) else None
        done = data.get("done") if isinstance(data, dict) else None
        return {
            "text": raw.decode("utf-8", "replace"),
            "offset": offset,
            "next_offset": nxt if isinstance(nxt, int) else offset + len(raw),
            "done": done if isinstance(done, bool) else None,
        }, 200
    # The hub's bytes: where they end (X-Gpulab-Log-Offset) and the job's state when it read
    # them (X-Gpulab-Job-State; the output of a job that had ended then is all there is).
    keep = whole_utf8(body)
    header = headers.get("X-Gpulab-Log-Offset") if headers is not None else None
    state = headers.get("X-Gpulab-Job-State") if headers is not None else None
    nxt = offset + keep
    if header is not None and str(header).isdigit() and keep == len(body):
        nxt = int(header)
    return {
        "text": body[:keep].decode("utf-8", "replace"),
        "offset": offset,
        "next_offset": nxt,
        "done": None if state is None else state in TERMINAL,
    }, 200
