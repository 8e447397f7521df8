"""One txt2img job end to end: generate, encode as PNG with A1111's infotext, save, and answer
in A1111's shape (``images``, ``parameters``, ``info`` as a JSON string)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine import Engine, Generated
from .outputs import save_png
from .params import Txt2ImgRequest


@dataclass(frozen=True)
class Txt2ImgResult:
    png: bytes
    request: Txt2ImgRequest
    info: dict[str, Any]

    def image_b64(self) -> str:
        return base64.b64encode(self.png).decode("ascii")

    def as_a1111(self) -> dict[str, Any]:
        return {
            "images": [self.image_b64()],
            "parameters": self.request.as_dict(),
            "info": json.dumps(self.info),
        }


def infotext(req: Txt2ImgRequest, gen: Generated, model: str) -> str:
    """A1111's "parameters" text, which its PNG Info tab and other tools read back."""
    lines = [req.prompt]
    if req.negative_prompt:
        lines.append(f"Negative prompt: {req.negative_prompt}")
    lines.append(
        f"Steps: {req.steps}, Sampler: {gen.sampler}, CFG scale: {req.cfg_scale:g}, "
        f"Seed: {gen.seed}, Size: {req.width}x{req.height}, Model: {model}"
    )
    return "\n".join(lines)


def _png(image: Any, text: str) -> bytes:
    from PIL.PngImagePlugin import PngInfo

    meta = PngInfo()
    meta.add_text("parameters", text)
    buf = io.BytesIO()
    image.save(buf, format="PNG", pnginfo=meta)
    return buf.getvalue()


def run_txt2img(
    engine: Engine,
    data_dir: Path,
    req: Txt2ImgRequest,
    on_step: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Txt2ImgResult:
    """Blocking: call it from a worker thread. Raises NotReady or Cancelled from the engine."""
    gen = engine.generate(req, on_step=on_step, cancelled=cancelled)
    model = engine.model.name if engine.model else ""
    text = infotext(req, gen, model)
    png = _png(gen.image, text)
    saved = save_png(data_dir, png, gen.seed) if req.save_images else None
    info = {
        "prompt": req.prompt,
        "all_prompts": [req.prompt],
        "negative_prompt": req.negative_prompt,
        "all_negative_prompts": [req.negative_prompt],
        "seed": gen.seed,
        "all_seeds": [gen.seed],
        "steps": req.steps,
        "width": req.width,
        "height": req.height,
        "cfg_scale": req.cfg_scale,
        "sampler_name": gen.sampler,
        "sd_model_name": model,
        "device": engine.device,
        "duration_s": gen.duration,
        "infotexts": [text],
        "saved_to": str(saved) if saved else None,
    }
    return Txt2ImgResult(png=png, request=req, info=info)
