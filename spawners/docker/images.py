"""Which catalog images are present on this Docker node, and what their OCI labels say they preload.

"Preloaded" means present before anyone asks: the spawner never pulls at spawn time, the form offers
only present images, and ``gpulab images`` lists, builds or pulls the missing ones. The Docker calls
here are blocking; async callers run them in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpulab.catalog import Catalog
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


# ---- many nodes (Docker Swarm) ------------------------------------------------------------------
# A Swarm manager's API lists nodes but cannot inspect, pull or load images on them: each node's
# own engine is asked, at the URL the operator gives for it (``gpulab images --node-engine``).
# Blocking calls, one short-lived client per node. (The Swarm spawner asks through its cluster's
# long-lived clients instead: SwarmCluster.engine.)

ENGINE_SCHEMES = ("unix", "tcp", "ssh")
TLS_FILES = ("ca.pem", "cert.pem", "key.pem")


@dataclass(frozen=True)
class NodeEngine:
    """Where one node's Docker Engine answers: ``unix://``, ``tcp://`` or ``ssh://``; with
    ``tls_dir`` (``ca.pem``, ``cert.pem``, ``key.pem``, as ``docker --tlsverify`` reads from
    ``DOCKER_CERT_PATH``) a ``tcp://`` engine is verified both ways."""

    url: str
    tls_dir: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with this engine's settings (empty: usable)."""
        scheme = self.url.partition("://")[0] if "://" in self.url else ""
        found = []
        if scheme not in ENGINE_SCHEMES:
            found.append(
                f"URL {self.url!r} must start with one of {', '.join(s + '://' for s in ENGINE_SCHEMES)}"
            )
        if self.tls_dir is not None:
            missing = [f for f in TLS_FILES if not (Path(self.tls_dir) / f).is_file()]
            if missing:
                found.append(f"TLS directory {self.tls_dir} lacks {', '.join(missing)}")
            if scheme != "tcp":
                found.append(f"TLS applies to tcp:// engines only, not {self.url!r}")
        return found


def engine_client(engine: NodeEngine | str, timeout: int = 60):
    """A ``docker.DockerClient`` for one node's engine (the caller closes it)."""
    import docker
    from docker.tls import TLSConfig

    if isinstance(engine, str):
        engine = NodeEngine(engine)
    tls = None
    if engine.tls_dir:
        d = Path(engine.tls_dir)
        tls = TLSConfig(
            client_cert=(str(d / "cert.pem"), str(d / "key.pem")),
            ca_cert=str(d / "ca.pem"),
            verify=True,
        )
    return docker.DockerClient(base_url=engine.url, tls=tls, version="auto", timeout=timeout)


def image_id(client, tag: str) -> str | None:
    """The id of ``tag`` on the engine of ``client`` (a ``docker.DockerClient``), or None."""
    import docker.errors

    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None
