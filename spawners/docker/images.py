"""Which catalog images are present on this Docker node, and what their OCI labels say they preload.

"Preloaded" means present before anyone asks: the spawner never pulls at spawn time, the form offers
only present images, and ``gpulab images`` lists, builds or pulls the missing ones. The Docker calls
here are blocking; async callers run them in a thread.
"""

from __future__ import annotations

from gpulab.hub_config.catalog import Catalog
from gpulab.spawners.images import (
    LABEL_CUDA,
    LABEL_DATASETS,
    LABEL_LIBRARIES,
    LABEL_MODELS,
    ImageStatus,
    split_label,
)


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
        libraries=split_label(labels.get(LABEL_LIBRARIES)),
        models=split_label(labels.get(LABEL_MODELS)),
        datasets=split_label(labels.get(LABEL_DATASETS)),
        cuda=labels.get(LABEL_CUDA, ""),
        size_mb=int(info.get("Size", 0)) // 2**20 or None,
    )


def catalog_image_status(client, catalog: Catalog) -> dict[str, ImageStatus]:
    """Every catalog image, by slug, in catalog order."""
    return {
        slug: image_status(client, slug, image.docker_image)
        for slug, image in catalog.images.items()
    }
