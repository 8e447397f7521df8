"""A txt2img job as gradio-like queue messages, shared by the WebSocket and SSE endpoints:
``estimation``, one ``progress`` per denoising step, then ``process_completed``."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tornado.ioloop import IOLoop
from tornado.queues import Queue

from .engine import Cancelled, Engine, NotReady
from .params import Txt2ImgRequest
from .txt2img import run_txt2img

_DONE = object()


def failed(error: str, **extra: Any) -> dict[str, Any]:
    return {"msg": "process_completed", "success": False, "output": {"error": error, **extra}}


async def stream_txt2img(
    engine: Engine,
    data_dir: Path,
    req: Txt2ImgRequest,
    executor: Any,
    cancel: threading.Event,
) -> AsyncIterator[dict[str, Any]]:
    """The job's messages, in order. Setting ``cancel`` (the client left) skips the remaining
    steps; so does closing this generator early (``contextlib.aclosing``)."""
    loop = IOLoop.current()
    messages: Queue = Queue()

    def on_step(step: int, steps: int) -> None:  # in the worker thread
        loop.add_callback(messages.put_nowait, {"msg": "progress", "step": step, "steps": steps})

    ahead = engine.jobs()
    yield {"msg": "estimation", "rank": ahead, "queue_size": ahead + 1, "rank_eta": None}
    job = loop.run_in_executor(executor, run_txt2img, engine, data_dir, req, on_step, cancel.is_set)

    def done(fut: Any) -> None:
        # Through the loop's callback queue, as on_step's messages: the last step's progress
        # message is always queued before _DONE.
        messages.put_nowait(_DONE)
        if not fut.cancelled():
            fut.exception()  # retrieved here, so an abandoned job's error is not logged twice

    job.add_done_callback(done)
    try:
        while (item := await messages.get()) is not _DONE:
            yield item
        try:
            result = job.result()
        except NotReady as e:
            yield failed(e.detail, status=e.status)
            return
        except Cancelled:
            yield failed("cancelled")
            return
        except Exception as e:
            yield failed(f"{type(e).__name__}: {e}", status=500)
            return
        # The output is what POST /sdapi/v1/txt2img answers: images, parameters, info (JSON text).
        yield {"msg": "process_completed", "success": True, "output": result.as_a1111()}
    finally:
        if not job.done():
            cancel.set()
