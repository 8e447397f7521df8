"""Which catalog images are present on this Docker node, and what their OCI labels say they preload.

"Preloaded" means present before anyone asks: the spawner never pulls at spawn time, the form offers
only present images, and ``gpulab images`` lists, builds or pulls the missing ones. The Docker calls
here are blocking; async callers run them in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulab.hub_config.catalog import Catalog

# OCI-style labels every gpulab image carries (see images/*/Dockerfile). Values are comma-separated.
LABEL_LIBRARIES = "org.gpulab.preloads.libraries"
LABEL_MODELS = "org.gpulab.preloads.models"
LABEL_DATASETS = "org.gpulab.preloads.datasets"
LABEL_CUDA = "org.gpulab.cuda"


def _split(value: str | None) -> list[str]:
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


def image_status(client, slug: str, docker_image: str | None) -> ImageStatus:
    """Inspect one image (``client`` is a ``docker.APIClient``)."""
    import docker.errors

    if not docker_image:
        return ImageStatus(
            slug, None, False, f"images.{slug}.docker_image is not set in the catalog"
        )
    try:
        info = client.inspect_image(docker_image)
    except docker.errors.ImageNotFound:
        return ImageStatus(
            slug,
            docker_image,
            False,
            f"{docker_image} is not on this node; an admin runs `gpulab images --build` "
            "(or --pull) to preload it",
        )
    labels = (info.get("Config") or {}).get("Labels") or {}
    return ImageStatus(
        slug,
        docker_image,
        True,
        libraries=_split(labels.get(LABEL_LIBRARIES)),
        models=_split(labels.get(LABEL_MODELS)),
        datasets=_split(labels.get(LABEL_DATASETS)),
        cuda=labels.get(LABEL_CUDA, ""),
        size_mb=int(info.get("Size", 0)) // 2**20 or None,
    )


def catalog_image_status(client, catalog: Catalog) -> dict[str, ImageStatus]:
    """Every catalog image, by slug, in catalog order."""
    return {
        slug: image_status(client, slug, image.docker_image)
        for slug, image in catalog.images.items()
    }
