"""Training jobs over many nodes on a real multi-engine Swarm (issue 26, part J5).

Three Docker Engines, each in its own network namespace with one simulated A100 (tests/
swarm_helpers.py), a root hub with the Swarm spawner and shared homes. PyTorch reaches the task
containers as a read-only catalog dataset: the hub's own venv site-packages (the test image's
Python is the venv's, 3.11.2, so the CPU wheel of torch==2.13.0 installed there imports as is;
faster than building and loading a 1.4 GB image into every engine). The job runs
``tests/job_scripts/train.py`` under ``torchrun`` with the gloo backend on CPU, one process per
node, over the job's own overlay network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO, Hub, free_port, wait_for
from jobs_helpers import run_reference
from swarm_helpers import (
    SwarmCluster,
    remove_hub_services,
    shared_homes_dir,
    swarm_hub_settings,
)

pytestmark = pytest.mark.xdist_group("swarm")

SWARM_NODES = [("a100-80g", 1), ("a100-80g", 1), ("a100-80g", 1)]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
SITE = SITE / "site-packages"
TRAIN = REPO / "tests" / "job_scripts" / "train.py"
STEPS, EVERY, SLEEP = 40, 5, 0.5
TRAIN_ARGS = f"--steps {STEPS} --ckpt-every {EVERY} --sleep {SLEEP}"
COMMAND = f"PYTHONPATH=/datasets/pylibs python3 -m torch.distributed.run train.py {TRAIN_ARGS}"
FINAL = re.compile(rb"final loss (\S+)")


@pytest.fixture(scope="module")
def jobs_catalog(catalog: Path) -> Path:
    """The test catalog with the venv's site-packages as the dataset ``pylibs``."""
    out = catalog.with_name("swarm-jobs.toml")
    out.write_text(
        catalog.read_text() + '\n[datasets.pylibs]\ndisplay_name = "PyTorch 2.13 (CPU)"\n'
        'description = "torch==2.13.0 and its dependencies, for the job tests"\n'
        f'size = "1 GB"\nlicense = "BSD-3-Clause"\nsource = "{SITE}"\n'
    )
    return out


@pytest.fixture(scope="module")
def homes(tmp_path_factory) -> Path:
    return shared_homes_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def jhub(swarm_cluster: SwarmCluster, module_hub_factory, jobs_catalog: Path, homes: Path) -> Hub:
    return module_hub_factory(
        "jobhub",
        on_stop=lambda h: remove_hub_services(swarm_cluster, h.data_dir),
        **swarm_hub_settings(swarm_cluster, jobs_catalog, homes),
    )


@pytest.fixture(scope="module")
def reference_loss(tmp_path_factory) -> bytes:
    """The final loss of the same training, two processes, never interrupted, run here."""
    work = Path(tmp_path_factory.mktemp("ddp-reference"))
    env = {**os.environ, "GPULAB_CHECKPOINT_DIR": str(work / "ckpt"), "GPULAB_RESUME": ""}
    # torchrun's static rendezvous on a port of this worker's own (harness.free_port: below the
    # kernel's ephemeral range), not --standalone's: a port it picks free and binds a moment
    # later can be taken meanwhile on a busy machine, and a rank then waits for ever.
    out = run_reference(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"),
            *("--master-addr", "127.0.0.1", "--master-port", str(free_port())),
            *("--nproc-per-node", "2", str(TRAIN)),
            *f"--steps {STEPS} --ckpt-every {EVERY}".split(),
        ],
        work,
        env,
    )
    return FINAL.findall(out.encode())[-1]


def user_with_script(hub: Hub, homes: Path) -> tuple[str, str]:
    """A user with train.py in their shared home, and a token of theirs."""
    user = hub.create_user()
    home = homes / user
    home.mkdir(mode=0o700)
    shutil.copy(TRAIN, home / "train.py")
    for path in (home, home / "train.py"):
        os.chown(path, 1000, 1000)
    r = hub.api("POST", f"/users/{user}/tokens", json={"note": "jobs test"})
    assert r.status_code in (200, 201), r.text
    return user, r.json()["token"]


def submit(hub: Hub, user: str, token: str, **spec) -> dict:
    body = {"command": COMMAND, "gpu": "a100-80g", "gpus": 1, "image": "base"} | spec
    r = hub.api("POST", f"/gpulab/users/{user}/jobs", token=token, json=body)
    assert r.status_code == 201, r.text
    return r.json()


def job(hub: Hub, user: str, token: str, job_id: int) -> dict:
    r = hub.api("GET", f"/gpulab/users/{user}/jobs/{job_id}", token=token)
    assert r.status_code == 200, r.text
    return r.json()


def log(hub: Hub, user: str, token: str, job_id: int) -> bytes:
    r = hub.api("GET", f"/gpulab/users/{user}/jobs/{job_id}/log", token=token)
    assert r.status_code == 200, r.text
    return r.content


def rank_services(cluster: SwarmCluster, job_id: int) -> list[dict]:
    return [
        s
        for s in cluster.services()
        if (s["Spec"].get("Labels") or {}).get("org.gpulab.job") == str(job_id)
    ]


