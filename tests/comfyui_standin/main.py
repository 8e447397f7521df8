"""A stand-in for ComfyUI's ``main.py``, for tests: ComfyUI itself cannot be installed here (no
network; the package index has no ComfyUI server), so this small aiohttp server behaves like
ComfyUI's where gpulab's bridge (``gpulab.spawners.inside.comfyui``) and the hub's proxy meet it:

- it listens only on TCP, as ComfyUI's ``server.py`` does (``--listen``/``--port``, through
  ``web.AppRunner`` and ``web.TCPSite``), and takes ComfyUI's folder arguments;
- its routes sit at ``/``: the page (``/``, scripts under ``/assets`` served as static files, as
  ComfyUI serves its frontend), ``/system_stats`` (the catalog's ready_path), ``/ws`` (a websocket
  that sends a JSON status and a binary preview frame, as ComfyUI does), ``/api/userdata/FILE``
  (one segment; ``%2F`` names a sub-folder, as ComfyUI's workflow saves use), and the progress
  favicon frames ``/assets/images/favicon_progress_16x16/frame_N.png``;
- its frontend script names the favicon frames root-relative (``'/assets/images/...'``), as
  ComfyUI's frontend does.

It writes ``standin-ran.json`` (its uid, pid and arguments) into the output directory.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import zlib
from pathlib import Path
from urllib.parse import unquote

from aiohttp import web

HERE = Path(__file__).resolve().parent


def png(r: int, g: int, b: int) -> bytes:
    """A 1x1 PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = zlib.compress(b"\x00" + bytes((r, g, b)))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def make_app(user_dir: Path) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/")
    async def index(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(HERE / "web" / "index.html")

    @routes.get("/system_stats")
    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"system": {"os": "posix", "comfyui_version": "stand-in"}})

    @routes.get("/ws")
    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        await sock.send_json({"type": "status", "data": {"sid": "standin"}})
        # A preview image: ComfyUI's binary frames start with a 4-byte event type.
        await sock.send_bytes(struct.pack(">I", 1) + png(255, 0, 0))
        async for msg in sock:
            if msg.type == web.WSMsgType.TEXT:
                await sock.send_str("echo:" + msg.data)
        return sock

    @routes.get(r"/assets/images/favicon_progress_16x16/{name}")
    async def favicon(request: web.Request) -> web.Response:
        return web.Response(body=png(0, 128, 255), content_type="image/png")

    @routes.get(r"/api/userdata/{file}")
    async def get_userdata(request: web.Request) -> web.Response:
        path = user_dir / unquote(request.match_info["file"])
        if not path.is_file():
            return web.json_response({"error": "not found"}, status=404)
        return web.Response(body=path.read_bytes(), content_type="application/json")

    @routes.post(r"/api/userdata/{file}")
    async def post_userdata(request: web.Request) -> web.Response:
        name = unquote(request.match_info["file"])
        path = user_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(await request.read())
        return web.json_response(name)

    app = web.Application()
    app.add_routes(routes)
    app.router.add_static("/assets", HERE / "web" / "assets")
    return app


async def serve(args: argparse.Namespace) -> None:
    import asyncio

    app = make_app(Path(args.user_directory or ".") / "default")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.listen, args.port)  # as ComfyUI's server.py listens
    await site.start()
    print(f"To see the GUI go to: http://{args.listen}:{args.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    import asyncio

    p = argparse.ArgumentParser()
    p.add_argument("--listen", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8188)
    for name in ("output", "input", "user", "temp"):
        p.add_argument(f"--{name}-directory")
    p.add_argument("--extra-model-paths-config", nargs="+")
    args = p.parse_args()
    if args.output_directory:
        Path(args.output_directory, "standin-ran.json").write_text(
            json.dumps({"uid": os.getuid(), "pid": os.getpid(), "argv": vars(args)})
        )
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
