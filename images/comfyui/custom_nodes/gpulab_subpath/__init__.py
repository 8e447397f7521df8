"""gpulab: serve ComfyUI under its proxy prefix, whether or not the proxy strips it.

ComfyUI has no base-path option: its routes sit at /, and its page builds every URL relative to
its own location, so it works under any sub-path once requests reach it without the prefix.
jupyter-server-proxy with ``absolute_url`` (how gpulab's hub configures every app) passes the full
path (/user/NAME/comfyui/...). start-comfyui exports the prefix as GPULAB_COMFYUI_PREFIX; this
custom node (no nodes of its own) makes ComfyUI's aiohttp application drop it from a request
before routing, so /P/system_stats and /system_stats both work. aiohttp matches routes before any
middleware runs, so this wraps the application's request handler instead. The raw path is kept
encoded: a workflow saved as ``/api/userdata/workflows%2Fname.json`` still reaches its route.
"""

from __future__ import annotations

import os
import sys
from urllib.parse import unquote

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}


def _segments(path: str) -> list[str]:
    return [unquote(s) for s in path.split("/") if s]


def strip_prefix(raw_path: str, prefix: str) -> str | None:
    """``raw_path`` (path and query, still encoded) without ``prefix``; None if it lacks it."""
    want = _segments(prefix)
    path, sep, query = raw_path.partition("?")
    parts = path.split("/")  # "/p/q/rest" -> ["", "p", "q", "rest"]
    n = len(want)
    if not n or len(parts) < n + 1 or parts[0] or [unquote(p) for p in parts[1 : n + 1]] != want:
        return None
    return "/" + "/".join(parts[n + 1 :]) + sep + query


def serve_under_prefix(app, prefix: str) -> None:
    """Make the aiohttp ``app`` (not yet running) accept requests under ``prefix`` too."""
    if not _segments(prefix):
        return
    from yarl import URL

    handle = app._handle  # what AppRunner hands to the server when it starts

    async def _handle(request):
        stripped = strip_prefix(request.raw_path, prefix)
        if stripped is not None:
            request = request.clone(rel_url=URL(stripped, encoded=True))
        return await handle(request)

    app._handle = _handle


def _install() -> None:
    server = sys.modules.get("server")  # ComfyUI's server.py, imported by main.py
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    if instance is not None:
        serve_under_prefix(instance.app, os.environ.get("GPULAB_COMFYUI_PREFIX", ""))


_install()
