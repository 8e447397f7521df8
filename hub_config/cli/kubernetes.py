"""``gpulab kubernetes``: the catalog as zero-to-jupyterhub configuration, printed to stdout.

    gpulab kubernetes values                       # singleuser.profileList, extraTolerations,
                                                   # prePuller.extraImages (YAML)
    gpulab kubernetes priority-classes             # the two PriorityClasses (YAML documents)
    gpulab kubernetes priority-classes --gpulab-market
    gpulab kubernetes values --set dataset_source=hostPath --set dataset_host_root=/data

``--set KEY=VALUE`` changes one Kubernetes setting (node label, PriorityClass names, where
datasets come from; the keys are :class:`KubernetesSettings`' fields). Nothing talks to a
cluster: see docs/kubernetes.md for what is tested and what is on paper.
"""

from __future__ import annotations

import argparse
import sys

from gpulab.catalog import CatalogError, load_catalog, settings


def add_kubernetes_parser(sub) -> None:
    p = sub.add_parser(
        "kubernetes",
        help="print zero-to-jupyterhub profiles and PriorityClasses generated from the catalog",
    )
    p.add_argument("what", choices=("values", "priority-classes"), help="what to print")
    p.add_argument(
        "--catalog",
        default=settings.get("GPULAB_CATALOG"),
        help=f"{settings.setting('GPULAB_CATALOG').help} [env GPULAB_CATALOG]",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Kubernetes setting, e.g. gpu_type_label=example.com/gpu (repeatable)",
    )
    p.add_argument(
        "--gpulab-market",
        action="store_true",
        help="priority-classes: gpulab's spot market reclaims spot servers (after its warning), "
        "so on-demand pods never preempt them (preemptionPolicy: Never)",
    )


def cmd_kubernetes(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `gpulab` imports this module for every command, and the
    # Kubernetes code (pydantic models, YAML) is only needed by this one.
    from gpulab.spawners.kubernetes.settings import (
        KubernetesSettings,
        KubernetesSettingsError,
        make_settings,
        priority_classes,
    )
    from gpulab.spawners.kubernetes.values import render_priority_classes, render_values

    values: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            keys = ", ".join(KubernetesSettings.model_fields)
            print(f"gpulab: --set {item!r}: expected KEY=VALUE; keys: {keys}", file=sys.stderr)
            return 2
        values[key.strip()] = value
    try:
        catalog = load_catalog(args.catalog or None)
        settings = make_settings(**values)
    except (CatalogError, KubernetesSettingsError) as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    if args.what == "values":
        sys.stdout.write(render_values(catalog, settings))
    else:
        manifests = priority_classes(settings, gpulab_market=args.gpulab_market)
        sys.stdout.write(render_priority_classes(manifests))
    return 0
