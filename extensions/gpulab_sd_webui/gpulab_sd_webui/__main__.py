"""``gpulab-sd-webui``: serve the web UI, or build the tiny test model (``--make-tiny-model``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from .engine import DTYPES, Engine, process_start_time

log = logging.getLogger("gpulab_sd_webui")

# Models come from the read-only model store only: never from the network.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # Set before transformers is imported: it warns on import about optional packages.
    "TRANSFORMERS_VERBOSITY": "error",
}


def hub_home_from_env() -> str:
    """The hub's home page as a user's server knows it ("" outside a hub): JupyterHub gives its
    servers the hub's base URL, and its public host when servers have origins of their own."""
    base = os.environ.get("JUPYTERHUB_BASE_URL", "")
    if not base:
        return ""
    return os.environ.get("JUPYTERHUB_HOST", "") + base.rstrip("/") + "/hub/home"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpulab-sd-webui",
        description="gpulab's Stable Diffusion web UI on diffusers, with AUTOMATIC1111's "
        "/sdapi/v1 API subset. Listens on 127.0.0.1 only.",
    )
    parser.add_argument("--port", type=int, help="port to listen on, on 127.0.0.1")
    parser.add_argument(
        "--unix-socket",
        type=Path,
        metavar="PATH",
        help="listen on this Unix socket instead of a port (what jupyter-server-proxy's "
        "unix_socket gives: a socket in a folder only the server's user can enter)",
    )
    parser.add_argument(
        "--subpath",
        default=os.environ.get("GRADIO_ROOT_PATH", ""),
        help="URL path every route lives under, e.g. /user/NAME/sd-webui "
        "(default: $GRADIO_ROOT_PATH, else none)",
    )
    parser.add_argument(
        "--models",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="folder whose subfolders are diffusers models (holding model_index.json); "
        "may be given more than once; the first model by name is loaded",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path.home() / "sd-webui",
        help="where outputs/ and userdata/ are written (default: ~/sd-webui)",
    )
    parser.add_argument(
        "--hub-url",
        default=hub_home_from_env(),
        help="the hub's home page, linked from the page "
        "(default: from $JUPYTERHUB_HOST and $JUPYTERHUB_BASE_URL, which a hub's server has)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="weights' precision (default float32; float16 halves GPU memory and time)",
    )
    parser.add_argument(
        "--make-tiny-model",
        type=Path,
        metavar="DIR",
        help="build a tiny random-weight Stable Diffusion pipeline into DIR and exit",
    )
    return parser


def _exit_now(signum: int, _frame: FrameType | None) -> None:
    # A generation or the model load may be running in a thread and cannot be interrupted;
    # exiting at once is safe because every file is written to a temp name and then renamed.
    log.info("got %s: exiting", signal.Signals(signum).name)
    logging.shutdown()
    os._exit(0)


async def serve(
    engine: Engine,
    port: int | None,
    subpath: str,
    data_dir: Path,
    unix_socket: Path | None = None,
    hub_home: str = "",
) -> None:
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_unix_socket

    from .web import Context, make_app, normalize_subpath

    ctx = Context(
        engine=engine, data_dir=data_dir, subpath=normalize_subpath(subpath), hub_home=hub_home
    )
    app = make_app(ctx)
    if unix_socket is not None:
        # A loopback port is open to every account on the node; a socket in the server's own
        # 0700 folder is not. The socket itself stays owner-only too.
        server = HTTPServer(app)
        server.add_socket(bind_unix_socket(str(unix_socket), mode=0o600))
        where = f"unix:{unix_socket}"
    else:
        # Loopback only: other tenants share the network; jupyter-server-proxy reaches us here.
        app.listen(port, address="127.0.0.1")
        where = f"http://127.0.0.1:{port}"
    engine.mark_http_up()
    log.info("listening on %s%s/", where, ctx.subpath)
    threading.Thread(target=engine.load, name="model-load", daemon=True).start()
    await asyncio.Event().wait()


def make_tiny(dest: Path) -> int:
    from .tiny_model import make_tiny_model

    try:
        written = make_tiny_model(dest)
    except FileExistsError as e:
        print(f"gpulab-sd-webui: {e}", file=sys.stderr)
        return 1
    total = 0
    for path, size in written:
        print(f"{size:>10}  {path}")
        total += size
    print(f"wrote a tiny Stable Diffusion pipeline (random weights), {total} bytes, to {dest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    started = process_start_time()
    os.environ.update(OFFLINE_ENV)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.make_tiny_model is not None:
        return make_tiny(args.make_tiny_model)
    if (args.port is None) == (args.unix_socket is None):
        parser.error("give one of --port or --unix-socket (unless --make-tiny-model)")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_now)
    engine = Engine(args.models, dtype=args.dtype, started=started)
    try:
        asyncio.run(
            serve(engine, args.port, args.subpath, args.data_dir, args.unix_socket, args.hub_url)
        )
    except OSError as e:  # e.g. the port is taken
        log.error("cannot serve on %s: %s", args.unix_socket or f"127.0.0.1:{args.port}", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
