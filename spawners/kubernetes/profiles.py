"""gpulab's catalog and spawn options as KubeSpawner profiles and ``kubespawner_override`` dicts.

Pure functions, no cluster and no hub:

- :func:`profile_list`: the catalog as zero-to-jupyterhub's ``singleuser.profileList``: one
  profile per GPU type plus the no-GPU profile (``none``, the default), each with
  ``profile_options`` for the card count, the image, the pricing (on-demand, spot at the on-demand
  price, or spot with the user's own bid) and one yes/no option per dataset.
- :func:`overrides_for_options`: parsed spawn options (:func:`gpulab.spawners.options.
  parse_options`, the form's and the REST API's contract) as one override dict.
- :func:`options_from_profile`: a profile choice (KubeSpawner's ``user_options``) back as gpulab's
  raw options, so a choice made in the profile form goes through the same checks as the REST API.

Both paths assemble the same parts (:func:`gpu_part`, :func:`image_part`, :func:`pricing_part`,
:func:`dataset_part`), merged the way KubeSpawner merges overrides, so a choice made in the
profile form and the same choice made through gpulab's options give the same pod
(``tests/unit/test_kubernetes_profiles.py`` builds both with KubeSpawner and compares them).
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

from jupyterhub.traitlets import ByteSpecification

from gpulab.catalog import DEFAULT_APP, NO_GPU, Catalog
from gpulab.spawners.kubernetes.settings import LABEL_VALUE, KubernetesSettings
from gpulab.spawners.options import OptionsError, ServerOptions, parse_options

# Pod labels (selectable: `kubectl get pods -l gpulab.io/pricing=spot`) and annotations
# (free-form values: prices, bids). They mirror the Docker spawner's container labels
# (spawners/docker/labels.py); what only exists at run time (allocation id, card UUIDs, hub id)
# is the spawner's to add, not the catalog's.
L_GPU_TYPE = "gpulab.io/gpu-type"
L_GPU_COUNT = "gpulab.io/gpu-count"
L_PRICING = "gpulab.io/pricing"
L_IMAGE = "gpulab.io/image"
L_APP = "gpulab.io/app"
L_DATASET = "dataset.gpulab.io/{slug}"
A_MODE = "gpulab.io/mode"
A_PRICE = "gpulab.io/price-per-hour"
A_CURRENCY = "gpulab.io/currency"
A_MAX_PRICE = "gpulab.io/max-price"

SHM_VOLUME = "dshm"
NO_GPU_PROFILE = NO_GPU  # the same word as gpulab's `gpu`; never a catalog slug
DATASET_OPTION = "dataset-{slug}"
YES, NO = "yes", "no"
# A bid typed into the profile form: a positive decimal with at most 6 places and no leading
# zeros, so the text KubeSpawner writes into the annotation is the number gpulab parses.
BID_REGEX = r"^(?!0+(\.0+)?$)(0|[1-9][0-9]{0,5})(\.[0-9]{1,6})?$"


def compose(*parts: dict[str, Any]) -> dict[str, Any]:
    """Merge override dicts the way KubeSpawner applies them one after another.

    Dicts merge key by key, anything else replaces. ``None`` is kept, not applied: in an
    override it is KubeSpawner's "remove this key" (e.g. a GPU limit the operator's base config
    set), and it must still be there when the override reaches the spawner.
    """
    out: dict[str, Any] = {}
    for part in parts:
        _compose_into(out, part)
    return out


def _compose_into(target: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict):
            if not isinstance(target.get(key), dict):
                target[key] = {}
            _compose_into(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _allowed(values: Any) -> str:
    return ", ".join(str(v) for v in values)


def _label_value(field: str, value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise OptionsError(field, f"{value!r} cannot be a Kubernetes label value (63 characters)")
    return value


def server_resources(catalog: Catalog, gpu: str, gpus: int) -> tuple[float, str]:
    """(CPUs, memory such as "64G") of a server: the catalog's per-card amounts times the cards.

    The same rule as :meth:`GpuSpawnerMixin.resource_limits`, from the options alone.
    """
    if gpu == NO_GPU_PROFILE:
        return catalog.no_gpu.cpus, catalog.no_gpu.mem
    gpu_type = catalog.gpu_types[gpu]
    number, unit = gpu_type.mem_per_card[:-1], gpu_type.mem_per_card[-1]
    return gpu_type.cpus_per_card * gpus, f"{float(number) * gpus:g}{unit}"


def _check_gpu(catalog: Catalog, gpu: str, gpus: int) -> None:
    choices = [NO_GPU_PROFILE, *catalog.gpu_types]
    if gpu not in choices:
        raise OptionsError("gpu", f"unknown GPU type {gpu!r}; allowed: {_allowed(choices)}")
    if gpu == NO_GPU_PROFILE and gpus != 0:
        raise OptionsError("gpus", "no-GPU mode takes no GPUs; allowed: 0")
    if gpu != NO_GPU_PROFILE and not 1 <= gpus <= catalog.max_gpus_per_server:
        raise OptionsError(
            "gpus", f"must be between 1 and {catalog.max_gpus_per_server}, not {gpus}"
        )


# ---- the parts -----------------------------------------------------------------------------


def base_part(settings: KubernetesSettings) -> dict[str, Any]:
    """What every gpulab server gets, whatever its mode: the Docker spawner's lock-down."""
    return {
        "uid": settings.run_as_uid,
        "allow_privilege_escalation": False,
        "container_security_context": {
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "extra_pod_config": {"terminationGracePeriodSeconds": settings.termination_grace_seconds},
        "environment": {"HOME": settings.home_mount},
    }


def gpu_type_part(catalog: Catalog, settings: KubernetesSettings, gpu: str) -> dict[str, Any]:
    """The node pool: the node selector on the GPU-type label, and the type's label."""
    _check_gpu(catalog, gpu, 0 if gpu == NO_GPU_PROFILE else 1)
    node_value = settings.no_gpu_label_value if gpu == NO_GPU_PROFILE else gpu
    part: dict[str, Any] = {
        "node_selector": {settings.gpu_type_label: _label_value("gpu", node_value)},
        "extra_labels": {L_GPU_TYPE: _label_value("gpu", gpu)},
        "environment": {"GPULAB_GPU_TYPE": gpu, "GPULAB_CURRENCY": catalog.currency},
        "extra_annotations": {A_CURRENCY: catalog.currency},
        # Pricing defaults to on-demand; the spot choice replaces these.
        "priority_class_name": settings.on_demand_priority_class,
    }
    part["extra_labels"][L_PRICING] = "on-demand"
    part["environment"]["GPULAB_PRICING"] = "on-demand"
    if gpu == NO_GPU_PROFILE:
        part["environment"].update({"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"})
        # None: KubeSpawner removes the key, so no base config can give this server a card.
        part["extra_resource_limits"] = {settings.gpu_resource: None}
    return part


def gpu_count_part(
    catalog: Catalog, settings: KubernetesSettings, gpu: str, gpus: int
) -> dict[str, Any]:
    """The cards (the device plugin's extended resource), CPUs and memory, and the hourly price.

    Requests equal limits for every resource (KubeSpawner's guarantees), so the pod is in the
    Guaranteed QoS class: the last the kubelet evicts under node pressure.
    """
    _check_gpu(catalog, gpu, gpus)
    cpus, mem = server_resources(catalog, gpu, gpus)
    if gpu == NO_GPU_PROFILE:
        price: Decimal = catalog.no_gpu.price_per_hour
        mode = catalog.no_gpu.display_name
    else:
        price = catalog.gpu_types[gpu].on_demand_price * gpus
        mode = f"{catalog.gpu_types[gpu].display_name} x{gpus}"
    part: dict[str, Any] = {
        "cpu_limit": cpus,
        "cpu_guarantee": cpus,
        "mem_limit": mem,
        "mem_guarantee": mem,
        "extra_labels": {L_GPU_COUNT: str(gpus)},
        "extra_annotations": {A_MODE: mode, A_PRICE: str(price)},
        "environment": {
            "GPULAB_MODE": mode,
            "GPULAB_GPU_COUNT": str(gpus),
            "GPULAB_PRICE_PER_HOUR": str(price),
        },
    }
    if gpus:
        part["extra_resource_limits"] = {settings.gpu_resource: gpus}
        part["extra_resource_guarantees"] = {settings.gpu_resource: gpus}
    part["volumes"] = {
        SHM_VOLUME: {
            "name": SHM_VOLUME,
            "emptyDir": {"medium": "Memory", "sizeLimit": str(shm_bytes(settings, mem))},
        }
    }
    part["volume_mounts"] = {SHM_VOLUME: {"name": SHM_VOLUME, "mountPath": "/dev/shm"}}
    return part


def shm_bytes(settings: KubernetesSettings, mem: str) -> int:
    """Bytes of /dev/shm for a memory limit such as "64G" (JupyterHub's binary units, as
    KubeSpawner reads ``mem_limit``): ``shm_fraction`` of it, and never under the usual 64 MiB."""
    return max(64 * 2**20, int(ByteSpecification().validate(None, mem) * settings.shm_fraction))


def image_part(catalog: Catalog, image: str, gpu: str = NO_GPU_PROFILE) -> dict[str, Any]:
    """The container image of a catalog image slug (it must support the GPU type)."""
    if image not in catalog.images:
        raise OptionsError("image", f"unknown image {image!r}; allowed: {_allowed(catalog.images)}")
    entry = catalog.images[image]
    if not entry.supports(gpu):
        ok = [s for s, i in catalog.images.items() if i.supports(gpu)]
        raise OptionsError(
            "image", f"image {image!r} does not support gpu {gpu!r}; allowed for it: {_allowed(ok)}"
        )
    if not entry.docker_image:
        raise OptionsError(
            "image", f"image {image!r} has no docker_image in the catalog (images.{image})"
        )
    return {
        "image": entry.docker_image,
        "extra_labels": {L_IMAGE: _label_value("image", image)},
        "environment": {"GPULAB_IMAGE": image},
    }


def pricing_part(settings: KubernetesSettings, pricing: str, max_price: str = "") -> dict[str, Any]:
    """On-demand or spot: the PriorityClass, the label, and a spot server's bid per card-hour."""
    if pricing == "on-demand":
        return {
            "priority_class_name": settings.on_demand_priority_class,
            "extra_labels": {L_PRICING: "on-demand"},
            "environment": {"GPULAB_PRICING": "on-demand"},
        }
    if pricing == "spot":
        return {
            "priority_class_name": settings.spot_priority_class,
            "extra_labels": {L_PRICING: "spot"},
            "extra_annotations": {A_MAX_PRICE: max_price},
            "environment": {"GPULAB_PRICING": "spot", "GPULAB_MAX_PRICE": max_price},
        }
    raise OptionsError("pricing", f"unknown pricing {pricing!r}; allowed: on-demand, spot")


def _volume(source: dict[str, Any], mount_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return source, {"mountPath": mount_path, "readOnly": True}


def dataset_part(catalog: Catalog, settings: KubernetesSettings, slug: str) -> dict[str, Any]:
    """One dataset, read-only at ``~/datasets/SLUG``.

    Mounted straight into the home, not at /datasets plus a link as in Docker: each dataset is
    its own profile option, so no one override knows the whole list the launcher would link.
    Volumes are in dict form so that KubeSpawner merges them beside the home volume.
    """
    if slug not in catalog.datasets:
        raise OptionsError(
            "datasets", f"unknown dataset {slug!r}; allowed: {_allowed(catalog.datasets)}"
        )
    name = f"dataset-{slug}"
    if len(name) > 63:
        raise OptionsError("datasets", f"{slug!r} is too long for a volume name (57 characters)")
    if settings.dataset_source == "pvc":
        source = {
            "persistentVolumeClaim": {
                "claimName": settings.dataset_claim.format(slug=slug),
                "readOnly": True,
            }
        }
    else:
        source = {"hostPath": {"path": f"{settings.dataset_host_root}/{slug}", "type": "Directory"}}
    return {
        "volumes": {name: {"name": name, **source}},
        "volume_mounts": {
            name: {
                "name": name,
                "mountPath": f"{settings.home_mount}/datasets/{slug}",
                "readOnly": True,
            }
        },
        "extra_labels": {L_DATASET.format(slug=slug): "read-only"},
    }


def app_part(catalog: Catalog, settings: KubernetesSettings, app: str) -> dict[str, Any]:
    """What the server opens on, and the model store (read-only) for apps that use models."""
    if app not in catalog.apps:
        raise OptionsError("app", f"unknown app {app!r}; allowed: {_allowed(catalog.apps)}")
    entry = catalog.apps[app]
    part: dict[str, Any] = {
        "default_url": entry.url_path("/"),
        "extra_labels": {L_APP: _label_value("app", app)},
        "environment": {"GPULAB_APP": app},
    }
    if entry.uses_models:
        part["volumes"], part["volume_mounts"] = {}, {}
        for slug in catalog.models:
            name = f"model-{slug}"
            part["volumes"][name] = {
                "name": name,
                "persistentVolumeClaim": {
                    "claimName": settings.model_claim.format(slug=slug),
                    "readOnly": True,
                },
            }
            part["volume_mounts"][name] = {
                "name": name,
                "mountPath": f"{settings.home_mount}/models/{slug}",
                "readOnly": True,
            }
    return part


# ---- the two entry points ------------------------------------------------------------------


def overrides_for_options(
    options: ServerOptions, catalog: Catalog, settings: KubernetesSettings
) -> dict[str, Any]:
    """The ``kubespawner_override`` of a server with these (already parsed) spawn options."""
    max_price = "" if options.max_price is None else str(options.max_price)
    return compose(
        base_part(settings),
        app_part(catalog, settings, options.app),
        gpu_type_part(catalog, settings, options.gpu),
        gpu_count_part(catalog, settings, options.gpu, options.gpus),
        image_part(catalog, options.image, options.gpu),
        pricing_part(settings, options.pricing, max_price),
        *(dataset_part(catalog, settings, slug) for slug in options.datasets),
    )


def _default_image(catalog: Catalog, gpu: str) -> str:
    images = [s for s, i in catalog.images.items() if i.supports(gpu)]
    return "base" if "base" in images else images[0]


def _profile(catalog: Catalog, settings: KubernetesSettings, gpu: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if gpu == NO_GPU_PROFILE:
        cpus, mem = server_resources(catalog, gpu, 0)
        display = catalog.no_gpu.display_name
        description = (
            f"{catalog.no_gpu.description}: {cpus:g} CPUs, {mem} memory, "
            f"{catalog.no_gpu.price_per_hour} {catalog.currency} per hour"
        )
        count = gpu_count_part(catalog, settings, gpu, 0)
    else:
        gt = catalog.gpu_types[gpu]
        display = gt.display_name
        description = (
            f"{gt.vram_gb} GB VRAM per card; {gt.on_demand_price} {catalog.currency} per "
            f"card-hour on demand, spot from {gt.spot_floor_price}"
        )
        count = {}
        choices = {}
        for n in range(1, catalog.max_gpus_per_server + 1):
            cpus, mem = server_resources(catalog, gpu, n)
            choices[str(n)] = {
                "display_name": f"{n} x {gt.display_name}: {cpus:g} CPUs, {mem} memory, "
                f"{gt.on_demand_price * n} {catalog.currency}/h on demand",
                "default": n == 1,
                "kubespawner_override": gpu_count_part(catalog, settings, gpu, n),
            }
        options["gpus"] = {"display_name": "GPUs", "choices": choices}
    default_image = _default_image(catalog, gpu)
    options["image"] = {
        "display_name": "Image",
        "choices": {
            slug: {
                "display_name": f"{image.display_name}: {image.description}",
                "default": slug == default_image,
                "kubespawner_override": image_part(catalog, slug, gpu),
            }
            for slug, image in catalog.images.items()
            if image.supports(gpu)
        },
    }
    if gpu != NO_GPU_PROFILE:
        on_demand = catalog.gpu_types[gpu].on_demand_price
        options["pricing"] = {
            "display_name": "Pricing",
            "choices": {
                "on-demand": {
                    "display_name": "On demand: never reclaimed",
                    "default": True,
                    "kubespawner_override": pricing_part(settings, "on-demand"),
                },
                "spot": {
                    "display_name": f"Spot, bidding the on-demand price ({on_demand}/card-hour)",
                    "kubespawner_override": pricing_part(settings, "spot", str(on_demand)),
                },
            },
            "unlisted_choice": {
                "enabled": True,
                "display_name": f"Spot bid per card-hour ({catalog.currency})",
                "display_name_in_choices": "Spot with my own bid...",
                "validation_regex": BID_REGEX,
                "validation_message": "A positive price per card-hour, e.g. 0.45",
                # KubeSpawner writes the typed bid where {value} stands.
                "kubespawner_override": pricing_part(settings, "spot", "{value}"),
            },
        }
    for slug, dataset in catalog.datasets.items():
        options[DATASET_OPTION.format(slug=slug)] = {
            "display_name": f"Dataset: {dataset.display_name} ({dataset.size})",
            "choices": {
                NO: {"display_name": "not mounted", "default": True},
                YES: {
                    "display_name": f"read-only at ~/datasets/{slug}",
                    "kubespawner_override": dataset_part(catalog, settings, slug),
                },
            },
        }
    return {
        "slug": gpu,
        "display_name": display,
        "description": description,
        "default": gpu == NO_GPU_PROFILE,
        "kubespawner_override": compose(
            base_part(settings),
            app_part(catalog, settings, DEFAULT_APP),
            gpu_type_part(catalog, settings, gpu),
            count,
        ),
        "profile_options": options,
    }


def profile_list(catalog: Catalog, settings: KubernetesSettings) -> list[dict[str, Any]]:
    """KubeSpawner's ``profile_list`` (z2jh ``singleuser.profileList``) for the catalog.

    No GPU first (gpulab's default mode), then the GPU types in catalog order. Profiles open
    JupyterLab; the other apps need gpulab's own form (their commands and proxies are gpulab's).
    """
    return [_profile(catalog, settings, gpu) for gpu in [NO_GPU_PROFILE, *catalog.gpu_types]]


def options_from_profile(user_options: dict[str, Any], catalog: Catalog) -> ServerOptions:
    """A profile-form choice (KubeSpawner ``user_options``) as gpulab's parsed spawn options.

    ``{"profile": "a100-80g", "gpus": "2", "pricing--unlisted-choice": "1.5",
    "dataset-sklearn-toy": "yes"}`` -> gpu a100-80g x2, spot bidding 1.5, with sklearn-toy. A
    choice missing from ``user_options`` takes its profile default, as in KubeSpawner. Checked by
    :func:`parse_options`: an error names gpulab's field and the allowed values.
    """
    profile = user_options.get("profile") or NO_GPU_PROFILE
    choices = [NO_GPU_PROFILE, *catalog.gpu_types]
    if profile not in choices:
        raise OptionsError("profile", f"unknown profile {profile!r}; allowed: {_allowed(choices)}")
    raw: dict[str, Any] = {
        "gpu": profile,
        "image": user_options.get("image") or _default_image(catalog, profile),
    }
    if profile != NO_GPU_PROFILE:
        raw["gpus"] = user_options.get("gpus") or 1
        bid = user_options.get("pricing--unlisted-choice")
        if bid:
            raw["pricing"], raw["max_price"] = "spot", bid
        else:
            raw["pricing"] = user_options.get("pricing") or "on-demand"
    datasets = []
    for slug in catalog.datasets:
        choice = user_options.get(DATASET_OPTION.format(slug=slug)) or NO
        if choice not in (YES, NO):
            raise OptionsError(
                DATASET_OPTION.format(slug=slug), f"unknown choice {choice!r}; allowed: yes, no"
            )
        if choice == YES:
            datasets.append(slug)
    raw["datasets"] = datasets
    return parse_options(raw, catalog)
