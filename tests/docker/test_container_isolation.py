"""What a user can do from inside their container, against a real Docker Engine: their
processes are capped (pids, open files) by the catalog, a module planted in their home does not
take over the hub's agent, and what the hub observes in the container is what billing gets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from docker_helpers import container_of, start_docker_hub
from harness import Hub, wait_for

from gpulab.catalog import load_catalog

HOME = Path("/home/jovyan")
PLANTED = "open('/home/jovyan/hijacked', 'w').write('the agent ran my code')\n"


@pytest.fixture(scope="module")
def dhub(module_hub_factory, docker, catalog: Path) -> Hub:
    return start_docker_hub(
        module_hub_factory,
        docker,
        "isolation-docker",
        catalog,
        "--SpotMarket.warning_seconds=3",
        "--SpotMarket.tick_interval=0.5",
        "--ActivityObserver.interval=0.5",
    )


def test_the_catalogs_process_and_file_limits_hold_in_the_container(dhub: Hub, docker) -> None:
    user = dhub.create_user()
    dhub.spawn_ready(user, {"gpu": "none"})
    limits = load_catalog().limits
    host = container_of(docker, dhub, user).attrs["HostConfig"]
    assert host["PidsLimit"] == limits.pids
    assert {"Name": "nofile", "Soft": limits.open_files, "Hard": limits.open_files} in host[
        "Ulimits"
    ]
    with dhub.kernel(user) as k:
        assert (
            int(k.execute("import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[1])"))
            == limits.open_files
        )
        out = k.execute(
            "import subprocess\n"
            "procs = []\n"
            "try:\n"
            f"    for _ in range({limits.pids + 50}):\n"
            "        procs.append(subprocess.Popen(['sleep', '60']))\n"
            "except OSError as e:\n"
            "    print('refused after', len(procs))\n"
            "for p in procs:\n"
            "    p.kill(); p.wait()\n"
        )
    assert out.startswith("refused after"), out
    assert int(out.split()[2]) < limits.pids


def test_a_json_module_in_the_home_does_not_hijack_the_agent(dhub: Hub, docker) -> None:
    user = dhub.create_user()
    r = dhub.api("PUT", f"/gpulab/spot/settings/{user}", json={"checkpoint_command": "echo saved"})
    assert r.status_code == 200, r.text
    assert dhub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.30"}).ok
    try:
        dhub.spawn_ready(user, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.40"})
        with dhub.kernel(user) as k:
            # What the agent imports, planted where a `python -c` run in the home would find it.
            k.execute(f"open('json.py', 'w').write({PLANTED!r})")
        assert dhub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": "0.60"}).ok

        def done():
            recs = [
                p
                for p in dhub.api("GET", "/gpulab/spot/preemptions").json()["preemptions"]
                if p["user"] == user
                and (p.get("checkpoint") or {}).get("state") in ("done", "failed")
            ]
            return recs[-1] if recs else None

        record = wait_for(done, 60, 0.5, "the checkpoint's result")
        assert record["checkpoint"]["state"] == "done" and record["checkpoint"]["exit_code"] == 0
        container = container_of(docker, dhub, user)
        found = container.exec_run(["sh", "-c", f"ls {HOME}"], user="1000").output.decode()
        assert "json.py" in found and "hijacked" not in found
    finally:
        dhub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": None})
        if dhub.server(user) is not None:
            dhub.stop_server(user)


def test_the_hub_observes_a_detached_process_in_the_container(dhub: Hub) -> None:
    from billing.client import Billing

    user = dhub.create_user()
    dhub.spawn_ready(user, {"gpu": "none"})
    with dhub.kernel(user) as k:
        k.execute(
            "import subprocess\n"
            "subprocess.Popen(['sh', '-c', 'sleep 8'], start_new_session=True,\n"
            "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
        )
    t0 = time.time()
    billing = Billing(dhub)

    def observed() -> float:
        return sum(
            o["observed_seconds"] for s in billing.usage(user)["servers"] for o in s["observed"]
        )

    secs = wait_for(lambda: (s := observed()) >= 6 and s, 40, 0.5, "the detached sleep observed")
    assert secs <= time.time() - t0 + 5
