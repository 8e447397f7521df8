"""Issue 23, part A: a quota the kernel enforces, on real loop-mounted filesystems (root).

The store-level tests drive :class:`HomeStore` as the hub does (``auto`` picks the image backend
where the hub is root and can loop-mount); the hub-level ones run real hubs, servers and kernels.
Each is an attack that succeeded on the old code, where a home was a plain folder on the node's
disk with no limit at all.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from billing.client import Billing
from harness import FAST_BILLING_ENV, Hub, catalog_with, passable_for_accounts

from gpulab.catalog.models import Storage
from gpulab.spawners.storage import loopfs
from gpulab.spawners.storage.homes import HomeStore, StorageError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts need root")

MiB = 2**20
QUOTA = 64 * MiB
TINY = Storage(free_gb=Decimal("0.0625"), max_gb=Decimal("0.25"), tmp_gb=Decimal("0.03125"),
               shm_gb=Decimal("0.03125"))  # fmt: skip


@pytest.fixture
def store(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    passable_for_accounts(data)
    homes = HomeStore(data, TINY)
    yield homes
    loopfs.unmount_below(data)


def as_user(uid: int, code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run Python ``code`` as ``uid`` (a user's own code in their home)."""
    return subprocess.run(
        [os.sys.executable, "-c", code],
        cwd=cwd,
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=120,
    )


# Bounded (quota + 8 MiB), so that where nothing enforces the quota (the old code) the test
# fails without filling the node's disk.
FILL = f"""
import errno, os
n = 0
try:
    with open("fill", "wb") as f:
        while n < {QUOTA // MiB + 8}:
            f.write(b"x" * 2**20); f.flush(); os.fsync(f.fileno()); n += 1
    print("NOT-REFUSED", n)
except OSError as e:
    print(errno.errorcode[e.errno], n)
"""


def test_a_write_past_the_quota_fails_in_the_writers_own_code(store):
    """Point 1 (store level): the write fails with ENOSPC in alice's code at her quota, the node's
    disk keeps its room, bob's home is untouched and the hub's usage says she is full. On the old
    code (a plain folder) alice wrote on until the node's disk was full."""
    assert store.backend == "image" and store.enforced
    alice = store.ensure("alice", 4001, 4001)
    bob = store.ensure("bob", 4002, 4002)
    (bob / "keep").write_text("bob's")
    out = as_user(4001, FILL, alice)
    code, mib = out.stdout.split()
    assert code in ("ENOSPC", "EDQUOT"), out
    assert QUOTA // MiB - 4 <= int(mib) <= QUOTA // MiB, out.stdout
    u = store.usage("alice")
    assert u.enforced and u.percent > 97, u
    assert (bob / "keep").read_text() == "bob's"
    assert (bob / "more").write_text("x" * 10_000) == 10_000  # bob still writes
    assert store.usage("bob").used_bytes < MiB


def test_quota_evasions_hard_links_sparse_files_and_inodes(store):
    """Point 2: a hard link from alice's home to a file of bob's fails (EXDEV: each home is its
    own filesystem); a sparse file 10x the quota is made but filling it hits ENOSPC, and usage
    counts its allocated blocks only; many tiny files run out of the home's own inodes (ENOSPC)
    while the hub's scan still answers. On the old code all three landed on the node's disk."""
    alice = store.ensure("alice", 4001, 4001)
    bob = store.ensure("bob", 4002, 4002)
    (bob / "big").write_bytes(b"b" * MiB)
    # Even a file bob shares for writing (which fs.protected_hardlinks lets alice link on one
    # filesystem) cannot be linked into her home.
    os.chmod(bob, 0o755)
    os.chmod(bob / "big", 0o666)
    link = as_user(4001, f"import os\ntry:\n os.link({str(bob / 'big')!r}, 'mine')\n"
                         "except OSError as e: print(e.errno)", alice)  # fmt: skip
    assert link.stdout.strip() == str(errno.EXDEV), link

    sparse = as_user(
        4001,
        "import errno, os\n"
        f"f = open('sparse', 'wb'); f.truncate({10 * QUOTA}); f.close()\n"
        "print(os.stat('sparse').st_size)\n"
        "f = open('sparse', 'r+b')\n"
        "try:\n"
        f"    for _ in range({QUOTA // MiB + 8}): f.write(b'y' * 2**20); f.flush()\n"
        "    os.fsync(f.fileno()); print('NOT-REFUSED')\n"
        "except OSError as e: print(errno.errorcode[e.errno])\n",
        alice,
    )
    size, code = sparse.stdout.split()
    assert int(size) == 10 * QUOTA and code == "ENOSPC", sparse
    u = store.usage("alice")
    assert u.used_bytes <= QUOTA + MiB < int(size), u
    os.unlink(alice / "sparse")

    inodes = as_user(
        4001,
        "import errno, os\nos.mkdir('many')\nn = 0\n"
        "try:\n"
        "    while n < 100_000: open(f'many/{n}', 'w').close(); n += 1\n"
        "    print('NOT-REFUSED', n)\n"
        "except OSError as e: print(errno.errorcode[e.errno], n)\n",
        alice,
    )
    code, n = inodes.stdout.split()
    assert code == "ENOSPC", inodes
    u = store.usage("alice")
    assert u.files_limit is not None and u.files >= u.files_limit - 1 and int(n) > 1000, u
    scan = {h.name: h for h in store.scan()}
    assert scan["alice"].files == u.files and scan["bob"].used_bytes < 2 * MiB


