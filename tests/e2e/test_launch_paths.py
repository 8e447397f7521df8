"""Both ways a local server starts: forked from the pre-warmed fork server, or as a new process."""

from __future__ import annotations

import os
import signal

import pytest
from harness import Hub, KernelError, wait_for

from gpulab.spawners.local.spawner import pid_alive


def forkserver_pid(hub: Hub) -> int:
    return int((hub.data_dir / "run" / "forkserver.pid").read_text())


def test_forked_servers_get_their_own_user_environment(hub: Hub) -> None:
    a, b = hub.create_user(), hub.create_user()
    try:
        hub.spawn_ready(a, {"gpu": "a100-80g"})
        hub.spawn_ready(b, {"gpu": "none"})
        with hub.kernel(a) as ka, hub.kernel(b) as kb:
            code = (
                "import os; print(os.environ['JUPYTERHUB_USER'], os.getcwd(), os.environ['HOME'])"
            )
            user_a, cwd_a, home_a = ka.execute(code).split()
            user_b, cwd_b, home_b = kb.execute(code).split()
            assert (user_a, user_b) == (a, b)
            assert cwd_a == home_a and home_a.endswith(f"/users/{a}")
            assert cwd_b == home_b and home_b.endswith(f"/users/{b}")
            token_a = ka.execute("print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
            assert token_a not in kb.execute("print(sorted(os.environ.values()))")
            # The server process itself runs in the user's session and home.
            pid_a = hub.server(a)["state"]["pid"]
            assert os.readlink(f"/proc/{pid_a}/cwd") == home_a
            assert open(f"/proc/{pid_a}/comm").read().strip() == "jupyter-server"
    finally:
        for u in (a, b):
            if hub.server(u):
                hub.stop_server(u)


def test_a_dead_fork_server_is_replaced(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    hub.stop_server(user)
    old = forkserver_pid(hub)
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not pid_alive(old), timeout=10, what="the fork server to die")
    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    assert forkserver_pid(hub) != old
    with hub.kernel(user) as k:
        assert k.execute("import os; print(os.environ['GPULAB_GPU_TYPE'])").strip() == "rtx-4090"


@pytest.fixture(scope="module")
def popen_hub(module_hub_factory):
    return module_hub_factory(
        "popen", simulate="A100-80G:1", extra_args=["--GpuLocalSpawner.use_forkserver=False"]
    )


def test_new_process_path_pins_gpus_and_mounts_datasets(popen_hub: Hub) -> None:
    user = popen_hub.create_user()
    popen_hub.spawn_ready(user, {"gpu": "a100-80g", "datasets": ["sklearn-toy"]})
    try:
        uuid = popen_hub.server(user)["state"]["allocation"]["uuids"][0]
        with popen_hub.kernel(user) as k:
            assert k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() == uuid
            assert "iris.csv" in k.execute(
                "print(os.listdir(os.path.expanduser('~/datasets/sklearn-toy')))"
            )
            with pytest.raises(KernelError, match=r"(Read-only file system|Permission denied)"):
                k.execute("open(os.path.expanduser('~/datasets/sklearn-toy/x'), 'w')")
        assert not (popen_hub.data_dir / "run" / "forkserver.sock").exists()
    finally:
        popen_hub.stop_server(user)
    assert popen_hub.free("a100-80g") == 1
