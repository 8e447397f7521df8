"""The Docker spawner against a real Docker Engine, end to end through the hub API.

The single-user image is built locally without a registry (images/build-test-image.sh, cached by
its inputs). GPUs are simulated: their containers get the GPU environment only. The device request
a real GPU gets is checked on a created container (Docker can't start it without an NVIDIA
driver); on a machine with a GPU the `gpu` test starts one for real.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest
import requests
from billing.client import Billing, assert_billed_for_the_life_seen, kernel_seconds
from docker_helpers import (
    BROKEN_MESSAGE,
    GPULAB,
    LABEL_HUB,
    cleanup,
    container_of,
    hub_id,
    start_docker_hub,
)
from harness import Hub, KernelError, wait_for


@pytest.fixture(scope="module")
def dhub(module_hub_factory, docker, catalog: Path) -> Hub:
    return start_docker_hub(module_hub_factory, docker, "dhub", catalog)


@pytest.fixture
def duser(dhub: Hub):
    name = dhub.create_user()
    yield name
    if dhub.server(name) is not None:
        dhub.stop_server(name)


def held(hub: Hub, user: str) -> list[str]:
    return hub.server(user)["state"]["allocation"]["uuids"]


# ---- spawning ----------------------------------------------------------------------------------


def test_gpu_server_runs_in_a_locked_down_container_with_its_gpu(dhub, duser, docker) -> None:
    free = dhub.free("a100-80g")
    dhub.spawn_ready(duser, {"gpu": "a100-80g", "gpus": 1, "datasets": ["sklearn-toy"]})
    [card] = held(dhub, duser)
    assert card.startswith("GPU-SIM-") and dhub.free("a100-80g") == free - 1

    with dhub.kernel(duser) as k:
        env = json.loads(
            k.execute(
                "import os, json; print(json.dumps({k: os.environ.get(k) for k in "
                "['CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES', 'GPULAB_MODE', 'HOME']} "
                "| {'uid': os.getuid()}))"
            )
        )
    assert env == {
        "CUDA_VISIBLE_DEVICES": card,
        "NVIDIA_VISIBLE_DEVICES": card,
        "GPULAB_MODE": "A100-80G x1 (simulated)",
        "HOME": "/home/jovyan",
        "uid": 1000,
    }

    c = container_of(docker, dhub, duser)
    labels, host = c.attrs["Config"]["Labels"], c.attrs["HostConfig"]
    alloc = dhub.server(duser)["state"]["allocation"]
    assert labels["org.gpulab.allocation"] == alloc["alloc_id"]
    assert labels["org.gpulab.gpu-uuids"] == card
    assert labels["org.gpulab.gpus-simulated"] == "1"
    assert (labels["org.gpulab.pricing"], labels["org.gpulab.price-per-hour"]) == (
        "on-demand",
        "2.10",
    )
    # Simulated cards: the environment only, no device request Docker could not satisfy.
    assert not host.get("DeviceRequests")
    assert host["Privileged"] is False and host["CapDrop"] == ["ALL"]
    assert c.attrs["Config"]["User"] == "1000"
    assert not any("docker.sock" in b for b in host["Binds"])
    # Catalog: a100-80g has 12 CPUs and 96G per card; /dev/shm is the catalog's storage.shm_gb
    # (2), under half the memory (docker/spawner.py: scratch_sizes).
    assert host["CpuQuota"] == 12 * host["CpuPeriod"]
    assert host["Memory"] == 96 * 2**30 and host["ShmSize"] == 2 * 2**30


def test_kernel_in_a_container_is_billed(dhub, duser) -> None:
    """The image's reporter reaches the billing service from the containers' network (it listens
    on the host's address there, as the hub's API does): its kernel is on the statement to the
    second, and its GPU server is billed for the time it holds its card."""
    billing = Billing(dhub)
    t_spawn = time.time()
    dhub.spawn_ready(duser, {"gpu": "rtx-4090"})
    t0 = time.time()
    k = dhub.kernel(duser)
    t1 = time.time()
    assert k.execute("import time; time.sleep(6); print('done')").strip() == "done"
    t2 = time.time()
    k.close()
    t3 = time.time()

    def settled():
        usage = billing.usage(duser)
        last = [ts(x["last_seen"]) for s in usage["servers"] for x in s["kernels"]]
        return usage if last and max(last) >= t2 - 0.01 else None

    usage = wait_for(settled, 30, 0.5, "the container's kernel stop in the statement")
    assert_billed_for_the_life_seen(kernel_seconds(usage)[k.id], t0, t1, t2, t3)
    (server,) = usage["servers"]
    # A GPU server is billed for the seconds it holds its card (README "Billing"): the kernel's
    # seconds and the rest of the time the card was held, never more than the server has run.
    assert server["mode"] == "RTX 4090 x1"
    held = time.time() - t_spawn
    assert kernel_seconds(usage)[k.id] - 0.01 <= server["billed_seconds"] <= held, (server, held)
    per_s = Decimal("0.68") / 3600
    amount = Decimal(server["amount"]["exact"])
    assert abs(amount - Decimal(str(server["billed_seconds"])) * per_s) <= Decimal("0.000001")
    # The server still holds its card, so its charge grows between two reads: the balance is
    # read with the statement until both are of the same moment.

    def agreed() -> bool:
        (s,) = billing.usage(duser)["servers"]
        spent = Decimal(s["amount"]["exact"])
        return Decimal(billing.balance(duser)["balance"]["exact"]) == Decimal(10) - spent

    wait_for(agreed, 30, 0.2, "the balance to match the statement")


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_no_gpu_server_has_no_gpu_and_cpu_limits(dhub, duser, docker) -> None:
    dhub.spawn_ready(duser, {"gpu": "none"})
    assert held(dhub, duser) == []
    with dhub.kernel(duser) as k:
        out = k.execute(
            "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']), "
            "os.environ['NVIDIA_VISIBLE_DEVICES'], os.environ['GPULAB_MODE'])"
        )
    assert out.split(maxsplit=2) == ["''", "void", "No GPU\n"]
    host = container_of(docker, dhub, duser).attrs["HostConfig"]
    assert not host.get("DeviceRequests")
    assert host["CpuQuota"] == 2 * host["CpuPeriod"] and host["Memory"] == 4 * 2**30


def test_datasets_are_read_only_mounts_linked_from_home(dhub, duser) -> None:
    dhub.spawn_ready(duser, {"gpu": "none", "datasets": ["sklearn-toy", "sklearn-images"]})
    with dhub.kernel(duser) as k:
        assert k.execute("import os; print(sorted(os.listdir('/datasets')))").strip() == (
            "['sklearn-images', 'sklearn-toy']"
        )
        assert k.execute("print(os.readlink(os.path.expanduser('~/datasets/sklearn-toy')))") == (
            "/datasets/sklearn-toy\n"
        )
        rows = k.execute(
            "import csv; print(sum(1 for _ in csv.reader(open("
            "os.path.expanduser('~/datasets/sklearn-toy/iris.csv')))))"
        )
        assert int(rows) == 151
        for target in ("~/datasets/sklearn-toy/new.txt", "/datasets/sklearn-images/new.jpg"):
            with pytest.raises(KernelError, match="Read-only file system"):
                k.execute(f"open(os.path.expanduser({target!r}), 'w')")
        mounts = [
            m.split() for m in k.execute("print(open('/proc/mounts').read())").splitlines() if m
        ]
        for slug in ("sklearn-toy", "sklearn-images"):
            [fields] = [m for m in mounts if m[1] == f"/datasets/{slug}"]
            assert "ro" in fields[3].split(",")


def test_files_survive_gpu_to_no_gpu_to_gpu(dhub, duser, docker) -> None:
    dhub.spawn_ready(duser, {"gpu": "rtx-4090"})
    first = container_of(docker, dhub, duser).id
    with dhub.kernel(duser) as k:
        k.execute("open('model.txt', 'w').write('epoch 3')")
    dhub.stop_server(duser)

    dhub.spawn_ready(duser, {"gpu": "none"})
    assert container_of(docker, dhub, duser).id != first  # a new container, the same volume
    with dhub.kernel(duser) as k:
        assert k.execute("print(open('model.txt').read())") == "epoch 3\n"
        k.execute("open('model.txt', 'a').write(', debugged')")
    dhub.stop_server(duser)

    dhub.spawn_ready(duser, {"gpu": "rtx-4090"})
    with dhub.kernel(duser) as k:
        assert k.execute("print(open('model.txt').read())") == "epoch 3, debugged\n"
        assert (
            k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip()
            == (held(dhub, duser)[0])
        )


def test_progress_reports_the_container_steps(dhub, duser, docker) -> None:
    # The hub streams a spawn's progress (every step from the first) only while the spawn is
    # pending, and a container spawn can be over in a second. So the new container is paused as
    # soon as Docker starts it, before JupyterLab in it can listen: the spawn stays pending (a
    # paused container counts as running) until the stream is open, then it is let go.
    started = threading.Event()
    held: list = []
    events_feed = docker.events(
        decode=True,
        filters={"type": "container", "event": "start", "label": f"org.gpulab.user={duser}"},
    )

    def hold_the_container() -> None:
        for ev in events_feed:
            container = docker.containers.get(ev["id"])
            container.pause()
            held.append(container)
            started.set()
            return

    holder = threading.Thread(target=hold_the_container, daemon=True)
    holder.start()
    try:
        with ThreadPoolExecutor(1) as ex:
            post = ex.submit(dhub.spawn, duser, {"gpu": "rtx-4090", "datasets": ["sklearn-toy"]})
            wait_for(
                lambda: started.is_set() or post.done(), 120, what="Docker to start the container"
            )
            assert started.is_set(), post.result().text
            with dhub.api("GET", f"/users/{duser}/server/progress", stream=True) as resp:
                # The hub has taken the pending spawn's stream (its headers are here).
                held[0].unpause()
                events = [
                    json.loads(line[5:])
                    for line in resp.iter_lines(decode_unicode=True)
                    if line and line.startswith("data:")
                ]
            assert post.result().status_code in (201, 202)
    finally:
        events_feed.close()
        holder.join(10)
        for container in held:
            container.reload()
            if container.status == "paused":
                container.unpause()
    text = "\n".join(e.get("message", "") for e in events)
    for step in (
        "Allocated RTX 4090 x1 (simulated)",
        "Image base (gpulab-test-singleuser:",
        "is present on this node",
        "Mounting datasets read-only at /datasets: sklearn-toy",
        "Creating container gpulab-",
        "simulated GPUs: environment only",
        "Starting the container",
        "waiting for JupyterLab",
        "JupyterLab is ready",
    ):
        assert step in text, text
    assert events[-1].get("ready") is True, events


def test_switch_to_no_gpu_moves_the_container_and_keeps_files(dhub, duser, docker) -> None:
    dhub.spawn_ready(duser, {"gpu": "a100-80g"})
    old = container_of(docker, dhub, duser).id
    free = dhub.free("a100-80g")
    with dhub.kernel(duser) as k:
        k.execute("open('notes.txt', 'w').write('keep me')")
    r = dhub.api("POST", f"/gpulab/users/{duser}/switch", json={"gpu": "none"})
    assert r.status_code == 202, r.text
    wait_for(
        lambda: (s := dhub.server(duser)) and s["ready"] and held(dhub, duser) == [],
        timeout=60,
        what="the switched server",
    )
    assert container_of(docker, dhub, duser).id != old
    assert dhub.free("a100-80g") == free + 1
    with dhub.kernel(duser) as k:
        assert k.execute("print(open('notes.txt').read())") == "keep me\n"


# ---- failures ----------------------------------------------------------------------------------


def test_missing_image_is_refused_before_anything_is_held(dhub, duser, docker) -> None:
    free = dhub.free("a100-80g")
    r = dhub.spawn(duser, {"image": "pytorch", "gpu": "a100-80g"})
    assert r.status_code == 409, r.text
    assert "gpulab/pytorch:0.1.0 is not on this node" in r.json()["message"]
    assert "gpulab images" in r.json()["message"]
    assert dhub.free("a100-80g") == free
    assert dhub.server(duser) is None
    assert not docker.containers.list(all=True, filters={"label": f"org.gpulab.user={duser}"})


def test_missing_dataset_fails_the_spawn_and_frees_the_gpu(dhub, duser, docker) -> None:
    free = dhub.free("a100-80g")
    r = dhub.spawn(duser, {"gpu": "a100-80g", "datasets": ["gone"]})
    assert r.status_code == 500, r.text
    assert "Dataset gone is unavailable" in r.json()["message"]
    wait_for(lambda: dhub.server(duser) is None, 10, what="the failed server to be gone")
    assert dhub.free("a100-80g") == free
    assert not docker.containers.list(all=True, filters={"label": f"org.gpulab.user={duser}"})


def test_server_that_exits_fails_the_spawn_with_its_log(dhub, duser) -> None:
    free = dhub.free("a100-80g")
    r = dhub.spawn(duser, {"image": "broken", "gpu": "a100-80g"})
    assert r.status_code == 500, r.text
    message = r.json()["message"]
    assert "exited with code 3 before it answered" in message
    assert BROKEN_MESSAGE in message
    wait_for(lambda: dhub.server(duser) is None, 10, what="the failed server to be gone")
    assert dhub.free("a100-80g") == free


def test_dead_container_is_noticed_and_its_gpu_released(dhub, duser, docker) -> None:
    free = dhub.free("a100-80g")
    dhub.spawn_ready(duser, {"gpu": "a100-80g"})
    assert dhub.free("a100-80g") == free - 1
    container_of(docker, dhub, duser).kill()
    wait_for(lambda: dhub.server(duser) is None, 30, what="the hub to notice the dead container")
    assert dhub.free("a100-80g") == free
    # and it is cleaned up, so the next spawn starts fresh
    wait_for(
        lambda: not docker.containers.list(all=True, filters={"label": f"org.gpulab.user={duser}"}),
        30,
        what="the dead container to be removed",
    )


# ---- the form and the images command -----------------------------------------------------------


def login(hub: Hub) -> requests.Session:
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30)
    password = (hub.data_dir / "admin-password").read_text().strip()
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": "admin", "password": password, "_xsrf": s.cookies.get("_xsrf")},
        timeout=30,
    )
    assert r.status_code == 200, r.status_code
    return s


def test_form_offers_only_present_images(dhub) -> None:
    html = login(dhub).get(f"{dhub.url}/hub/spawn", timeout=30).text
    options = dict(re.findall(r'<option value="([a-z0-9-]+)"([^>]*)>', html))
    assert "disabled" not in options["base"] and "disabled" not in options["teaching"]
    for missing in ("pytorch", "sd-webui"):
        assert "disabled" in options[missing]
    assert "gpulab/pytorch:0.1.0 is not on this node" in html


def test_images_command_lists_present_and_missing(catalog: Path, test_image: str) -> None:
    out = subprocess.run(
        [GPULAB, "images", "--catalog", str(catalog), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 3, out.stderr  # something is missing
    rows = {r["slug"]: r for r in json.loads(out.stdout)}
    assert rows["base"]["present"] and rows["base"]["docker_image"] == test_image
    assert "jupyterhub==6.1.1" in rows["base"]["preloads"]["libraries"]
    assert not rows["pytorch"]["present"] and "gpulab images --build" in rows["pytorch"]["reason"]


def test_images_command_builds_only_what_it_has_a_dockerfile_for(catalog: Path) -> None:
    out = subprocess.run(
        [GPULAB, "images", "--catalog", str(catalog), "--build", "--all", "broken"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "no images/broken/Dockerfile; use --pull" in out.stderr
    out = subprocess.run(
        [GPULAB, "images", "--catalog", str(catalog), "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "unknown image nonsense; allowed: base, pytorch" in out.stderr


# ---- real GPU device requests ------------------------------------------------------------------


def test_real_gpu_device_request_names_exactly_the_allocated_cards(
    hub_factory, docker, catalog: Path
) -> None:
    """'always' gives simulated cards the request a real card gets: the container is created with
    it, and (without an NVIDIA driver) Docker refuses to start it; the spawn fails cleanly."""
    hub = start_docker_hub(
        hub_factory, docker, "hub", catalog, "--GpuDockerSpawner.gpu_device_requests=always"
    )
    user = hub.create_user()
    r = hub.spawn(user, {"gpu": "a100-80g", "gpus": 2})
    c = container_of(docker, hub, user)
    uuids = c.attrs["Config"]["Labels"]["org.gpulab.gpu-uuids"].split(",")
    assert len(uuids) == 2 and all(u.startswith("GPU-SIM-") for u in uuids)
    [req] = c.attrs["HostConfig"]["DeviceRequests"]
    assert req["Driver"] == "nvidia"
    assert sorted(req["DeviceIDs"]) == sorted(uuids)
    assert req["Capabilities"] == [["gpu"]]
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # No driver here: Docker can't start it, the spawn fails and both cards come back.
    assert r.status_code == 500 and "could not start the container" in r.text, r.text
    wait_for(lambda: hub.free("a100-80g") == 2, 10, what="the cards to be released")


@pytest.mark.gpu
def test_real_gpu_container_sees_exactly_its_card(tmp_path, hub_factory, docker, catalog):
    """On a GPU host with the NVIDIA container toolkit: the device request really pins the card."""
    from gpu_helpers import CUDA_UUID_CODE, this_gpu_catalog

    gpu_catalog = this_gpu_catalog(catalog, tmp_path / "catalog.toml")
    hub = hub_factory(
        on_stop=lambda h: cleanup(docker, h),
        simulate="none",
        cli=[GPULAB, "up", "--spawner", "docker", "--catalog", str(gpu_catalog)],
    )
    user = hub.create_user()
    hub.spawn_ready(user, {"gpu": "this-gpu", "gpus": 1})
    [card] = held(hub, user)
    [req] = container_of(docker, hub, user).attrs["HostConfig"]["DeviceRequests"]
    assert req["DeviceIDs"] == [card]
    with hub.kernel(user) as k:
        assert k.execute(CUDA_UUID_CODE).strip() == card
    hub.stop_server(user)


# ---- crash and restart (last: it restarts the module's hub) ------------------------------------


def test_sigkill_and_lost_ledger_recover_servers_and_gpus(dhub, docker) -> None:
    gpu_user, cpu_user, other = (dhub.create_user() for _ in range(3))
    dhub.spawn_ready(gpu_user, {"gpu": "a100-80g", "gpus": 1})
    dhub.spawn_ready(cpu_user, {"gpu": "none"})
    [card] = held(dhub, gpu_user)
    before = {c.name: c.id for c in (container_of(docker, dhub, u) for u in (gpu_user, cpu_user))}
    k = dhub.kernel(gpu_user)
    k.execute("open('before-crash.txt', 'w').write('written before')")

    dhub.kill()
    # Worst case: the ledger is gone too; the allocator rebuilds it from the running containers'
    # labels and the hub database.
    (dhub.data_dir / "allocations.json").unlink()
    dhub.start()

    assert dhub.server(gpu_user)["ready"] and dhub.server(cpu_user)["ready"]
    assert held(dhub, gpu_user) == [card]
    pool = dhub.pool()
    holder = next(g for g in pool["gpus"] if g["uuid"] == card)
    assert holder["held"] and holder["holder"] == f"{gpu_user}/"
    assert dhub.free("a100-80g") == 1
    after = {c.name: c.id for c in (container_of(docker, dhub, u) for u in (gpu_user, cpu_user))}
    assert after == before  # the same containers, never restarted
    # The restarted hub restarted the proxy too (dropping the websocket), but the server and its
    # kernel, with its state, are the same.
    r = requests.get(f"{k.base}/kernels/{k.id}", headers=k.headers, timeout=30)
    assert r.status_code == 200, r.text
    with dhub.kernel(gpu_user) as k2:
        assert k2.execute("print(open('before-crash.txt').read())") == "written before\n"
    ledger = json.loads((dhub.data_dir / "allocations.json").read_text())
    assert {a["owner"] for a in ledger["allocations"]} == {f"{gpu_user}/", f"{cpu_user}/"}

    # The held card is not handed out twice.
    r = dhub.spawn(other, {"gpu": "a100-80g", "gpus": 2})
    assert r.status_code == 409 and "1 of 2 free" in r.text, r.text
    dhub.stop_server(gpu_user)
    assert dhub.free("a100-80g") == 2
    dhub.stop_server(cpu_user)


def test_stray_container_of_an_interrupted_spawn_is_removed(dhub, duser, docker) -> None:
    """A container labelled for this hub whose allocation nobody holds (the hub died between
    creating it and recording the server) is removed by the reaper; real servers stay."""
    dhub.spawn_ready(duser, {"gpu": "none"})
    server = container_of(docker, dhub, duser)
    stray = docker.containers.run(
        server.image.id,
        ["sleep", "600"],
        detach=True,
        labels={LABEL_HUB: hub_id(dhub), "org.gpulab.allocation": uuid.uuid4().hex},
        name=f"gpulab-stray-{uuid.uuid4().hex[:6]}",
    )
    # The reaper runs every reconcile interval (30 s with jitter) and right after a hub start.
    dhub.kill()
    dhub.start()

    def gone() -> bool:
        try:
            stray.reload()
        except Exception:
            return True
        return False

    wait_for(gone, 30, what="the stray container to be removed")
    server.reload()
    assert server.status == "running" and dhub.server(duser)["ready"]