def test_a_symlink_in_a_home_is_not_measured_or_followed(store):
    """Point 4: links in alice's home to /etc/shadow and to bob's home: the hub's usage of alice
    counts neither (bob's 8 MiB are not hers) and reads nothing through them."""
    alice = store.ensure("alice", 4001, 4001)
    bob = store.ensure("bob", 4002, 4002)
    (bob / "data").write_bytes(b"z" * 8 * MiB)
    before = store.usage("alice").used_bytes
    os.symlink("/etc/shadow", alice / "shadow")
    os.symlink(bob, alice / "bob")
    os.symlink(bob / "data", alice / "data")
    after = store.usage("alice")
    assert after.used_bytes - before < 64 * 1024, after
    assert store.usage("bob").used_bytes >= 8 * MiB


def test_an_old_plain_home_moves_into_its_image_without_following_links(store):
    """A home from before images is copied into its image on first ensure: files, hard links,
    sparse files and owners kept, links copied as links (never followed: /etc/shadow is not
    read into it), a hard link to root's file not copied at all, then the plain folder is gone
    from the node's disk."""
    home = store.path("carol")
    home.mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    os.link(home / "notes.txt", home / "same.txt")
    os.symlink("/etc/shadow", home / "shadow")
    with open(home / "sparse", "wb") as f:
        f.truncate(10 * QUOTA)
    secret = store.data_dir / "secret"  # root's, on the same filesystem, linked in
    secret.write_text("root's secret")
    os.link(secret, home / "linked-secret")
    for entry in (home, home / "notes.txt", home / "sparse"):
        os.chown(entry, 4003, 4003)
    store.ensure("carol", 4003, 4003)
    assert not (home / "linked-secret").exists()
    assert store.images.mounted_device("carol")
    st = os.stat(home / "same.txt")
    assert (home / "notes.txt").read_text() == "mine" and st.st_nlink == 2 and st.st_uid == 4003
    assert os.readlink(home / "shadow") == "/etc/shadow"
    assert os.stat(home / "sparse").st_size == 10 * QUOTA
    assert store.usage("carol").used_bytes < MiB
    assert not [p for p in store.homes_dir.iterdir() if "migrated" in p.name]


def test_quota_changes_and_mounting_once(store):
    """Raising the quota gives the home the room (the write that failed now succeeds); a second
    ensure (or a second store, as after a hub restart) reuses the mount, never mounts twice; a
    quota below what the home holds is a 409 naming quota_gb, and nothing changes."""
    alice = store.ensure("alice", 4001, 4001)
    as_user(4001, FILL, alice)
    store.set_quota("alice", 2 * QUOTA)
    more = as_user(4001, "open('more', 'wb').write(b'm' * 2**24)", alice)
    assert more.returncode == 0, more.stderr
    with pytest.raises(StorageError) as e:
        store.set_quota("alice", QUOTA)
    assert e.value.status == 409 and "quota_gb" in str(e.value)
    assert store.quota("alice") == 2 * QUOTA
    again = HomeStore(store.data_dir, TINY)
    again.ensure("alice", 4001, 4001)
    points = [m.point for m in loopfs.mounts() if m.point == str(alice)]
    assert len(points) == 1, points


def test_a_home_mounted_elsewhere_cannot_be_shrunk_and_a_free_one_can(store, tmp_path):
    """Shrinking is offline only: while a process of the user's holds the home (here one that
    sits in it, in a mount namespace of its own as a server does) a smaller quota is a 409 and
    the home stays mounted; once it ends, the shrink happens."""
    alice = store.ensure("alice", 4001, 4001)
    store.set_quota("alice", 2 * QUOTA)
    holder = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sleep", "300"], cwd=alice
    )
    try:
        with pytest.raises(StorageError) as e:
            store.set_quota("alice", QUOTA)
        assert e.value.status == 409 and "stop your servers" in str(e.value)
        assert store.images.mounted_device("alice")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert store.set_quota("alice", QUOTA).quota_bytes == QUOTA
    assert QUOTA <= store.images.usage("alice").capacity_bytes < 2 * QUOTA


