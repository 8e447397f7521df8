"""The catalog as KubeSpawner profiles: pods built by the real KubeSpawner, no cluster.

Each test gives the generated ``profile_list`` (or the override of a parsed spawn request) to a
real ``KubeSpawner``, lets its public ``load_user_options`` apply the choice the way a hub would,
and builds the V1Pod with its public ``get_pod_manifest`` (KubeSpawner's own ``make_pod``). The
assertions are what an operator would see in ``kubectl get pod -o yaml``. Every expected value is
read from the shipped catalog.

KubeSpawner loads a kubeconfig when constructed; the module fixture hands it one naming an
address where nothing listens. No request is ever sent.
"""

from __future__ import annotations

import asyncio
import copy
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from jupyterhub.traitlets import ByteSpecification
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config
from kubespawner import KubeSpawner
from kubespawner.objects import make_pod

from gpulab.catalog import load_catalog
from gpulab.spawners.kubernetes.profiles import (
    A_CURRENCY,
    A_MAX_PRICE,
    A_MODE,
    A_PRICE,
    L_APP,
    L_GPU_COUNT,
    L_GPU_TYPE,
    L_IMAGE,
    L_PRICING,
    options_from_profile,
    overrides_for_options,
    profile_list,
)
from gpulab.spawners.kubernetes.settings import (
    KubernetesSettingsError,
    make_settings,
    priority_classes,
)
from gpulab.spawners.kubernetes.values import z2jh_values
from gpulab.spawners.options import OptionsError, parse_options

CATALOG = load_catalog()
SETTINGS = make_settings()
GPU = "nvidia.com/gpu"
TYPE_LABEL = "gpulab.io/gpu-type"
# zero-to-jupyterhub's per-user home volume (singleuser.storage.type: dynamic, the default), in
# the dict form its chart's jupyterhub_config.py writes: the generated volumes must land beside
# it, never replace it.
HOME = "volume-{user_server}"
HOME_VOLUME = {HOME: {"name": HOME, "persistentVolumeClaim": {"claimName": "{pvc_name}"}}}
HOME_MOUNT = {HOME: {"name": HOME, "mountPath": "/home/jovyan"}}


