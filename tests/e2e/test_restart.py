"""The hub killed with SIGKILL and restarted keeps every allocation and leaks nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from harness import Hub, wait_for

from gpulab.catalog import load_catalog
from gpulab.spawners.local.spawner import pid_alive
from gpulab.spawners.node.inventory import parse_simulate_spec, simulated_devices


def pool_holders(hub: Hub) -> dict[str, str]:
    return {g["uuid"]: g["holder"] for g in hub.pool()["gpus"] if g["held"]}


def test_sigkill_and_restart_keeps_servers_and_gpus(hub_factory) -> None:
    hub = hub_factory(simulate="A100-80G:2,RTX-4090:1")
    gpu_user, cpu_user, later = (hub.create_user() for _ in range(3))
    hub.spawn_ready(gpu_user, {"gpu": "a100-80g"})
    hub.spawn_ready(cpu_user, {"gpu": "none"})
    with hub.kernel(gpu_user) as k:
        k.execute("open('before-crash.txt', 'w').write('saved')")
    holders_before = pool_holders(hub)
    gpu_uuid = hub.server(gpu_user)["state"]["allocation"]["uuids"][0]
    pids = {u: hub.server(u)["state"]["pid"] for u in (gpu_user, cpu_user)}

    hub.kill()
    # The servers outlive the hub, as they would in a real crash.
    for pid in pids.values():
        os.kill(pid, 0)
    hub.start()

    assert pool_holders(hub) == holders_before == {gpu_uuid: f"{gpu_user}/"}
    for u, pid in pids.items():
        s = hub.server(u)
        assert s["ready"] and s["state"]["pid"] == pid
    with hub.kernel(gpu_user) as k:
        assert k.execute("print(open('before-crash.txt').read())").strip() == "saved"
        assert k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() == (
            gpu_uuid
        )
    # The other A100 is still free, and only it.
    hub.spawn_ready(later, {"gpu": "a100-80g"})
    later_uuid = hub.server(later)["state"]["allocation"]["uuids"][0]
    assert later_uuid != gpu_uuid
    r = hub.spawn(hub.create_user(), {"gpu": "a100-80g"})
    assert r.status_code == 409

    for u in (gpu_user, cpu_user, later):
        hub.stop_server(u)
    assert pool_holders(hub) == {}


def test_orphans_of_a_crash_mid_spawn_are_stopped_and_freed(hub_factory) -> None:
    """A hub killed between starting a server and saving its state leaves a ledger record (and a
    process) that no server claims. On restart the record is swept: process killed, card freed."""
    hub = hub_factory(simulate="A100-80G:1")
    hub.stop()
    data = hub.data_dir

    hub_id = (data / "hub-id").read_text().strip()
    catalog = load_catalog()
    card = simulated_devices(parse_simulate_spec("A100-80G:1", catalog), catalog, 0)[0].uuid
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={**os.environ, "GPULAB_ALLOCATION_ID": "deadbeef", "GPULAB_HUB_ID": hub_id},
    )
    ledger = {
        "allocations": [
            {
                "alloc_id": "deadbeef",
                "owner": "ghost/",
                "gpu_type": "a100-80g",
                "uuids": [card],
                "created": time.time(),
                "pid": orphan.pid,
            }
        ]
    }
    (data / "allocations.json").write_text(json.dumps(ledger))
    hub.start()
    try:
        # Until the sweep runs the card counts as held: never handed out twice.
        wait_for(lambda: orphan.poll() is not None, timeout=30, what="the orphan to be killed")
        wait_for(lambda: hub.free("a100-80g") == 1, timeout=10, what="the card to be freed")
        user = hub.create_user()
        hub.spawn_ready(user, {"gpu": "a100-80g"})
        hub.stop_server(user)
    finally:
        if orphan.poll() is None:
            orphan.kill()


def test_server_that_exits_early_reports_its_last_log_lines(hub_factory) -> None:
    hub = hub_factory(
        simulate="RTX-4090:1",
        extra_args=['--GpuLocalSpawner.args=["--ServerApp.root_dir=/no/such/dir"]'],
    )
    user = hub.create_user()
    r = hub.spawn(user, {"gpu": "rtx-4090"})
    assert r.status_code == 500, r.text
    message = r.json()["message"]
    assert "exited with code" in message and "before it answered" in message
    assert "/no/such/dir" in message  # the server's own complaint, from its log
    assert "InvalidStateError" not in message
    assert hub.free("rtx-4090") == 1
    assert hub.server(user) is None


def test_sigkill_in_the_middle_of_a_spawn_loses_nothing(hub_factory) -> None:
    """Kill the hub while a server is starting. After the restart the card is either held by a
    server the hub knows (and that works) or free again; it is never held by nobody."""
    import threading

    hub = hub_factory(simulate="A100-80G:1")
    user = hub.create_user()
    threading.Thread(target=lambda: hub.spawn(user, {"gpu": "a100-80g"}), daemon=True).start()
    wait_for(
        lambda: (s := hub.server(user)) is not None and s["pending"] == "spawn",
        timeout=30,
        interval=0.01,
        what="the spawn to start",
    )
    ledger = hub.data_dir / "allocations.json"

    def server_pid() -> int | None:
        # The record is saved with "pid": null when the card is taken and gets the pid once the
        # server process exists: kill the hub after that, so that there is a process to check on
        # (killed before that, a server forked meanwhile is on record nowhere and outlives all).
        try:
            return json.loads(ledger.read_text())["allocations"][0]["pid"]
        except (OSError, ValueError, LookupError):
            return None

    recorded_pid = wait_for(server_pid, 30, 0.005, "the server's pid in the ledger")
    hub.kill()
    hub.start()

    def settled() -> bool:
        server = hub.server(user)
        held = {g["uuid"]: g["holder"] for g in hub.pool()["gpus"] if g["held"]}
        if server is not None and server["ready"]:
            return held == {server["state"]["allocation"]["uuids"][0]: f"{user}/"}
        return server is None and held == {}

    wait_for(settled, timeout=60, what="a consistent pool after the restart")
    if hub.server(user) is None:
        # The half-started server was an orphan: it must be gone, not running unseen.
        wait_for(lambda: not pid_alive(recorded_pid), timeout=10, what="the orphan to die")
        hub.spawn_ready(user, {"gpu": "a100-80g"})
    with hub.kernel(user) as k:
        assert k.execute("import os; print(os.environ['GPULAB_GPU_TYPE'])").strip() == "a100-80g"
    hub.stop_server(user)
    assert hub.free("a100-80g") == 1
