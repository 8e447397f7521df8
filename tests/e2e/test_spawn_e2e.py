"""End to end through a real hub: spawn, run code in a real kernel, check GPUs, datasets, files."""

from __future__ import annotations

import pytest
from harness import Hub, KernelError


def held_uuids(hub: Hub, user: str) -> list[str]:
    state = hub.server(user)["state"]
    return state["allocation"]["uuids"]


def test_gpu_server_sees_exactly_its_allocated_gpu(hub: Hub, user: str) -> None:
    free_before = hub.free("a100-80g")
    hub.spawn_ready(user, {"gpu": "a100-80g", "gpus": 1, "datasets": ["sklearn-toy"]})
    uuids = held_uuids(hub, user)
    assert len(uuids) == 1 and uuids[0].startswith("GPU-SIM-")
    assert hub.free("a100-80g") == free_before - 1
    card = next(g for g in hub.pool()["gpus"] if g["uuid"] == uuids[0])
    assert card["held"] and card["simulated"] and card["holder"] == f"{user}/"

    with hub.kernel(user) as k:
        assert k.execute('import os; print(os.environ["CUDA_VISIBLE_DEVICES"])').strip() == uuids[0]
        assert k.execute('print(os.environ["NVIDIA_VISIBLE_DEVICES"])').strip() == uuids[0]
        assert k.execute('print(os.environ["GPULAB_MODE"])').strip() == "A100-80G x1 (simulated)"


def test_no_gpu_mode_hides_every_gpu(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none"})
    assert held_uuids(hub, user) == []
    with hub.kernel(user) as k:
        env = k.execute(
            "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']), "
            "os.environ['NVIDIA_VISIBLE_DEVICES'])"
        ).split()
    assert env == ["''", "void"]


def test_datasets_are_visible_and_read_only(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "none", "datasets": ["sklearn-toy", "sklearn-images"]})
    with hub.kernel(user) as k:
        listing = k.execute(
            "import os; print(sorted(os.listdir(os.path.expanduser('~/datasets'))))"
        ).strip()
        assert listing == "['sklearn-images', 'sklearn-toy']"
        rows = k.execute(
            "import csv; f = open(os.path.expanduser('~/datasets/sklearn-toy/iris.csv'));"
            "print(sum(1 for _ in csv.reader(f)))"
        ).strip()
        assert int(rows) == 151  # header + 150 flowers
        with pytest.raises(KernelError, match=r"(Read-only file system|Permission denied)"):
            k.execute("open(os.path.expanduser('~/datasets/sklearn-toy/new.txt'), 'w')")
        with pytest.raises(KernelError, match=r"(Read-only file system|Permission denied)"):
            k.execute("open(os.path.expanduser('~/datasets/sklearn-toy/iris.csv'), 'a')")


def test_files_survive_gpu_to_no_gpu_to_gpu(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    with hub.kernel(user) as k:
        k.execute("open('model.txt', 'w').write('epoch 3')")
    hub.stop_server(user)

    hub.spawn_ready(user, {"gpu": "none"})
    with hub.kernel(user) as k:
        assert k.execute("print(open('model.txt').read())").strip() == "epoch 3"
        k.execute("open('model.txt', 'a').write(', debugged')")
    hub.stop_server(user)

    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    with hub.kernel(user) as k:
        assert k.execute("print(open('model.txt').read())").strip() == "epoch 3, debugged"
        assert (
            k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip()
            == (held_uuids(hub, user)[0])
        )


def test_stop_releases_the_gpu(hub: Hub, user: str) -> None:
    before = hub.free("a100-80g")
    hub.spawn_ready(user, {"gpu": "a100-80g"})
    assert hub.free("a100-80g") == before - 1
    hub.stop_server(user)
    assert hub.free("a100-80g") == before
