"""Docker homes and scratch (issue 23, part B): a container's home is the user's bounded home on
the host (the home store's ext4 image, bind-mounted), so the kernel refuses a write past the
quota in the user's own code; /tmp and /dev/shm are tmpfs sized by the catalog and gone with the
container; files of an older named volume move into the bounded home once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from docker_helpers import LABEL_HUB, container_of, hub_id, start_docker_hub
from harness import Hub, catalog_with

from gpulab.spawners.storage.loopfs import can_loop_mount

MiB = 2**20
QUOTA = 64 * MiB  # free_gb = 0.0625
TMP = 32 * MiB  # tmp_gb = 0.03125
SHM = 64 * MiB  # shm_gb = 0.0625

FILL = """
import errno, os
n = 0
try:
    with open({path!r}, 'wb', buffering=0) as f:
        while n < {size}:
            n += f.write(b'x' * 2**20)
        os.fsync(f.fileno())
    print('wrote', n)
except OSError as e:
    print(errno.errorcode[e.errno], n)
"""


@pytest.fixture(scope="module")
def small_catalog(catalog: Path) -> Path:
    return catalog_with(
        catalog.with_name("small-storage.toml"),
        catalog,
        free_gb=0.0625,
        max_gb=1,
        tmp_gb=0.03125,
        shm_gb=0.0625,
    )


@pytest.fixture(scope="module")
def shub(module_hub_factory, docker, small_catalog: Path, tmp_path_factory) -> Hub:
    why_not = can_loop_mount(Path(tmp_path_factory.mktemp("probe")) / "probe")
    if why_not:
        pytest.skip(f"bounded homes need loop mounts: {why_not}")
    return start_docker_hub(module_hub_factory, docker, "shub", small_catalog)


def fill(hub: Hub, user: str, path: str, size: int) -> tuple[str, int]:
    with hub.kernel(user) as k:
        code, n = k.execute(FILL.format(path=path, size=size)).split()
    return code, int(n)


def test_a_write_past_the_quota_fails_in_the_users_code_and_nobody_else_notices(
    shub: Hub, docker
) -> None:
    """Issue 23: "a write past the quota fails with EDQUOT/ENOSPC in the user's own code; the hub,
    billing and other users never notice" (Docker), and the attack "fill the node's disk through
    the home". Fails on the old code: the home was a named volume on the node's disk and the
    256 MiB went through."""
    attacker, other = shub.create_user(), shub.create_user()
    shub.spawn_ready(attacker, {"gpu": "none"})
    shub.spawn_ready(other, {"gpu": "none"})
    code, wrote = fill(shub, attacker, "big", 256 * MiB)

    assert code in ("ENOSPC", "EDQUOT") and wrote <= QUOTA, (code, wrote)
    # What the node's disk holds for this home: its image's allocated blocks, about the quota.
    image = shub.data_dir / "storage" / "images" / f"{attacker}.img"
    assert os.stat(image).st_blocks * 512 < QUOTA + 16 * MiB
    # The hub answers, the attacker's server still runs, another user writes as ever.
    assert shub.api("GET", f"/users/{attacker}").json()["server"]
    with shub.kernel(other) as k:
        assert k.execute("print(open('mine.txt', 'w').write('fine'))").strip() == "4"
    # The bounded home is a bind of the host folder the hub measures, not a volume.
    mounts = container_of(docker, shub, attacker).attrs["Mounts"]
    home = next(m for m in mounts if m["Destination"] == "/home/jovyan")
    assert home["Type"] == "bind" and Path(home["Source"]) == shub.data_dir / "users" / attacker
    with shub.kernel(attacker) as k:  # deleting makes room again
        k.execute("import os; os.remove('big'); open('after.txt', 'w').write('ok')")


def test_scratch_is_bounded_by_the_catalog_and_gone_after_a_restart(shub: Hub, docker) -> None:
    """Issue 23: "scratch space (/tmp, /dev/shm) per server bounded by the catalog and wiped at
    stop" and the attacks "fill the node's disk through /tmp, /dev/shm" (Docker). Fails on the
    old code: /tmp was the container's writable layer on the node's disk (64 MiB went through)
    and /dev/shm was half the memory limit, not the catalog's size."""
    user = shub.create_user()
    shub.spawn_ready(user, {"gpu": "none"})
    code, wrote = fill(shub, user, "/tmp/big", 2 * TMP)
    assert code == "ENOSPC" and wrote <= TMP, (code, wrote)
    code, wrote = fill(shub, user, "/dev/shm/big", 2 * SHM)
    assert code == "ENOSPC" and wrote <= SHM, (code, wrote)
    with shub.kernel(user) as k:
        k.execute(
            "import os\n"
            "os.remove('/tmp/big'); os.remove('/dev/shm/big')\n"
            "open('/tmp/scratch.txt', 'w').write('gone'); open('kept.txt', 'w').write('kept')"
        )
    host = container_of(docker, shub, user).attrs["HostConfig"]
    assert host["LogConfig"]["Config"]["max-file"] == "2"

    shub.stop_server(user)
    shub.spawn_ready(user, {"gpu": "none"})
    with shub.kernel(user) as k:
        seen = k.execute(
            "import os; print(os.path.exists('/tmp/scratch.txt'), open('kept.txt').read())"
        )
    assert seen.split() == ["False", "kept"]