@pytest.fixture(scope="module", autouse=True)
def _kubeconfig(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "none", "user": {"token": "unused"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        yield


def build_pod(
    profiles: list[dict[str, Any]], user_options: dict[str, Any], **base: Any
) -> dict[str, Any]:
    """The pod KubeSpawner makes for this choice among these profiles, over z2jh's home volume
    (and any other base config in ``base``), as the JSON the API server would receive: what
    ``kubectl get pod -o yaml`` shows."""

    async def run() -> dict[str, Any]:
        spawner = KubeSpawner(
            user=SimpleNamespace(name="alice@example.org", id=7, url="/user/alice/"),
            hub=SimpleNamespace(
                public_host="", url="http://hub:8081/hub/", base_url="/hub/", api_url=""
            ),
            profile_list=copy.deepcopy(profiles),
            volumes=copy.deepcopy(HOME_VOLUME),
            volume_mounts=copy.deepcopy(HOME_MOUNT),
            **base,
        )
        spawner.user_options = dict(user_options)
        await spawner.load_user_options()
        pod = await spawner.get_pod_manifest()
        return spawner.api.api_client.sanitize_for_serialization(pod)

    return asyncio.run(run())


def as_json(pod: Any) -> dict[str, Any]:
    """A V1Pod as the JSON the API server would receive (the client wants an event loop)."""

    async def run() -> dict[str, Any]:
        async with ApiClient() as client:
            return client.sanitize_for_serialization(pod)

    return asyncio.run(run())


def pod_for_options(raw: dict[str, Any], **base: Any) -> dict[str, Any]:
    """The pod of a REST/form spawn request, through gpulab's parser and the override."""
    overrides = overrides_for_options(parse_options(raw, CATALOG), CATALOG, SETTINGS)
    profile = {"display_name": "gpulab", "slug": "gpulab", "kubespawner_override": overrides}
    return build_pod([profile], {}, **base)


PROFILES = profile_list(CATALOG, SETTINGS)


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod["spec"]["containers"]
    return c


def limits(pod: dict[str, Any]) -> dict[str, Any]:
    return container(pod)["resources"].get("limits") or {}


def requests(pod: dict[str, Any]) -> dict[str, Any]:
    return container(pod)["resources"].get("requests") or {}


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(pod)["env"]}


def mounts(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container(pod)["volumeMounts"]}


def volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def mem_bytes(spec: str, n: int = 1) -> int:
    return ByteSpecification().validate(None, spec) * n


@pytest.mark.parametrize("gpu", list(CATALOG.gpu_types))
@pytest.mark.parametrize("n", [1, CATALOG.max_gpus_per_server])
def test_gpu_profile_asks_for_n_cards_on_nodes_of_its_type(gpu: str, n: int) -> None:
    pod = build_pod(PROFILES, {"profile": gpu, "gpus": str(n)})
    gt = CATALOG.gpu_types[gpu]
    assert limits(pod)[GPU] == n and requests(pod)[GPU] == n
    assert pod["spec"]["nodeSelector"] == {TYPE_LABEL: gpu}
    assert float(limits(pod)["cpu"]) == gt.cpus_per_card * n
    assert int(limits(pod)["memory"]) == mem_bytes(gt.mem_per_card, n)
    # Requests equal limits: Guaranteed QoS, the last class the kubelet evicts.
    assert requests(pod)["cpu"] == limits(pod)["cpu"]
    assert requests(pod)["memory"] == limits(pod)["memory"]
    assert pod["spec"]["priorityClassName"] == SETTINGS.on_demand_priority_class
    assert pod["metadata"]["labels"][L_GPU_TYPE] == gpu
    assert Decimal(pod["metadata"]["annotations"][A_PRICE]) == gt.on_demand_price * n
    assert env(pod)["GPULAB_MODE"] == f"{gt.display_name} x{n}"
    assert "NVIDIA_VISIBLE_DEVICES" not in env(pod)  # the device plugin sets it


def test_no_gpu_profile_is_the_default_and_has_no_card() -> None:
    pod = build_pod(PROFILES, {})
    assert GPU not in limits(pod) and GPU not in requests(pod)
    assert pod["spec"]["nodeSelector"] == {TYPE_LABEL: SETTINGS.no_gpu_label_value}
    assert float(limits(pod)["cpu"]) == CATALOG.no_gpu.cpus
    assert int(limits(pod)["memory"]) == mem_bytes(CATALOG.no_gpu.mem)
    # CUDA images set NVIDIA_VISIBLE_DEVICES=all; "void" keeps every card of a node hidden.
    assert env(pod)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env(pod)["CUDA_VISIBLE_DEVICES"] == ""
    assert container(pod)["image"] == CATALOG.images["base"].docker_image
    assert Decimal(pod["metadata"]["annotations"][A_PRICE]) == CATALOG.no_gpu.price_per_hour


def test_no_gpu_mode_removes_a_gpu_limit_the_base_config_set() -> None:
    # An operator's base config asking every pod for a card still gives no-GPU servers none.
    assert limits(pod_for_options({"gpu": "a100-80g"}, extra_resource_limits={GPU: 1}))[GPU] == 1
    pod = pod_for_options({}, extra_resource_limits={GPU: 1})
    assert GPU not in limits(pod)


def test_servers_never_run_as_root_and_drop_capabilities() -> None:
    for choice in ({}, {"profile": "h100-80g"}):
        pod = build_pod(PROFILES, choice)
        ctx = container(pod)["securityContext"]
        assert ctx["runAsUser"] == SETTINGS.run_as_uid != 0
        assert ctx["runAsNonRoot"] is True and ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("image", list(CATALOG.images))
def test_image_choice_runs_the_catalog_image(image: str) -> None:
    # A GPU type the image supports, or no-GPU mode for a CPU-only image.
    gpu = next(
        (g for g in CATALOG.gpu_types if g in CATALOG.images[image].gpu_types),
        "none" if CATALOG.images[image].gpu_types else next(iter(CATALOG.gpu_types)),
    )
    pod = build_pod(PROFILES, {"profile": gpu, "image": image})
    assert container(pod)["image"] == CATALOG.images[image].docker_image
    assert env(pod)["GPULAB_IMAGE"] == image


def test_profiles_offer_only_the_images_a_type_supports() -> None:
    assert [p["slug"] for p in PROFILES] == ["none", *CATALOG.gpu_types]
    for profile in PROFILES:
        offered = set(profile["profile_options"]["image"]["choices"])
        allowed = {s for s, i in CATALOG.images.items() if i.supports(profile["slug"])}
        assert offered == allowed, profile["slug"]
    assert "teaching" not in {
        c for p in PROFILES[1:] for c in p["profile_options"]["image"]["choices"]
    }


def test_datasets_mount_read_only_beside_the_home() -> None:
    slugs = list(CATALOG.datasets)
    pod = build_pod(PROFILES, {"profile": "none", **{f"dataset-{s}": "yes" for s in slugs}})
    by_path = mounts(pod)
    assert not by_path["/home/jovyan"].get("readOnly")
    vols = volumes(pod)
    home = by_path["/home/jovyan"]["name"]
    assert vols[home]["persistentVolumeClaim"]["claimName"].startswith("claim-alice")
    for slug in slugs:
        m = by_path[f"/home/jovyan/datasets/{slug}"]
        assert m["readOnly"] is True
        claim = vols[m["name"]]["persistentVolumeClaim"]
        assert claim == {"claimName": f"gpulab-dataset-{slug}", "readOnly": True}
        assert pod["metadata"]["labels"][f"dataset.gpulab.io/{slug}"] == "read-only"


def test_datasets_not_chosen_are_not_mounted() -> None:
    pod = build_pod(PROFILES, {"profile": "a100-80g"})
    assert not [p for p in mounts(pod) if "/datasets/" in p]
    home = mounts(pod)["/home/jovyan"]["name"]
    assert home.startswith("volume-alice") and sorted(volumes(pod)) == sorted(["dshm", home])


def test_host_path_datasets_are_read_only_too() -> None:
    settings = make_settings(dataset_source="hostPath", dataset_host_root="/srv/data")
    slug = next(iter(CATALOG.datasets))
    pod = build_pod(profile_list(CATALOG, settings), {"profile": "none", f"dataset-{slug}": "yes"})
    m = mounts(pod)[f"/home/jovyan/datasets/{slug}"]
    assert m["readOnly"] is True
    assert volumes(pod)[m["name"]]["hostPath"]["path"] == f"/srv/data/{slug}"


def test_on_demand_is_the_default_pricing() -> None:
    pod = build_pod(PROFILES, {"profile": "a100-80g"})
    assert pod["metadata"]["labels"][L_PRICING] == "on-demand"
    assert A_MAX_PRICE not in pod["metadata"]["annotations"]


def test_spot_choice_gets_the_spot_class_and_the_on_demand_bid() -> None:
    gpu = "a100-80g"
    pod = build_pod(PROFILES, {"profile": gpu, "pricing": "spot"})
    assert pod["spec"]["priorityClassName"] == SETTINGS.spot_priority_class
    assert pod["metadata"]["labels"][L_PRICING] == "spot"
    bid = Decimal(pod["metadata"]["annotations"][A_MAX_PRICE])
    assert bid == CATALOG.gpu_types[gpu].on_demand_price


def test_spot_with_a_typed_bid_annotates_the_bid() -> None:
    pod = build_pod(PROFILES, {"profile": "rtx-4090", "pricing--unlisted-choice": "0.45"})
    assert pod["spec"]["priorityClassName"] == SETTINGS.spot_priority_class
    assert pod["metadata"]["annotations"][A_MAX_PRICE] == "0.45"
    assert env(pod)["GPULAB_MAX_PRICE"] == "0.45"


@pytest.mark.parametrize("bid", ["0", "-1", "abc", "1e3", "0.0"])
def test_a_bad_typed_bid_is_refused_by_kubespawner(bid: str) -> None:
    with pytest.raises(ValueError, match="pricing"):
        build_pod(PROFILES, {"profile": "rtx-4090", "pricing--unlisted-choice": bid})


@pytest.mark.parametrize(
    "choice",
    [
        {},
        {"profile": "h100-80g", "gpus": "3", "image": "pytorch"},
        {"profile": "a100-80g", "gpus": "2", "pricing": "spot", "dataset-sklearn-toy": "yes"},
        {"profile": "rtx-4090", "pricing--unlisted-choice": "0.4", "image": "comfyui"},
        {"profile": "none", "image": "teaching", "dataset-sklearn-images": "yes"},
    ],
)
def test_profile_choice_and_rest_options_give_the_same_pod(choice: dict[str, Any]) -> None:
    # The same server asked for through the profile form and through gpulab's REST options.
    options = options_from_profile(choice, CATALOG)
    assert build_pod(PROFILES, choice) == pod_for_options(options.to_json())


@pytest.mark.parametrize(
    ("raw", "field", "allowed"),
    [
        ({"gpu": "v100"}, "gpu", "a100-80g"),
        ({"image": "tensorflow"}, "image", "pytorch"),
        ({"gpu": "a100-80g", "image": "teaching"}, "image", "base"),
        ({"datasets": ["imagenet"]}, "datasets", "sklearn-toy"),
    ],
)
def test_bad_options_name_the_field_and_allowed_values(raw, field, allowed) -> None:
    with pytest.raises(OptionsError) as e:
        pod_for_options(raw)
    assert e.value.field == field and allowed in str(e.value)


@pytest.mark.parametrize(
    ("choice", "field", "allowed"),
    [
        ({"profile": "v100"}, "profile", "h100-80g"),
        ({"profile": "a100-80g", "image": "teaching"}, "image", "pytorch"),
        ({"profile": "a100-80g", "gpus": "9"}, "gpus", str(CATALOG.max_gpus_per_server)),
        ({"profile": "none", "dataset-sklearn-toy": "maybe"}, "dataset-sklearn-toy", "yes, no"),
    ],
)
def test_bad_profile_choice_names_the_field(choice, field, allowed) -> None:
    with pytest.raises(OptionsError) as e:
        options_from_profile(choice, CATALOG)
    assert e.value.field == field and allowed in str(e.value)


def test_bad_settings_name_the_field_and_allowed_values() -> None:
    with pytest.raises(KubernetesSettingsError, match=r"dataset_source: 'nfs'.*pvc, hostPath"):
        make_settings(dataset_source="nfs")
    with pytest.raises(KubernetesSettingsError, match="spot_priority_class"):
        make_settings(spot_priority_class="Spot Class")
    with pytest.raises(KubernetesSettingsError, match="gpu_label: unknown setting; allowed: "):
        make_settings(gpu_label="x")


def test_priority_classes_rank_spot_below_on_demand() -> None:
    for market in (True, False):
        on_demand, spot = priority_classes(SETTINGS, gpulab_market=market)
        assert on_demand["metadata"]["name"] == SETTINGS.on_demand_priority_class
        assert spot["metadata"]["name"] == SETTINGS.spot_priority_class
        assert spot["value"] < on_demand["value"]
        assert spot["preemptionPolicy"] == "Never"
        # With gpulab's market, reclaiming is the market's (after its warning), not the scheduler's.
        assert on_demand["preemptionPolicy"] == ("Never" if market else "PreemptLowerPriority")


def test_values_yaml_round_trips_into_the_same_pods() -> None:
    # What `gpulab kubernetes values` prints is what an operator pastes into values.yaml.
    values = yaml.safe_load(yaml.safe_dump(z2jh_values(CATALOG, SETTINGS)))
    profiles = values["singleuser"]["profileList"]
    choice = {"profile": "a100-80g", "gpus": "2", "dataset-sklearn-toy": "yes"}
    assert build_pod(profiles, choice) == build_pod(PROFILES, choice)
    pre = values["prePuller"]["extraImages"]
    assert {f"{i['name']}:{i['tag']}" for i in pre.values()} == {
        i.docker_image for i in CATALOG.images.values()
    }


# zero-to-jupyterhub's own toleration for its dedicated user nodes (scheduling.userPods), which
# the chart puts in c.KubeSpawner.tolerations together with singleuser.extraTolerations.
Z2JH_USER_TOLERATION = {
    "key": "hub.jupyter.org/dedicated",
    "operator": "Equal",
    "value": "user",
    "effect": "NoSchedule",
}


def test_gpu_pods_tolerate_the_gpu_taint_and_no_gpu_pods_still_land_on_cpu_nodes() -> None:
    values = z2jh_values(CATALOG, SETTINGS)
    tolerations = [Z2JH_USER_TOLERATION, *values["singleuser"]["extraTolerations"]]
    gpu_taint = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
    for gpu in CATALOG.gpu_types:
        pod = build_pod(
            values["singleuser"]["profileList"], {"profile": gpu}, tolerations=tolerations
        )
        assert gpu_taint in pod["spec"]["tolerations"]
        # The chart's own toleration is kept: the profiles never replace the list.
        assert Z2JH_USER_TOLERATION in pod["spec"]["tolerations"]
    # A toleration only permits: the no-GPU pod is held to the CPU pool by its node selector.
    pod = build_pod(values["singleuser"]["profileList"], {}, tolerations=tolerations)
    assert pod["spec"]["nodeSelector"] == {TYPE_LABEL: SETTINGS.no_gpu_label_value}
    assert GPU not in limits(pod)
    # An operator whose GPU nodes carry no taint turns it off.
    off = z2jh_values(CATALOG, make_settings(tolerate_gpu_taint=False))
    assert "extraTolerations" not in off["singleuser"]


def test_the_operators_node_selector_is_kept_beside_the_gpu_type() -> None:
    # singleuser.nodeSelector (c.KubeSpawner.node_selector) is merged with, not replaced by, the
    # profile's GPU-type selector.
    pool = {"cloud.google.com/gke-nodepool": "users"}
    pod = build_pod(PROFILES, {"profile": "a100-80g"}, node_selector=dict(pool))
    assert pod["spec"]["nodeSelector"] == {**pool, TYPE_LABEL: "a100-80g"}


def test_an_operators_own_gpu_type_label_is_used() -> None:
    settings = make_settings(
        gpu_type_label="example.com/accelerator", gpu_resource="example.com/gpu"
    )
    pod = build_pod(profile_list(CATALOG, settings), {"profile": "h100-80g", "gpus": "2"})
    assert pod["spec"]["nodeSelector"] == {"example.com/accelerator": "h100-80g"}
    assert limits(pod)["example.com/gpu"] == 2 and GPU not in limits(pod)


@pytest.mark.parametrize("pricing", ["on-demand", "spot"])
def test_labels_and_annotations_carry_what_billing_needs(pricing: str) -> None:
    gpu, n, image = "a100-80g", 2, "pytorch"
    pod = build_pod(PROFILES, {"profile": gpu, "gpus": str(n), "image": image, "pricing": pricing})
    labels, notes = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    gt = CATALOG.gpu_types[gpu]
    assert labels[L_GPU_TYPE] == gpu and labels[L_GPU_COUNT] == str(n)
    assert labels[L_PRICING] == pricing and labels[L_IMAGE] == image
    assert labels[L_APP] == "jupyterlab"
    assert notes[A_MODE] == f"{gt.display_name} x{n}"
    assert notes[A_CURRENCY] == CATALOG.currency
    assert Decimal(notes[A_PRICE]) == gt.on_demand_price * n
    # KubeSpawner's own labels stay, so `kubectl get pods -l component=singleuser-server` works.
    assert labels["component"] == "singleuser-server"
    assert pod["metadata"]["annotations"]["hub.jupyter.org/username"] == "alice@example.org"
    # The spawner reports the same mode through the environment.
    assert env(pod)["GPULAB_PRICING"] == pricing and env(pod)["GPULAB_GPU_COUNT"] == str(n)
    # Label values are what Kubernetes accepts (the API server refuses the pod otherwise).
    for key, value in labels.items():
        assert len(value) <= 63, key


def test_make_pod_called_directly_with_a_profiles_override() -> None:
    # kubespawner.objects.make_pod itself, with the arguments of a 4-card spot override:
    # the same resources and scheduling without a spawner in between.
    gpu, n = "h100-80g", CATALOG.max_gpus_per_server
    profile = next(p for p in PROFILES if p["slug"] == gpu)
    o = profile["profile_options"]["gpus"]["choices"][str(n)]["kubespawner_override"]
    spot = profile["profile_options"]["pricing"]["choices"]["spot"]["kubespawner_override"]
    base = profile["kubespawner_override"]
    pod = make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image=CATALOG.images["pytorch"].docker_image,
        image_pull_policy="IfNotPresent",
        node_selector=base["node_selector"],
        uid=base["uid"],
        allow_privilege_escalation=base["allow_privilege_escalation"],
        container_security_context=base["container_security_context"],
        cpu_limit=o["cpu_limit"],
        cpu_guarantee=o["cpu_guarantee"],
        mem_limit=o["mem_limit"],
        mem_guarantee=o["mem_guarantee"],
        extra_resource_limits=o["extra_resource_limits"],
        extra_resource_guarantees=o["extra_resource_guarantees"],
        priority_class_name=spot["priority_class_name"],
        labels={**base["extra_labels"], **o["extra_labels"], **spot["extra_labels"]},
    )
    # As the API server would receive it (make_pod leaves some parts as plain dicts).
    pod = as_json(pod)
    assert limits(pod)[GPU] == n and requests(pod)[GPU] == n
    assert float(limits(pod)["cpu"]) == CATALOG.gpu_types[gpu].cpus_per_card * n
    assert pod["spec"]["nodeSelector"] == {TYPE_LABEL: gpu}
    assert pod["spec"]["priorityClassName"] == SETTINGS.spot_priority_class
    ctx = container(pod)["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == SETTINGS.run_as_uid != 0
    assert pod["metadata"]["labels"][L_PRICING] == "spot"
    assert pod["metadata"]["labels"][L_GPU_COUNT] == str(n)


@pytest.mark.parametrize(("gpu", "n"), [("none", 0), ("rtx-4090", 1), ("h100-80g", 3)])
def test_dev_shm_is_a_memory_volume_sized_from_the_memory_limit(gpu: str, n: int) -> None:
    # PyTorch DataLoader workers pass batches through /dev/shm; the runtime's 64 MB breaks them.
    choice = {"profile": gpu, **({"gpus": str(n)} if n else {})}
    pod = build_pod(PROFILES, choice)
    assert mounts(pod)["/dev/shm"]["name"] == "dshm"
    empty_dir = volumes(pod)["dshm"]["emptyDir"]
    assert empty_dir["medium"] == "Memory"
    assert int(empty_dir["sizeLimit"]) == int(int(limits(pod)["memory"]) * SETTINGS.shm_fraction)
    # The user's home is still there, and still writable.
    home = mounts(pod)["/home/jovyan"]
    assert home["name"] in volumes(pod) and not home.get("readOnly")
