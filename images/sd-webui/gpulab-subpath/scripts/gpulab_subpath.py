"""gpulab: serve AUTOMATIC1111's WebUI under its proxy prefix, whether or not the proxy strips it.

Installed as a built-in extension (/opt/sd-webui/extensions-builtin/gpulab-subpath; built-in
because --data-dir moves the user extensions folder into the user's home). ``--subpath P`` makes
gradio build its page's URLs under /P, but gradio 3.41 only reports that root path to the page:
its routes stay at /, so a request that still carries /P (jupyter-server-proxy with
``absolute_url``, as gpulab's hub configures every app) would get 404. This ASGI middleware,
outermost, strips /P from such requests (HTTP and websocket); requests without it pass as they are.
"""

from __future__ import annotations

from urllib.parse import unquote

try:  # inside the WebUI
    from modules import script_callbacks, shared
except ImportError:  # imported on its own (gpulab's tests)
    script_callbacks = shared = None


def _segments(path: str) -> list[str]:
    return [unquote(s) for s in path.split("/") if s]


class StripPrefix:
    """Pure ASGI middleware: ``/P/rest`` -> ``/rest`` (and ``/P`` -> ``/``), compared segment by
    segment after percent-decoding, so ``/user/a%40b/sd-webui`` matches ``/user/a@b/sd-webui``."""

    def __init__(self, app, prefix: str) -> None:
        self.app = app
        self.prefix = _segments(prefix)

    def strip(self, path: str, raw: bytes | None) -> tuple[str, bytes | None] | None:
        n = len(self.prefix)
        parts = path.split("/")  # "/p/q/rest" -> ["", "p", "q", "rest"]
        if (
            not n
            or len(parts) < n + 1
            or parts[0]
            or [unquote(p) for p in parts[1 : n + 1]] != (self.prefix)
        ):
            return None
        new_path = "/" + "/".join(parts[n + 1 :])
        new_raw = None
        if raw is not None:
            raw_parts = raw.split(b"/")
            new_raw = b"/" + b"/".join(raw_parts[n + 1 :]) if len(raw_parts) > n else b"/"
        return new_path, new_raw

    async def __call__(self, scope, receive, send):
        if scope.get("type") in ("http", "websocket"):
            stripped = self.strip(scope.get("path", ""), scope.get("raw_path"))
            if stripped is not None:
                scope = dict(scope)
                scope["path"], raw = stripped
                if raw is not None:
                    scope["raw_path"] = raw
        await self.app(scope, receive, send)


def install(app, subpath: str) -> None:
    """Put StripPrefix outermost in a Starlette/FastAPI ``app`` already serving."""
    if not _segments(subpath):
        return
    # What A1111's own setup_middleware does after launch: drop the built stack, add, rebuild.
    app.middleware_stack = None
    app.add_middleware(StripPrefix, prefix="/" + subpath.strip("/"))
    app.middleware_stack = app.build_middleware_stack()


def _on_app_started(_demo, app) -> None:
    install(app, getattr(shared.cmd_opts, "subpath", None) or "")


if script_callbacks is not None:
    script_callbacks.on_app_started(_on_app_started)
