"""The Tornado app: A1111's ``/sdapi/v1`` subset, gpulab's status, a gradio-like queue (WebSocket
and SSE), a ComfyUI-like user-data store and the page, all under one sub-path.

jupyter-server-proxy forwards the full path (absolute_url), so every route carries the sub-path.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError
from tornado.log import access_log
from tornado.web import Application, RequestHandler
from tornado.websocket import WebSocketClosedError, WebSocketHandler

from . import userdata
from .engine import Engine, NotReady
from .outputs import txt2img_dir
from .params import BadRequest, parse_query, parse_txt2img
from .streaming import failed, stream_txt2img
from .txt2img import run_txt2img


@dataclass
class Context:
    engine: Engine
    data_dir: Path
    subpath: str
    # The hub's home page (the page's way back), "" when unknown.
    hub_home: str = ""
    # A thread per queued job, each waiting on the engine's lock (cheap), so that /progress and
    # the queue's estimation count every job that waits, not only those a small pool took.
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=64, thread_name_prefix="txt2img")
    )


def normalize_subpath(subpath: str) -> str:
    """``/user/x/sd-webui/`` and ``user/x/sd-webui`` -> ``/user/x/sd-webui``; ``/`` -> ``""``."""
    subpath = subpath.strip().strip("/")
    return f"/{subpath}" if subpath else ""


class Base(RequestHandler):
    def initialize(self, ctx: Context) -> None:
        self.ctx = ctx

    def send_json(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Errors as JSON, as A1111's FastAPI answers them, rather than Tornado's HTML page.
        self.send_json({"detail": self._reason}, status_code)

    def json_body(self) -> Any:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError as e:
            raise BadRequest(
                "body", "a JSON object with txt2img fields", f"invalid JSON: {e}"
            ) from e

    def admit(self, parse: Any) -> Any:
        """The request that ``parse()`` reads, once the model can serve it; None after answering
        400 (bad input) or the engine's not-ready status."""
        try:
            req = parse()
            self.ctx.engine.check_ready()
        except BadRequest as e:
            self.send_json(e.as_json(), 400)
            return None
        except NotReady as e:
            self.send_json({"detail": e.detail}, e.status)
            return None
        return req


class Options(Base):
    """The readiness check: 200 only once a model is loaded (an image can be made), 503 while
    loading, 409 with no model, 500 when the load failed."""

    def get(self) -> None:
        engine = self.ctx.engine
        try:
            engine.check_ready()
        except NotReady as e:
            self.send_json({"detail": e.detail}, e.status)
            return
        self.send_json(
            {
                "sd_model_checkpoint": engine.model.name if engine.model else None,
                "samples_save": True,
                "samples_format": "png",
                "outdir_txt2img_samples": str(txt2img_dir(self.ctx.data_dir)),
            }
        )


class SdModels(Base):
    def get(self) -> None:
        self.send_json([m.as_sd_model() for m in self.ctx.engine.models])


class Progress(Base):
    def get(self) -> None:
        self.send_json(self.ctx.engine.progress())


class Status(Base):
    def get(self) -> None:
        self.send_json(self.ctx.engine.status())


class Txt2Img(Base):
    async def post(self) -> None:
        req = self.admit(lambda: parse_txt2img(self.json_body()))
        if req is None:
            return
        try:
            result = await IOLoop.current().run_in_executor(
                self.ctx.executor, run_txt2img, self.ctx.engine, self.ctx.data_dir, req
            )
        except NotReady as e:
            self.send_json({"detail": e.detail}, e.status)
            return
        self.send_json(result.as_a1111())


class QueueJoin(WebSocketHandler):
    """One job per connection: the client sends a txt2img request as JSON, the server streams
    the job's messages and closes."""

    def initialize(self, ctx: Context) -> None:
        self.ctx = ctx
        self.cancel = threading.Event()
        self.job: asyncio.Future | None = None

    async def send(self, msg: dict[str, Any]) -> bool:
        try:
            await self.write_message(json.dumps(msg))
            return True
        except WebSocketClosedError:
            return False

    def on_message(self, message: str | bytes) -> None:
        if self.job is not None:  # one job per connection; later messages mean nothing
            return
        # Run the job beside the connection, not in this handler: Tornado reads no further
        # frames (pongs included) until on_message returns, and would close a long job's
        # connection as "ping timed out".
        self.job = asyncio.ensure_future(self.run(message))

    async def run(self, message: str | bytes) -> None:
        try:
            req = parse_txt2img(json.loads(message))
            self.ctx.engine.check_ready()
        except ValueError as e:  # BadRequest, or not JSON
            extra = {"field": e.field} if isinstance(e, BadRequest) else {"field": "body"}
            await self.send(failed(str(e), status=400, **extra))
            self.close()
            return
        except NotReady as e:
            await self.send(failed(e.detail, status=e.status))
            self.close()
            return
        stream = stream_txt2img(
            self.ctx.engine, self.ctx.data_dir, req, self.ctx.executor, self.cancel
        )
        async with aclosing(stream):
            async for msg in stream:
                if not await self.send(msg):
                    return
        self.close()

    def on_close(self) -> None:
        self.cancel.set()


