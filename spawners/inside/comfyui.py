"""Run an operator's ComfyUI checkout behind gpulab: on a Unix socket, under its proxy prefix.

ComfyUI listens only on TCP (``--listen``/``--port``). On a node shared by one Unix account per
user, a loopback port is open to every account: any of them could queue work on this user's GPU
and read their images without logging in to the hub, or bind the port first and receive the
user's own traffic. So the local spawner does not run ComfyUI's server on a port: this bridge runs
ComfyUI's ``main.py`` in its own process and, before ComfyUI starts, makes aiohttp's ``TCPSite``
(the one way ComfyUI's ``server.py`` listens) serve the application on the Unix socket that
jupyter-server-proxy gives (``{unix_socket}``: in a 0700 folder of the server's account; the socket
itself is made 0600). Nothing listens on TCP.

Two more things a checkout lacks behind the hub:

- the prefix: ComfyUI's routes sit at ``/``; jupyter-server-proxy passes the whole path
  (``/user/NAME/comfyui/...``, ``absolute_url``), which the bridge strips before routing (the raw
  path stays encoded: ``/api/userdata/workflows%2Fname.json`` still reaches its route), as the
  comfyui image's custom node ``gpulab_subpath`` does;
- the frontend's progress favicon: its script asks for
  ``/assets/images/favicon_progress_16x16/frame_N.png`` at the site root, which is the hub's, not
  ComfyUI's (a 404 per frame); script and page answers have that path made relative to the page
  (``./assets/...``), which the proxy routes to ComfyUI.

Everything the user makes lives in their home, as with the image's ``start-comfyui``:
``~/comfyui/{output,input,user}``, temporary files in ``~/.cache/comfyui``, and the model store
(read-only ``~/models``) is handed to ComfyUI's diffusers loader through an
``extra_model_paths.yaml`` written at every start.

Run inside the user's server by jupyter-server-proxy (catalog ``[apps.comfyui] local_command``),
with the hub's Python: stdlib only at import (aiohttp, ComfyUI's own dependency, is imported once
ComfyUI is about to start).
"""

from __future__ import annotations

import argparse
import asyncio
import mimetypes
import os
import re
import runpy
import sys
from pathlib import Path
from typing import Any

FAVICON_RE = re.compile(rb"""(["'`])/assets/images/favicon_progress_16x16/""")
FAVICON_RELATIVE = rb"\1./assets/images/favicon_progress_16x16/"
# Answers whose text may name the favicon path (the frontend's scripts and its page).
REWRITTEN_SUFFIXES = (".js", ".mjs", ".html", "/")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m gpulab.spawners.inside.comfyui",
        description="Run a ComfyUI checkout on a Unix socket, under a proxy prefix.",
    )
    p.add_argument("--checkout", required=True, type=Path, help="the ComfyUI checkout (main.py)")
    p.add_argument("--unix-socket", required=True, type=Path, help="where to listen")
    p.add_argument("--prefix", default="", help="the proxied URL path, e.g. /user/NAME/comfyui")
    p.add_argument("--models", default="", help="the read-only model store (~/models)")
    p.add_argument("--home", default=os.environ.get("HOME", ""), help="the user's home")
    p.add_argument("extra", nargs="*", help="further arguments for ComfyUI's main.py")
    return p.parse_args(argv)


def strip_prefix(raw_path: str, prefix: str) -> str | None:
    """``raw_path`` (path and query, still encoded) without ``prefix``; None if it lacks it."""
    want = [s for s in prefix.split("/") if s]
    path, sep, query = raw_path.partition("?")
    parts = path.split("/")  # "/p/q/rest" -> ["", "p", "q", "rest"]
    n = len(want)
    if not n or len(parts) < n + 1 or parts[0] or parts[1 : n + 1] != want:
        return None
    return "/" + "/".join(parts[n + 1 :]) + sep + query


def relative_favicon(body: bytes) -> bytes:
    """The frontend's root-relative favicon frames, made relative to the page."""
    return FAVICON_RE.sub(FAVICON_RELATIVE, body)


