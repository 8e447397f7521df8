"""``gpulab images``: which catalog images are preloaded on this Docker node; build or pull the rest.

A spawn never waits on a pull: the Docker spawner only starts images present on the node, and the
form greys out the others. This command is how an operator preloads them::

    gpulab images                 # list: present / missing, and what each preloads (OCI labels)
    gpulab images --build         # build the missing ones from images/SLUG/Dockerfile
    gpulab images --build --all   # rebuild every image (what images/build.sh runs)
    gpulab images --pull          # pull the missing ones from their registry instead

On a Docker Swarm (docs/swarm.md), from the hub's node (a manager)::

    gpulab images --nodes --node-engine gpu-1=tcp://10.0.0.12:2376 ...   # what each node holds
    gpulab images --preload --node-engine ...     # stream each missing image to every node
    gpulab images --preload --registry HOST:PORT --node-engine ...   # or push once, pull on each
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from gpulab.catalog import Catalog, CatalogError, load_catalog, settings

IMAGES_DIR = Path(__file__).resolve().parents[2] / "images"
# Images built on top of another catalog image; the parent's tag is passed as BASE_IMAGE (each
# Dockerfile's `ARG BASE_IMAGE=` default names the same parent: tests/unit/test_images_files.py).
PARENTS = {"pytorch": "base", "sd-webui": "pytorch", "comfyui": "pytorch"}
# gpulab's Jupyter extensions are built into wheels here, then installed into the base image.
EXTENSIONS_DIR = IMAGES_DIR.parent / "extensions"
EXTENSION_WHEELS = IMAGES_DIR / "base" / "extensions"
EXTENSION_IMAGES = ("base", "teaching")


def add_images_parser(sub) -> None:
    p = sub.add_parser(
        "images",
        help="list the catalog's Docker images on this node; build or pull missing ones",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--catalog",
        default=settings.get("GPULAB_CATALOG"),
        help=f"{settings.setting('GPULAB_CATALOG').help} [env GPULAB_CATALOG]",
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument("--build", action="store_true", help="build missing images (images/SLUG)")
    how.add_argument("--pull", action="store_true", help="pull missing images from a registry")
    p.add_argument("--all", action="store_true", help="with --build/--pull: present ones too")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.add_argument("slugs", nargs="*", help="only these catalog images (default: all)")
    p.add_argument(
        "--docker-host",
        default=None,
        help="the hub node's engine (a Swarm manager for --nodes/--preload); default DOCKER_HOST",
    )
    swarm = p.add_argument_group("many nodes (Docker Swarm, docs/swarm.md)")
    swarm.add_argument(
        "--nodes", action="store_true", help="list which images each Swarm node holds"
    )
    swarm.add_argument(
        "--preload",
        action="store_true",
        help="copy missing images from the hub's node to every Swarm node (then list them)",
    )
    swarm.add_argument(
        "--registry",
        metavar="HOST:PORT",
        help="with --preload: push there and pull on each node, instead of streaming",
    )
    swarm.add_argument(
        "--node-engine",
        action="append",
        metavar="NODE=URL",
        help="a node's own Docker Engine (NODE: id or hostname; URL: unix://, tcp://, ssh://); "
        "repeat for each node",
    )
    swarm.add_argument(
        "--node-engines",
        metavar="FILE",
        help="JSON or TOML table NODE = URL (or {url, tls_dir}); these and --node-engine "
        "override the hub's own GPULAB_SWARM_NODE_ENGINES (JSON), read when set",
    )
    swarm.add_argument(
        "--node-tls",
        metavar="DIR",
        help="ca.pem, cert.pem, key.pem for tcp:// node engines (docker --tlsverify)",
    )


def _client(docker_host: str | None = None):
    # The Docker SDK only for `gpulab images`: a local-spawner node may not have an engine.
    import docker
    from docker.utils import kwargs_from_env

    kwargs = kwargs_from_env()
    if docker_host:
        kwargs["base_url"] = docker_host
    try:
        client = docker.APIClient(version="auto", **kwargs)
        client.ping()
    except docker.errors.DockerException as e:
        raise SystemExit(f"gpulab images: no Docker Engine reachable: {e}") from None
    return client


def _selected(catalog: Catalog, slugs: list[str]) -> list[str]:
    unknown = [s for s in slugs if s not in catalog.images]
    if unknown:
        raise SystemExit(
            f"gpulab images: unknown image {', '.join(unknown)}; allowed: {', '.join(catalog.images)}"
        )
    return slugs or list(catalog.images)


def _build_order(slugs: list[str]) -> list[str]:
    """Parents before children (a child is rebuilt on a freshly built parent)."""
    order: list[str] = []

    def visit(slug: str) -> None:
        parent = PARENTS.get(slug)
        if parent in slugs:
            visit(parent)
        if slug not in order:
            order.append(slug)

    for slug in slugs:
        visit(slug)
    return order


def build_extension_wheels() -> list[Path]:
    """Wheels of gpulab's Jupyter extensions (extensions/NAME with a pyproject.toml)."""
    EXTENSION_WHEELS.mkdir(parents=True, exist_ok=True)
    for old in EXTENSION_WHEELS.glob("*.whl"):
        old.unlink()
    sources = sorted(p.parent for p in EXTENSIONS_DIR.glob("*/pyproject.toml"))
    for src in sources:
        print(f"gpulab images: building extension wheel {src.name}")
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(EXTENSION_WHEELS), src],
            check=True,
        )
    return sorted(EXTENSION_WHEELS.glob("*.whl"))


