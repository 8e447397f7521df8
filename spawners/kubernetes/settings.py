"""The operator's choices for running gpulab's catalog on Kubernetes, and the PriorityClasses.

:class:`KubernetesSettings` holds what the catalog cannot know: the node label that names a
node's GPU type, the extended resource the device plugin advertises, the PriorityClass names of
on-demand and spot servers, where the read-only datasets come from (PVCs or host paths), and where
the user's home is mounted. Every field has the default ``docs/kubernetes.md`` documents; a bad
value raises an error naming the field and what is allowed.

:func:`priority_classes` writes the two PriorityClass manifests those names refer to.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpulab.catalog import NO_GPU

# Kubernetes' own syntax rules (apimachinery validation), checked here so that a bad setting fails
# when the profiles are generated, not when the API server refuses the first pod.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")

DATASET_SOURCES = ("pvc", "hostPath")


class KubernetesSettingsError(ValueError):
    """A bad Kubernetes setting; the message names the field and what is allowed."""


def check_label_key(key: str) -> str:
    """A label or annotation key: ``[prefix/]name``, prefix a DNS subdomain, name <= 63 chars."""
    prefix, _, name = key.rpartition("/")
    if (prefix and not _DNS_SUBDOMAIN.match(prefix)) or not _LABEL_NAME.match(name):
        raise ValueError(
            f"{key!r} is not a Kubernetes label key ([prefix/]name: prefix a DNS subdomain such "
            "as gpulab.io, name up to 63 letters, digits, '-', '_' or '.')"
        )
    return key


def check_dns_label(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes object name (up to 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit)"
        )
    return value


class KubernetesSettings(BaseModel):
    """What the operator's cluster looks like; the defaults are those ``docs/kubernetes.md`` uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_type_label: str = Field(
        "gpulab.io/gpu-type",
        description="Node label whose value is the catalog GPU type slug of the node's cards "
        "(or no_gpu_label_value on CPU-only nodes). GPU servers get it as a node selector.",
    )
    no_gpu_label_value: str = Field(
        NO_GPU,
        description="Value of gpu_type_label on the CPU-only node pool, where no-GPU servers run.",
    )
    gpu_resource: str = Field(
        "nvidia.com/gpu",
        description="The extended resource the NVIDIA device plugin advertises per card.",
    )
    tolerate_gpu_taint: bool = Field(
        True,
        description="Give GPU servers a toleration for a NoSchedule taint named gpu_resource "
        "(GKE taints its GPU nodes nvidia.com/gpu=present:NoSchedule; elsewhere operators "
        "often add the same taint by hand).",
    )
    on_demand_priority_class: str = Field(
        "gpulab-on-demand", description="PriorityClass of on-demand and no-GPU servers."
    )
    spot_priority_class: str = Field(
        "gpulab-spot", description="PriorityClass of spot servers: lower than on-demand."
    )
    dataset_source: Literal["pvc", "hostPath"] = Field(
        "pvc",
        description="Where dataset volumes come from: a ReadOnlyMany PVC per dataset, or a "
        "directory on every node.",
    )
    dataset_claim: str = Field(
        "gpulab-dataset-{slug}", description="PVC name of a dataset ({slug}: its catalog slug)."
    )
    dataset_host_root: str = Field(
        "/srv/gpulab/datasets",
        description="hostPath mode: the directory on every node holding one folder per dataset.",
    )
    model_claim: str = Field(
        "gpulab-model-{slug}",
        description="PVC name of a model of the model store, mounted for apps that use models.",
    )
    home_mount: str = Field(
        "/home/jovyan",
        description="Where the user's home PVC is mounted (zero-to-jupyterhub's default).",
    )
    run_as_uid: int = Field(1000, ge=1, description="The uid servers run as; never root.")
    shm_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Size of /dev/shm (a memory-backed emptyDir) as a fraction of the server's "
        "memory limit, as gpulab-docker's shm_fraction: the container runtime's 64 MB default "
        "breaks PyTorch DataLoader workers. Its pages count against the memory limit.",
    )
    termination_grace_seconds: int = Field(
        30,
        ge=0,
        description="terminationGracePeriodSeconds: SIGTERM to SIGKILL when a pod is deleted.",
    )

    @field_validator("gpu_type_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        return check_label_key(value)

    @field_validator("no_gpu_label_value")
    @classmethod
    def _label_value(cls, value: str) -> str:
        if not value or not LABEL_VALUE.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes label value")
        return value

    @field_validator("gpu_resource")
    @classmethod
    def _resource(cls, value: str) -> str:
        if "/" not in value:
            raise ValueError(f"{value!r} is not an extended resource name (e.g. nvidia.com/gpu)")
        return check_label_key(value)

    @field_validator("on_demand_priority_class", "spot_priority_class")
    @classmethod
    def _class_name(cls, value: str) -> str:
        return check_dns_label(value)

    @field_validator("dataset_claim", "model_claim")
    @classmethod
    def _claim(cls, value: str) -> str:
        if "{slug}" not in value:
            raise ValueError(f"{value!r} must contain {{slug}} (one claim per entry)")
        check_dns_label(value.replace("{slug}", "x"))
        return value

    @field_validator("dataset_host_root", "home_mount")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path, not {value!r}")
        return value.rstrip("/") or "/"


def make_settings(**values: Any) -> KubernetesSettings:
    """Build settings, turning pydantic's error into one naming each field and what it allows."""
    try:
        return KubernetesSettings(**values)
    except ValidationError as e:
        parts = []
        for item in e.errors():
            key = ".".join(str(p) for p in item["loc"])
            if item["type"] == "extra_forbidden":
                parts.append(
                    f"{key}: unknown setting; allowed: {', '.join(KubernetesSettings.model_fields)}"
                )
            elif item["type"] == "literal_error":
                parts.append(f"{key}: {item['input']!r} is not allowed; allowed: pvc, hostPath")
            else:
                parts.append(f"{key}: {item['msg'].removeprefix('Value error, ')}")
        raise KubernetesSettingsError("kubernetes settings: " + "; ".join(parts)) from None


# PriorityClass values: far below system-cluster-critical (2e9) and above 0, the default of pods
# without a class, so other workloads of the cluster rank below on-demand servers.
ON_DEMAND_PRIORITY = 100_000
SPOT_PRIORITY = 1_000


def priority_classes(settings: KubernetesSettings, *, gpulab_market: bool) -> list[dict[str, Any]]:
    """The PriorityClass manifests of on-demand and spot servers.

    ``gpulab_market``: whether gpulab's own spot market runs (a gpulab hub on the cluster). Then no
    server preempts another (``preemptionPolicy: Never``): the market reclaims spot cards itself,
    after its warning, by deleting the pod; a pending on-demand pod is only put ahead of spot pods
    in the scheduling queue. Without it (stock zero-to-jupyterhub with the generated profiles)
    on-demand pods preempt spot pods the Kubernetes way, with no more warning than the pod's
    termination grace period.
    """
    on_demand_policy = "Never" if gpulab_market else "PreemptLowerPriority"
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": settings.on_demand_priority_class},
            "value": ON_DEMAND_PRIORITY,
            "preemptionPolicy": on_demand_policy,
            "globalDefault": False,
            "description": "gpulab on-demand and no-GPU servers",
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": settings.spot_priority_class},
            "value": SPOT_PRIORITY,
            # A spot server never pushes anything out: it waits for a free card.
            "preemptionPolicy": "Never",
            "globalDefault": False,
            "description": "gpulab spot servers: reclaimed first",
        },
    ]