def test_files_of_an_older_named_volume_move_into_the_bounded_home_once(
    shub: Hub, docker, test_image: str
) -> None:
    """Issue 23 (Docker, "the same home mechanism"): a user whose home was a named volume keeps
    their files when homes become bounded: copied once, as the image user, and not again."""
    user = shub.create_user()
    volume = f"gpulab-home-{user}"
    docker.volumes.create(volume, labels={LABEL_HUB: hub_id(shub)})
    docker.containers.run(
        test_image,
        ["sh", "-c", "echo old > /v/old.txt && ln -s /etc/shadow /v/shadow && chown -R 1000 /v"],
        volumes={volume: {"bind": "/v", "mode": "rw"}},
        user="0",
        remove=True,
        entrypoint=[],
    )
    shub.spawn_ready(user, {"gpu": "none"})
    with shub.kernel(user) as k:
        got = k.execute(
            "import os; print(open('old.txt').read().strip(), os.readlink('shadow'))\n"
            "os.remove('old.txt')"
        )
    assert got.split() == ["old", "/etc/shadow"]  # a link stays a link, pointing in the container
    home = shub.data_dir / "users" / user
    assert os.path.islink(home / "shadow") and not (home / "old.txt").exists()
    shub.stop_server(user)
    shub.spawn_ready(user, {"gpu": "none"})
    assert not (home / "old.txt").exists(), "moved once: a deleted file does not come back"


def test_a_home_full_to_the_byte_still_starts_and_can_be_cleaned(shub: Hub) -> None:
    """Issue 23: "a full home is not a lock-out" (Docker): a home filled to the last byte (and a
    last file of 0 bytes after) still starts, a kernel runs (its connection files live in /tmp,
    outside the quota), and the user frees room by deleting. Fails on the old code only through
    its quota (nothing filled up); without the launcher's tolerate_a_full_home the restart
    failed: jupyter_core's config migration made ~/.jupyter (ENOSPC) and the server exited."""
    user = shub.create_user()
    shub.spawn_ready(user, {"gpu": "none"})
    code, _ = fill(shub, user, "full", 2 * QUOTA)
    assert code in ("ENOSPC", "EDQUOT")
    with shub.kernel(user) as k:
        k.execute(  # the last partial block too
            "try:\n"
            "    f = open('last', 'wb', buffering=0)\n"
            "    while f.write(b'x' * 512): pass\n"
            "except OSError: pass"
        )
    home = shub.data_dir / "users" / user
    assert os.statvfs(home).f_bavail == 0
    shub.stop_server(user)
    shub.spawn_ready(user, {"gpu": "none"})
    with shub.kernel(user) as k:
        out = k.execute(
            "import os; os.remove('full'); open('room.txt', 'w').write('ok'); "
            "print(os.environ['JUPYTER_RUNTIME_DIR'])"
        )
    assert out.strip() == "/tmp/.gpulab-runtime"
    assert (home / "room.txt").read_text() == "ok"


def test_a_long_move_outlives_its_start_and_the_next_start_finishes_it(
    module_hub_factory, docker, small_catalog: Path, test_image: str
) -> None:
    """The move of an older volume into the bounded home takes longer than a start may wait:
    that start fails saying so (503, nothing half-copied among the user's files), the copy goes
    on, and the next start finds it done. A file the user made meanwhile is not overwritten."""
    hub = start_docker_hub(
        module_hub_factory,
        docker,
        "slowmove",
        small_catalog,
        "--GpuDockerSpawner.migrate_wait=0.05",
    )
    user = hub.create_user()
    volume = f"gpulab-home-{user}"
    docker.volumes.create(volume, labels={LABEL_HUB: hub_id(hub)})
    docker.containers.run(
        test_image,
        [
            "sh",
            "-c",
            "head -c 41943040 /dev/zero > /v/data.bin && echo old > /v/notes.txt "
            "&& chown -R 1000 /v",
        ],
        volumes={volume: {"bind": "/v", "mode": "rw"}},
        user="0",
        remove=True,
        entrypoint=[],
    )
    r = hub.spawn(user, {"gpu": "none"})
    assert r.status_code == 503 and "still being moved" in r.json()["message"], r.text
    home = hub.data_dir / "users" / user
    data = home / "data.bin"  # among the user's files only once whole (moved up in one rename)
    assert not data.exists() or data.stat().st_size == 41943040
    (home / "notes.txt").write_text("mine\n")  # what the user wrote meanwhile (as root here)
    hub.spawn_ready(user, {"gpu": "none"})
    with hub.kernel(user) as k:
        got = k.execute(
            "import os; print(os.path.getsize('data.bin'), open('notes.txt').read().strip(), "
            "os.path.exists('.gpulab-moving-home'))"
        )
    assert got.split() == ["41943040", "mine", "False"]