# ---- hub level: real hubs, servers and kernels -------------------------------------------------


def quota_catalog(folder: Path) -> Path:
    """The shipped catalog with a 64 MiB home and 32 MiB of /tmp and of /dev/shm."""
    return catalog_with(folder, free_gb=0.0625, max_gb=0.25, tmp_gb=0.03125, shm_gb=0.03125)


@pytest.fixture(scope="module")
def qhub(module_hub_factory, tmp_path_factory) -> Hub:
    return module_hub_factory(
        "storage-quota",
        simulate="RTX-4090:1",
        catalog=quota_catalog(tmp_path_factory.mktemp("quota-catalog")),
        env=FAST_BILLING_ENV,
    )


KERNEL_FILL = """
import errno, os
n, got = 0, "NOT-REFUSED"
try:
    with open({path!r}, "wb") as f:
        while n < {limit}:
            f.write(b"k" * 2**20); f.flush(); os.fsync(f.fileno()); n += 1
except OSError as e:
    got = errno.errorcode[e.errno]
print(got, n)
"""


def kernel_fill(k, path: str, limit_mib: int) -> tuple[str, int]:
    got, n = k.execute(KERNEL_FILL.format(path=path, limit=limit_mib), timeout=120).split()
    return got, int(n)


def mount_count(point: str) -> int:
    return sum(1 for m in loopfs.mounts() if m.point == point)


