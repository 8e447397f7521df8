"""What the spawn form and ``gpulab images`` know of a catalog image on a node: whether it is
present (preloaded) and what its OCI labels say it preloads. Spawners fill these in their own way
(the local spawner: the base image is the hub's own environment; Docker: ``docker inspect``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# OCI-style labels every gpulab image carries (see images/*/Dockerfile). Values are comma-separated.
LABEL_LIBRARIES = "org.gpulab.preloads.libraries"
LABEL_MODELS = "org.gpulab.preloads.models"
LABEL_DATASETS = "org.gpulab.preloads.datasets"
LABEL_CUDA = "org.gpulab.cuda"


def split_label(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").replace(" ", ",").split(",") if v.strip()]


@dataclass
class ImageStatus:
    """One catalog image on this node."""

    slug: str
    docker_image: str | None
    present: bool
    reason: str = ""  # why it can't be used, for the form and the CLI
    libraries: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    cuda: str = ""
    size_mb: int | None = None

    @property
    def preloads(self) -> list[str]:
        return [*self.libraries, *self.models, *self.datasets]

    def to_json(self) -> dict:
        return {
            "slug": self.slug,
            "docker_image": self.docker_image,
            "present": self.present,
            "reason": self.reason,
            "preloads": {
                "libraries": self.libraries,
                "models": self.models,
                "datasets": self.datasets,
            },
            "cuda": self.cuda,
            "size_mb": self.size_mb,
        }
