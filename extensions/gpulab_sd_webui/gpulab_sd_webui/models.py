"""Which diffusers models the model store offers: subfolders holding a ``model_index.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# The one pipeline class this app drives; other diffusers pipelines (SDXL, Flux) are listed but
# only loaded when nothing else is there, so that their error says what went wrong.
SD_PIPELINE = "StableDiffusionPipeline"
# A file in a model's folder saying its weights are random (gpulab's tiny demo model): the page
# says so, since such a model draws noise whatever the prompt.
RANDOM_WEIGHTS_MARK = "random-weights.txt"
# The catalog's demo model, from before the mark was written.
DEMO_MODEL = "tiny-sd"


@dataclass(frozen=True)
class ModelRef:
    name: str  # the folder's name, e.g. "tiny-sd": what A1111 calls the checkpoint title
    path: Path
    pipeline_class: str | None  # model_index.json's _class_name
    random_weights: bool = False  # gpulab's demo model: it draws noise

    def as_sd_model(self) -> dict[str, str | None]:
        """The entry A1111's ``/sdapi/v1/sd-models`` lists for it."""
        return {
            "title": self.name,
            "model_name": self.name,
            "hash": None,
            "sha256": None,
            "filename": str(self.path),
            "config": None,
        }


def _pipeline_class(index: Path) -> str | None:
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError):
        return None
    name = data.get("_class_name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def find_models(dirs: list[Path]) -> list[ModelRef]:
    """Every diffusers model in ``dirs``' subfolders, sorted by name (first ``dirs`` wins a tie)."""
    found: dict[str, ModelRef] = {}
    for root in dirs:
        try:
            children = sorted(root.iterdir())
        except OSError:  # absent, or a mount this account may not list: no models from it
            continue
        for child in children:
            index = child / "model_index.json"
            try:
                if not index.is_file():
                    continue
            except OSError:
                continue
            random = child.name == DEMO_MODEL or (child / RANDOM_WEIGHTS_MARK).is_file()
            found.setdefault(
                child.name, ModelRef(child.name, child, _pipeline_class(index), random)
            )
    return [found[name] for name in sorted(found)]


def pick_model(models: list[ModelRef]) -> ModelRef | None:
    """The model to load: the first Stable Diffusion pipeline, else the first model at all."""
    for model in models:
        if model.pipeline_class in (SD_PIPELINE, None):
            return model
    return models[0] if models else None