def build_image(catalog: Catalog, slug: str) -> None:
    dockerfile = IMAGES_DIR / slug / "Dockerfile"
    tag = catalog.images[slug].docker_image
    if not dockerfile.exists():
        raise SystemExit(
            f"gpulab images: no {dockerfile.relative_to(IMAGES_DIR.parent)}; use --pull"
        )
    cmd = ["docker", "build", "-f", str(dockerfile), "-t", tag]
    parent = PARENTS.get(slug)
    if parent:
        cmd += ["--build-arg", f"BASE_IMAGE={catalog.images[parent].docker_image}"]
    if slug in EXTENSION_IMAGES:
        build_extension_wheels()
    # The build context is the checkout, so images can COPY gpulab's launcher and extensions.
    cmd.append(str(IMAGES_DIR.parent))
    print(f"gpulab images: building {slug} as {tag}")
    subprocess.run(cmd, check=True)


def cmd_images(args: argparse.Namespace) -> int:
    # Imported here with the Docker SDK it needs (see _client).
    from gpulab.spawners.docker.images import catalog_image_status

    try:
        catalog = load_catalog(args.catalog or None)
    except CatalogError as e:
        print(f"gpulab images: {e}", file=sys.stderr)
        return 2
    slugs = _selected(catalog, args.slugs)
    usage = _swarm_usage_error(args)
    if usage:
        print(f"gpulab images: {usage}", file=sys.stderr)
        return 2
    client = _client(args.docker_host)
    statuses = catalog_image_status(client, catalog)

    if args.build or args.pull:
        todo = [s for s in slugs if args.all or not statuses[s].present]
        try:
            if args.build:
                for slug in _build_order(todo):
                    build_image(catalog, slug)
            else:
                for slug in todo:
                    tag = catalog.images[slug].docker_image
                    print(f"gpulab images: pulling {slug} ({tag})")
                    subprocess.run(["docker", "pull", tag], check=True)
        except subprocess.CalledProcessError as e:
            print(f"gpulab images: {' '.join(map(str, e.cmd[:3]))} failed", file=sys.stderr)
            return 1
        if not todo:
            print("gpulab images: every selected image is present; nothing to do")
        statuses = catalog_image_status(client, catalog)

    if args.nodes or args.preload:
        return _cmd_nodes(args, catalog, slugs)

    rows = [statuses[s] for s in slugs]
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        for r in rows:
            state = "present" if r.present else "MISSING"
            print(f"{r.slug:<12} {state:<8} {r.docker_image or '-'}")
            if r.present:
                size = f"{r.size_mb} MB" if r.size_mb else "?"
                print(
                    f"{'':<12} preloads: {', '.join(r.preloads) or '-'}; CUDA: {r.cuda or '-'}; {size}"
                )
            else:
                print(f"{'':<12} {r.reason}")
    return 0 if all(r.present for r in rows) else 3


def _swarm_usage_error(args: argparse.Namespace) -> str:
    """Swarm options that make no sense together, named (nothing runs then)."""
    many = args.nodes or args.preload
    if args.registry and not args.preload:
        return "--registry is used by --preload only (add --preload)"
    for given, option in (
        (args.node_engine, "--node-engine"),
        (args.node_engines, "--node-engines"),
        (args.node_tls, "--node-tls"),
    ):
        if given and not many:
            return f"{option} is used by --nodes and --preload only (add one of them)"
    if args.preload and args.all:
        return "--all does not apply to --preload: an image is copied where the node lacks it or holds another build"
    return ""


def _cmd_nodes(args: argparse.Namespace, catalog: Catalog, slugs: list[str]) -> int:
    from gpulab.hub_config.cli.images_nodes import NodesUsageError, run_nodes

    tags = {s: catalog.images[s].docker_image for s in slugs if catalog.images[s].docker_image}
    for s in slugs:
        if s not in tags:
            print(f"gpulab images: {s}: images.{s}.docker_image is not set in the catalog; skipped")
    try:
        return run_nodes(args, tags)
    except NodesUsageError as e:
        print(f"gpulab images: {e}", file=sys.stderr)
        return 2