@pytest.mark.timeout(900)  # with its reference training, run first (a module fixture)
def test_ddp_over_two_nodes_survives_a_node_failure(
    jhub: Hub, swarm_cluster: SwarmCluster, homes: Path, reference_loss: bytes
) -> None:
    """Issue 26, "many nodes" and "the same for node failure": a 2-node x 1-card job runs
    train.py under torchrun (gloo, CPU) as a gang on two Swarm nodes, on its own overlay
    network; a node of the gang dies mid-run (its engine SIGKILLed); the attempt ends
    node_failed, the job is requeued by itself, starts again on the two nodes left, resumes from
    the last checkpoint (GPULAB_RESUME) and ends with the final loss of an uninterrupted run.
    Fails on the old code: there were no jobs, no gangs (a server held one node's cards) and
    nothing requeued a run whose node died."""
    user, token = user_with_script(jhub, homes)
    j = submit(jhub, user, token, nodes=2, datasets=["pylibs"], name="ddp")
    jid = j["id"]
    wait_for(
        lambda: b"step 10 " in log(jhub, user, token, jid),
        300,
        interval=1,
        what="the gang to train past step 10",
    )
    services = rank_services(swarm_cluster, jid)
    assert len(services) == 2
    nets = {n["Target"] for s in services for n in s["Spec"]["TaskTemplate"].get("Networks", [])}
    assert len(nets) == 1  # the job's own network, and only it
    net = swarm_cluster.manager_client().inspect_network(nets.pop())
    assert net["Name"] == f"gpulab-job-{jid}" and net["Attachable"] is False
    # Nothing but the job's own services joins it: a container asking for it is refused.
    intruder = subprocess.run(
        [
            *("docker", "-H", swarm_cluster.manager_url, "run", "--rm"),
            *("--network", net["Name"], swarm_cluster.image, "true"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert intruder.returncode != 0 and "attachable" in intruder.stderr, intruder.stderr
    # The gang's nodes: distinct; kill one that is not the manager.
    ids = [
        swarm_cluster.nodes.index(swarm_cluster.node_of(t["NodeID"])) + 1
        for t in _tasks(swarm_cluster, services)
    ]
    assert len(set(ids)) == 2
    victim = max(ids) if max(ids) != 1 else min(ids)
    swarm_cluster.kill_node(victim)
    wait_for(
        lambda: len(job(jhub, user, token, jid)["attempts"]) >= 2,
        240,
        interval=1,
        what="the job to be requeued and started again",
    )
    done = wait_for(
        lambda: (s := job(jhub, user, token, jid))["state"] in ("succeeded", "failed") and s,
        600,
        interval=2,
        what="the resumed job to end",
    )
    text = log(jhub, user, token, jid)
    assert done["state"] == "succeeded", (done, text[-3000:])
    assert done["attempts"][0]["end"] == "node_failed", done
    assert b"[gpulab] resuming from " in text  # the second attempt's GPULAB_RESUME
    assert FINAL.findall(text)[-1] == reference_loss
    # The network went with the attempts.
    assert not swarm_cluster.manager_client().networks(names=[f"gpulab-job-{jid}"])


def _tasks(cluster: SwarmCluster, services: list[dict]) -> list[dict]:
    client = cluster.manager_client()
    out = []
    for s in services:
        tasks = client.tasks(filters={"service": s["ID"], "desired-state": "running"})
        out += [t for t in tasks if t["Status"]["State"] == "running"]
    return out


def test_gang_that_cannot_be_placed_whole_waits_holding_nothing(
    jhub: Hub, swarm_cluster: SwarmCluster, homes: Path
) -> None:
    """Issue 26: "a gang that cannot be placed whole holds nothing": 3 nodes asked where at most
    2 nodes have a free card (another user's server holds the third's; after the node failure
    above, fewer still): the job waits, says why in its list, no service of it runs and no card
    is held. Fails on the old code: there were no jobs over several nodes at all."""
    other = jhub.create_user()
    jhub.spawn_ready(other, {"gpu": "a100-80g", "gpus": 1, "image": "base"}, timeout=180)
    user, token = user_with_script(jhub, homes)
    free = jhub.free("a100-80g")
    assert free <= 2
    jid = submit(jhub, user, token, nodes=3, command="true")["id"]

    def waiting() -> dict | None:
        s = job(jhub, user, token, jid)
        return s if s["state"] == "queued" and "3 nodes" in s["reason"] else None

    state = wait_for(waiting, 60, interval=0.5, what="the 3-node job to say why it waits")
    assert state["attempts"] == []
    assert rank_services(swarm_cluster, jid) == []
    assert jhub.free("a100-80g") == free
    listed = jhub.api("GET", f"/gpulab/users/{user}/jobs", token=token).json()["jobs"]
    assert [x["reason"] for x in listed if x["id"] == jid] == [state["reason"]]
    r = jhub.api("DELETE", f"/gpulab/users/{user}/jobs/{jid}", token=token)
    assert r.status_code == 202
    assert job(jhub, user, token, jid)["state"] == "cancelled"
    jhub.stop_server(other, timeout=120)
