"""The pipeline and its life: start-up stages and timings, the background load, and generation
under one lock (one GPU) with per-step progress.

torch and diffusers are imported here, lazily, in the loading thread: they take seconds to
import, and the HTTP server must answer (503 "loading") meanwhile.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .models import ModelRef, find_models, pick_model
from .params import MAX_SEED, Txt2ImgRequest

log = logging.getLogger("gpulab_sd_webui")

STARTING = "starting"
IMPORTING = "importing"
LOADING = "loading-model"
READY = "ready"
FAILED = "failed"

DTYPES = ("float32", "float16")


def process_start_time() -> float:
    """When this process started (Unix seconds), so that ``timings`` count the interpreter's own
    start-up too; now, where /proc does not tell."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = int(stat.rpartition(")")[2].split()[19])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(age, 0.0)


def _shown(path: Path) -> str:
    """``path`` as its user knows it: ``~/models`` rather than the home's full path."""
    home = os.environ.get("HOME", "").rstrip("/")
    text = str(path)
    return "~" + text[len(home) :] if home and text.startswith(home + "/") else text


class NotReady(Exception):
    """Why no image can be made now, as the HTTP status and message a client gets."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class Cancelled(Exception):
    """The client that asked for the image went away; the remaining steps were skipped."""


@dataclass(frozen=True)
class Generated:
    image: Any  # a PIL image
    seed: int
    sampler: str  # the scheduler class that sampled
    duration: float


def quiet_libraries() -> None:
    # Progress bars and "install accelerate" hints would fill the app's log on every load.
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


class Engine:
    """One model, loaded once in the background; ``generate`` is safe to call from any thread."""

    def __init__(
        self,
        model_dirs: list[Path],
        dtype: str = "float32",
        started: float | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: got {dtype!r}; allowed: {', '.join(DTYPES)}")
        self.model_dirs = model_dirs
        self.dtype = dtype
        self.models = find_models(model_dirs)
        self.model: ModelRef | None = pick_model(self.models)
        self.started = started if started is not None else time.time()
        self._lock = threading.Lock()  # guards the fields below, read by the event loop
        self.stage = STARTING
        self.device: str | None = None
        self.error: str | None = None
        self._timings: dict[str, float | None] = {
            "http_up": None,
            "imports_done": None,
            "model_loaded": None,
        }
        self._pipe: Any = None
        self._generate_lock = threading.Lock()
        self._jobs = 0  # waiting or running
        self._step = 0
        self._steps = 0
        self._job_started: float | None = None

    # ---- state --------------------------------------------------------------------------------

    def _since_start(self) -> float:
        return round(time.time() - self.started, 3)

    def _mark(self, timing: str | None = None, **fields: Any) -> None:
        with self._lock:
            if timing:
                self._timings[timing] = self._since_start()
            for name, value in fields.items():
                setattr(self, name, value)

    def mark_http_up(self) -> None:
        self._mark("http_up")

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "stage": self.stage,
                "model": self.model.name if self.model else None,
                "random_weights": bool(self.model and self.model.random_weights),
                "device": self.device,
                "dtype": self.dtype if self.model else None,
                "timings": {"started": self.started, **self._timings},
                "error": self.error,
            }

    def no_model_message(self) -> str:
        where = " or ".join(_shown(d) for d in self.model_dirs) or "a --models folder"
        example = _shown(self.model_dirs[0] / "tiny-sd") if self.model_dirs else "models/tiny-sd"
        return (
            f"no model in {where}: it needs a diffusers Stable Diffusion folder (one holding "
            f"model_index.json), e.g. {example}; on a gpulab hub the operator adds models to the "
            "store (`gpulab models --make-tiny-sd` makes the demo one), then launch again"
        )

    def check_ready(self) -> None:
        """Raise NotReady unless an image can be made now."""
        with self._lock:
            stage, error = self.stage, self.error
        if self.model is None:
            raise NotReady(409, self.no_model_message())
        if stage == FAILED:
            raise NotReady(500, f"model {self.model.name} failed to load: {error}")
        if stage != READY:
            raise NotReady(503, f"loading model {self.model.name}")

    # ---- loading ------------------------------------------------------------------------------

    def load(self) -> None:
        """Import torch and diffusers and load the model (run in a thread once HTTP is up)."""
        if self.model is None:
            # Without a model the app cannot do its job: it says so (stage failed, readiness 409)
            # instead of answering "ready", so that the hub ends the launch with this error.
            log.error("no model in %s", [str(d) for d in self.model_dirs])
            self._mark(stage=FAILED, error=self.no_model_message())
            return
        try:
            self._mark(stage=IMPORTING)
            import torch
            from diffusers import StableDiffusionPipeline

            quiet_libraries()
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self._mark("imports_done", stage=LOADING, device=device)
            log.info("loading model %s from %s on %s", self.model.name, self.model.path, device)
            pipe = StableDiffusionPipeline.from_pretrained(
                str(self.model.path),
                safety_checker=None,
                requires_safety_checker=False,
                local_files_only=True,
            )
            # Cast after loading: from_pretrained's dtype argument changed name across diffusers
            # versions (torch_dtype -> dtype), while to() has taken a dtype throughout.
            pipe = pipe.to(device=device, dtype=getattr(torch, self.dtype))
            pipe.set_progress_bar_config(disable=True)
            self._pipe = pipe
            self._mark("model_loaded", stage=READY)
            log.info("model %s ready (%s)", self.model.name, self.status()["timings"])
        except Exception as e:
            log.exception("loading model %s failed", self.model.name)
            self._mark(stage=FAILED, error=f"{type(e).__name__}: {e}")

    # ---- generating ---------------------------------------------------------------------------

    @contextmanager
    def _job(self) -> Iterator[None]:
        with self._lock:
            self._jobs += 1
        try:
            yield
        finally:
            with self._lock:
                self._jobs -= 1
                self._step = self._steps = 0
                self._job_started = None

    def jobs(self) -> int:
        with self._lock:
            return self._jobs

    def progress(self) -> dict[str, Any]:
        """What A1111's ``/sdapi/v1/progress`` answers: the running job's share of its steps."""
        with self._lock:
            step, steps, jobs, since = self._step, self._steps, self._jobs, self._job_started
        done = step / steps if steps else 0.0
        eta = 0.0
        if since is not None and done > 0:
            elapsed = time.monotonic() - since
            eta = round(elapsed / done - elapsed, 3)
        return {
            "progress": round(done, 4),
            "eta_relative": eta,
            "state": {
                "job_count": jobs,
                "job": "txt2img" if steps else "",
                "sampling_step": step,
                "sampling_steps": steps,
                "interrupted": False,
                "skipped": False,
            },
            "current_image": None,
            "textinfo": None,
        }

    def generate(
        self,
        req: Txt2ImgRequest,
        on_step: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Generated:
        """Make one image (blocking: call it from a worker thread). ``on_step(step, steps)`` runs
        after each denoising step; once ``cancelled()`` is true the remaining steps are skipped and
        Cancelled is raised."""
        self.check_ready()
        import torch

        with self._job(), self._generate_lock:
            if cancelled is not None and cancelled():
                raise Cancelled()
            seed = req.seed if req.seed != -1 else secrets.randbelow(MAX_SEED + 1)
            with self._lock:
                self._step, self._steps = 0, req.steps
                self._job_started = time.monotonic()

            def step_done(pipe: Any, i: int, _t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
                # num_timesteps: schedulers such as Heun take two model calls per asked step.
                steps = pipe.num_timesteps or req.steps
                with self._lock:
                    self._step, self._steps = i + 1, steps
                if on_step is not None:
                    on_step(i + 1, steps)
                if cancelled is not None and cancelled():
                    pipe._interrupt = True  # diffusers' documented way to stop the loop
                return kwargs

            start = time.monotonic()
            # A CPU generator makes a seed draw the same image on CPU and GPU, as A1111 does.
            generator = torch.Generator("cpu").manual_seed(seed)
            with torch.inference_mode():
                out = self._pipe(
                    prompt=req.prompt,
                    negative_prompt=req.negative_prompt or None,
                    num_inference_steps=req.steps,
                    width=req.width,
                    height=req.height,
                    guidance_scale=req.cfg_scale,
                    generator=generator,
                    callback_on_step_end=step_done,
                )
            if cancelled is not None and cancelled():
                raise Cancelled()
            return Generated(
                image=out.images[0],
                seed=seed,
                sampler=type(self._pipe.scheduler).__name__,
                duration=round(time.monotonic() - start, 3),
            )