class QueueSSE(Base):
    """The same messages as Server-Sent Events, for ``GET queue/sse?prompt=...&steps=...``."""

    def initialize(self, ctx: Context) -> None:
        super().initialize(ctx)
        self.cancel = threading.Event()

    async def get(self) -> None:
        req = self.admit(lambda: parse_query(self.request.query_arguments))
        if req is None:
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")  # proxies pass each event on at once
        stream = stream_txt2img(
            self.ctx.engine, self.ctx.data_dir, req, self.ctx.executor, self.cancel
        )
        async with aclosing(stream):
            async for msg in stream:
                self.write(f"data: {json.dumps(msg)}\n\n")
                try:
                    await self.flush()
                except StreamClosedError:
                    return
        self.finish()

    def on_connection_close(self) -> None:
        self.cancel.set()


class UserData(Base):
    """``userdata/FILE``: FILE is one path segment; ``%2F`` in it names a sub-folder."""

    def root(self) -> Path:
        return self.ctx.data_dir / "userdata"

    def get(self, name: str) -> None:
        try:
            data = userdata.read(self.root(), name)
        except userdata.BadPath as e:
            self.send_json({"detail": str(e), "field": "file"}, 400)
            return
        if data is None:
            self.send_json({"detail": f"no such file: {name}"}, 404)
            return
        kind = "application/json" if name.endswith(".json") else "application/octet-stream"
        self.set_header("Content-Type", kind)
        # Served on the hub's origin: a stored page must never run as one.
        self.set_header("X-Content-Type-Options", "nosniff")
        self.finish(data)

    def post(self, name: str) -> None:
        overwrite = self.get_query_argument("overwrite", "true").lower() != "false"
        try:
            path = userdata.write(self.root(), name, self.request.body, overwrite=overwrite)
        except userdata.BadPath as e:
            self.send_json({"detail": str(e), "field": "file"}, 400)
            return
        if path is None:
            self.send_json({"detail": f"file exists: {name} (overwrite=false)"}, 409)
            return
        # As ComfyUI answers: the stored file's path inside the store.
        self.send_json(str(path.relative_to(self.root())))


class Page(Base):
    def get(self) -> None:
        model = self.ctx.engine.model
        text = files(__package__).joinpath("page.html").read_text()
        text = text.replace("{{MODEL}}", html.escape(model.name if model else "none"))
        text = text.replace("{{HUB_HOME}}", html.escape(self.ctx.hub_home or "/hub/home"))
        random = bool(model and model.random_weights)
        text = text.replace("{{RANDOM_HIDDEN}}", "" if random else " hidden")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(text)


class ToSlash(RequestHandler):
    def get(self) -> None:
        query = f"?{self.request.query}" if self.request.query else ""
        self.redirect(self.request.path + "/" + query)


class NotFound(Base):
    def prepare(self) -> None:
        self.send_json({"detail": f"not found: {self.request.path}"}, 404)


def log_request(handler: RequestHandler) -> None:
    """One line per request on stderr. A 503 is the readiness poll's "not yet", not an error."""
    status = handler.get_status()
    if status < 400 or status == 503:
        level = logging.INFO
    else:
        level = logging.WARNING if status < 500 else logging.ERROR
    request = handler.request
    access_log.log(
        level,
        "%d %s %s (%s) %.2fms",
        status,
        request.method,
        request.uri,
        request.remote_ip,
        1000.0 * request.request_time(),
    )


def make_app(ctx: Context) -> Application:
    """Routes match the raw (still %-encoded) path: ``userdata/a%2Fb.json`` is one segment, and
    a proxy that decodes ``%2F`` into ``/`` gets a 404, not another file."""
    p = re.escape(ctx.subpath)
    kw = {"ctx": ctx}
    routes: list[Any] = [
        (rf"{p}/", Page, kw),
        (rf"{p}/sdapi/v1/options", Options, kw),
        (rf"{p}/sdapi/v1/sd-models", SdModels, kw),
        (rf"{p}/sdapi/v1/txt2img", Txt2Img, kw),
        (rf"{p}/sdapi/v1/progress", Progress, kw),
        (rf"{p}/gpulab/status", Status, kw),
        (rf"{p}/queue/join", QueueJoin, kw),
        (rf"{p}/queue/sse", QueueSSE, kw),
        (rf"{p}/userdata/([^/]+)", UserData, kw),
    ]
    if ctx.subpath:
        routes.append((p, ToSlash))
    return Application(
        routes,
        default_handler_class=NotFound,
        default_handler_args=kw,
        websocket_ping_interval=20,
        log_function=log_request,
    )