def user_dirs(home: Path, models: str) -> list[str]:
    """Make the user's ComfyUI folders and model paths; ComfyUI's arguments for them."""
    data = home / "comfyui"
    for sub in ("output", "input", "user", "models/checkpoints", "models/loras", "models/vae"):
        (data / sub).mkdir(parents=True, exist_ok=True)
    cache = home / ".cache" / "comfyui"
    cache.mkdir(parents=True, exist_ok=True)
    conf = home / ".config" / "comfyui" / "extra_model_paths.yaml"
    conf.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Written by gpulab at every start of ComfyUI: edits here are lost.",
        "gpulab_user_models:",
        "  base_path: |-",
        f"    {data / 'models'}",
        "  is_default: true",
        "  checkpoints: checkpoints",
        "  loras: loras",
        "  vae: vae",
    ]
    if models:
        lines += ["gpulab_model_store:", "  diffusers: |-", f"    {models}"]
    tmp = conf.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(conf)
    return [
        "--output-directory",
        str(data / "output"),
        "--input-directory",
        str(data / "input"),
        "--user-directory",
        str(data / "user"),
        "--temp-directory",
        str(cache),
        "--extra-model-paths-config",
        str(conf),
    ]


def install(unix_socket: Path, prefix: str) -> None:
    """Make every aiohttp application of this process listen on ``unix_socket`` (never on TCP)
    and serve under ``prefix``, with the favicon's path made relative."""
    from aiohttp import web
    from yarl import URL

    bound: list[Any] = []

    class UnixOnlySite(web.UnixSite):
        """Stands in for ``web.TCPSite(runner, host, port, ...)``: the first one serves the
        socket; any other address ComfyUI asks for is not served (nothing on TCP)."""

        def __init__(self, runner: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(runner, str(unix_socket))
            self._serve = not bound
            bound.append(self)

        async def start(self) -> None:
            if not self._serve:
                return
            old = os.umask(0o177)  # the socket: its owner only
            try:
                await super().start()
            finally:
                os.umask(old)

    web.TCPSite = UnixOnlySite  # type: ignore[misc]

    original = web.Application._handle

    async def _handle(self: Any, request: Any) -> Any:
        stripped = strip_prefix(request.raw_path, prefix)
        if stripped is not None:
            request = request.clone(rel_url=URL(stripped, encoded=True))
        response = await original(self, request)
        if request.method == "GET" and request.path.endswith(REWRITTEN_SUFFIXES):
            response = await _relative_favicon_answer(response)
        return response

    web.Application._handle = _handle  # type: ignore[method-assign]


def _read_file(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:  # a folder, or gone
        return None


async def _relative_favicon_answer(response: Any) -> Any:
    from aiohttp import web

    body: bytes | None = None
    kind = response.content_type
    if isinstance(response, web.FileResponse):
        path = getattr(response, "_path", None)
        if path is not None:
            body = await asyncio.to_thread(_read_file, Path(path))
            # A file answer learns its type only when sent: the browser runs a module script
            # only when it is named JavaScript.
            kind = mimetypes.guess_type(str(path))[0] or "application/octet-stream"
    elif isinstance(response, web.Response) and isinstance(response.body, bytes):
        body = response.body
    if body is None or not FAVICON_RE.search(body):
        return response
    out = web.Response(body=relative_favicon(body), status=response.status, content_type=kind)
    if "Cache-Control" in response.headers:
        out.headers["Cache-Control"] = response.headers["Cache-Control"]
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    checkout = args.checkout.resolve()
    entry = checkout / "main.py"
    if not entry.is_file():
        sys.exit(f"gpulab comfyui: {entry} not found: --checkout must be a ComfyUI checkout")
    comfy_args = user_dirs(Path(args.home), args.models) if args.home else []
    install(args.unix_socket, args.prefix)
    # ComfyUI imports its modules from its own folder and reads files relative to it.
    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    # The port is never bound (the socket stands in for every TCPSite); ComfyUI still parses one.
    sys.argv = [str(entry), "--listen", "127.0.0.1", "--port", "8188", *comfy_args, *args.extra]
    runpy.run_path(str(entry), run_name="__main__")


if __name__ == "__main__":
    main()
