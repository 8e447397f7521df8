"""``gpulab models``: the catalog's model store on this node, and the tiny demo model.

    gpulab models                  # list: present / MISSING, size, license, where it is read from
    gpulab models --make-tiny-sd   # write the tiny random-weight Stable Diffusion pipeline
                                   # (catalog `tiny-sd`) into the data dir's model store

Models are mounted read-only at ``~/models/SLUG`` in every server. Real checkpoints are the
operator's to provide (their licenses differ); gpulab never downloads one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpulab.catalog import CatalogError, load_catalog, settings
from gpulab.spawners.apps import checkout_problem

TINY = "tiny-sd"
# The builder lives in gpulab's diffusers WebUI (extensions/gpulab_sd_webui), which already
# imports diffusers; the hub does not.
BUILDER = "gpulab-sd-webui"


def add_models_parser(sub) -> None:
    p = sub.add_parser(
        "models", help="list the catalog's model store on this node; make the tiny demo model"
    )
    p.add_argument(
        "--catalog",
        default=settings.get("GPULAB_CATALOG"),
        help=f"{settings.setting('GPULAB_CATALOG').help} [env GPULAB_CATALOG]",
    )
    p.add_argument(
        "--data-dir",
        default=settings.get("GPULAB_DATA_DIR"),
        help="the hub's data dir, where data: sources live (default ./.gpulab)",
    )
    p.add_argument(
        "--make-tiny-sd",
        action="store_true",
        help=f"write the catalog's {TINY!r} model (random weights, ~7 MB) if it is missing",
    )


def builder_command() -> str | None:
    here = Path(sys.executable).parent / BUILDER
    return str(here) if here.exists() else shutil.which(BUILDER)


def make_tiny_sd(target: Path) -> int:
    """Write the tiny pipeline to ``target`` (nothing if it is there). Exit status."""
    if (target / "model_index.json").exists():
        print(f"gpulab: {target} is there already")
        return 0
    builder = builder_command()
    if builder is None:
        print(
            f"gpulab: {BUILDER} is not installed (pip install -e extensions/gpulab_sd_webui, "
            "with torch==2.13.0, diffusers and transformers)",
            file=sys.stderr,
        )
        return 1
    target.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run([builder, "--make-tiny-model", str(target)], check=False).returncode


def cmd_models(args: argparse.Namespace) -> int:
    try:
        catalog = load_catalog(args.catalog or None)
    except CatalogError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    data_dir = Path(args.data_dir).resolve()
    if args.make_tiny_sd:
        if TINY not in catalog.models:
            print(f"gpulab: the catalog has no model {TINY!r}", file=sys.stderr)
            return 2
        status = make_tiny_sd(catalog.models[TINY].resolve_source(data_dir))
        if status:
            return status
    for slug, model in catalog.models.items():
        src = model.resolve_source(data_dir)
        state = "present" if src.is_dir() else "MISSING"
        print(f"{slug:20} {state:8} {model.size:>8}  {model.kind:10} {src}  ({model.license})")
    if not any(model.resolve_source(data_dir).is_dir() for model in catalog.models.values()):
        print(
            "gpulab: the model store is empty: apps that use models (Stable Diffusion WebUI) "
            "will end every launch with 'no model'; `gpulab models --make-tiny-sd` makes the demo"
        )
    print_local_apps(catalog)
    return 0


def print_local_apps(catalog) -> None:
    """Which apps the embedded local spawner offers, and for the rest why not (users only see
    that an app is not offered; this is where the operator learns what to change)."""
    print("\napps of the local spawner (gpulab-local):")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    for slug, app in catalog.apps.items():
        if app.is_server:
            why = ""
        elif not app.local_command:
            why = f"needs the Docker spawner (image {app.image!r}); not offered to users here"
        else:
            why = checkout_problem(app)
            if not why and shutil.which(app.local_command[0], path=path) is None:
                why = f"{app.local_command[0]} is not installed in the hub's environment"
        print(f"{slug:20} {'offered' if not why else 'NOT OFFERED':11}  {why}")