def test_a_kernel_past_its_quota_gets_enospc_and_nobody_else_notices(qhub: Hub) -> None:
    """Point 1: a kernel in alice's server writes past her 64 MiB quota: ENOSPC in her own code
    (bounded at quota + 8 MiB: on the old code it wrote all of it to the node's disk), while the
    hub and billing answer, and bob starts a server and writes a file (alice's home is not
    mounted in bob's server at all)."""
    alice, bob = qhub.create_user(), qhub.create_user()
    qhub.spawn_ready(alice, {"gpu": "none"})
    with qhub.kernel(alice) as k:
        got, n = kernel_fill(k, "fill", QUOTA // MiB + 8)
        assert got in ("ENOSPC", "EDQUOT") and n < QUOTA // MiB, (got, n)
        assert qhub.api("GET", "/").status_code == 200
        assert Billing(qhub).up()
        qhub.spawn_ready(bob, {"gpu": "none"})
        with qhub.kernel(bob) as kb:
            assert kb.execute("print(open('hello', 'w').write('x' * 100_000))").strip() == "100000"
            # alice's home is not even mounted in bob's server (detached in its namespace, so
            # bob's server never holds it)
            alice_home = str(qhub.data_dir / "users" / alice)
            seen = kb.execute(f"import os; print(os.path.ismount({alice_home!r}))").strip()
            assert seen == "False"
        # alice can still delete, and then write again
        k.execute("import os; os.remove('fill'); open('again', 'w').write('ok')")
    assert mount_count(str(qhub.data_dir / "users" / alice)) == 1


def test_tmp_and_shm_are_bounded_and_wiped_at_stop(qhub: Hub) -> None:
    """Point 3: /tmp and /dev/shm fill only to the catalog's 32 MiB each (ENOSPC; on the old code
    both were the node's, unbounded and shared by every server), the node's /tmp never sees
    the file; after a restart of the server a file left in /tmp is gone, the home's stays."""
    carol = qhub.create_user()
    qhub.spawn_ready(carol, {"gpu": "none"})
    with qhub.kernel(carol) as k:
        for folder in ("/tmp", "/dev/shm"):
            got, n = kernel_fill(k, f"{folder}/big-{carol}", 48)
            assert got == "ENOSPC" and n <= 32, (folder, got, n)
        k.execute(
            f"open('/tmp/left-{carol}', 'w').write('scratch'); open('kept', 'w').write('home')"
        )
    assert not Path(f"/tmp/big-{carol}").exists() and not Path(f"/dev/shm/big-{carol}").exists()
    qhub.stop_server(carol)
    qhub.spawn_ready(carol, {"gpu": "none"})
    with qhub.kernel(carol) as k:
        assert (
            k.execute(f"import os; print(os.path.exists('/tmp/left-{carol}'))").strip() == "False"
        )
        assert k.execute("print(open('kept').read())").strip() == "home"


def test_a_hub_killed_with_homes_mounted_reuses_them(qhub: Hub) -> None:
    """Point 6: SIGKILL of the hub while dave's home is mounted and his server runs; after the
    restart his files are all there (in his running server and on the hub's side), his home is
    mounted once, and a new spawn of erin mounts hers once too."""
    dave, erin = qhub.create_user(), qhub.create_user()
    qhub.spawn_ready(dave, {"gpu": "none"})
    with qhub.kernel(dave) as k:
        k.execute("open('before-crash.txt', 'w').write('saved' * 1000)")
    home = str(qhub.data_dir / "users" / dave)
    assert mount_count(home) == 1
    qhub.kill()
    qhub.start()
    assert mount_count(home) == 1
    with qhub.kernel(dave) as k:
        assert k.execute("print(len(open('before-crash.txt').read()))").strip() == "5000"
    qhub.stop_server(dave)
    qhub.spawn_ready(dave, {"gpu": "none"})
    qhub.spawn_ready(erin, {"gpu": "none"})
    assert mount_count(home) == 1
    assert mount_count(str(qhub.data_dir / "users" / erin)) == 1
    assert (Path(home) / "before-crash.txt").stat().st_size == 5000


def test_a_mounted_dataset_and_the_model_store_cannot_be_written(qhub: Hub) -> None:
    """Point 2 (the rest): writing into a mounted dataset or the model store, to evade the quota
    or to change what others read, fails in the user's code (EROFS or EACCES), also for a file
    already there. (These were read-only before issue 23 too: this test guards that the home
    images and the server's own /tmp keep them so.)"""
    model = qhub.data_dir / "models" / "tiny-sd"
    model.mkdir(parents=True, exist_ok=True)
    (model / "weights.bin").write_bytes(b"w" * 4096)
    frank = qhub.create_user()
    qhub.spawn_ready(frank, {"gpu": "none", "datasets": ["sklearn-toy"]})
    code = (
        "import errno, json, os\n"
        "out = {}\n"
        "for p in ('datasets/sklearn-toy/new.bin', 'models/tiny-sd/new.bin',\n"
        "          'models/tiny-sd/weights.bin'):\n"
        "    try:\n"
        "        with open(p, 'ab') as f: f.write(b'x' * 2**20)\n"
        "        out[p] = 'WRITTEN'\n"
        "    except OSError as e:\n"
        "        out[p] = errno.errorcode[e.errno]\n"
        "print(json.dumps(out))"
    )
    with qhub.kernel(frank) as k:
        got = json.loads(k.execute(code).strip())
    assert set(got.values()) <= {"EROFS", "EACCES"}, got
    assert (model / "weights.bin").stat().st_size == 4096


def test_deleted_files_go_back_to_the_nodes_disk(store):
    """A home's image is sparse: what the user deletes is given back to the node's disk by the
    trim a spawner runs when a server stops (no online discard: 15x slower writes)."""
    alice = store.ensure("alice", 4001, 4001)
    image = store.images.image("alice")
    before = os.stat(image).st_blocks * 512
    with open(alice / "data", "wb") as f:
        f.write(os.urandom(16 * MiB))
        os.fsync(f.fileno())
    os.sync()
    assert os.stat(image).st_blocks * 512 >= before + 15 * MiB
    os.unlink(alice / "data")
    os.sync()
    assert store.trim("alice") >= 15 * MiB
    assert os.stat(image).st_blocks * 512 < before + MiB


def test_a_server_of_another_hub_on_the_node_holds_no_home_of_this_one(
    qhub: Hub, hub_factory
) -> None:
    """A node may run more than one hub (and the test suite runs many): a server of another hub,
    started while alice's home is mounted, must not hold a copy of that mount in its namespace
    (its tmpfs /tmp only hid what was mounted below the old /tmp, where these hubs keep their
    data): alice's quota change or release would answer "in use" for as long as it runs."""
    alice = qhub.create_user()
    qhub.spawn_ready(alice, {"gpu": "none"})
    alice_home = str(qhub.data_dir / "users" / alice)
    assert mount_count(alice_home) == 1
    other = hub_factory("storage-other-hub", simulate="RTX-4090:1", env=FAST_BILLING_ENV)
    dave = other.create_user()
    other.spawn_ready(dave, {"gpu": "none"})
    with other.kernel(dave) as k:
        seen = k.execute("print(open('/proc/self/mountinfo').read())")
    held = [line for line in seen.splitlines() if f" {alice_home} " in line]
    assert held == [], held
    other.stop_server(dave)
    qhub.stop_server(alice)
