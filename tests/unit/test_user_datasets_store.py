"""The users' dataset store on a real filesystem (spawners/storage/datasets.py): what a snapshot
copies and skips, the bound it stays within while the folder changes under it, what a crash
leaves, and how a ``datasets`` entry naming a user's dataset is read by the options parser and
the course rules. The hub-level attacks are in tests/e2e/test_private_datasets.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpulab.catalog import load_catalog
from gpulab.catalog.models import Storage
from gpulab.spawners.courses import Course, CourseLimits, apply_course_rules
from gpulab.spawners.options import OptionsError, parse_options
from gpulab.spawners.storage.datasets import DatasetStore, mount_name
from gpulab.spawners.storage.homes import HomeStore, StorageError

UID = 4242 if os.geteuid() == 0 else os.geteuid()


def own(path: Path) -> None:
    if os.geteuid() == 0:
        os.lchown(path, UID, UID)


def make_store(tmp_path: Path, free_gb: float = 0.0625, **kw) -> tuple[DatasetStore, Path]:
    homes = HomeStore(tmp_path / "data", Storage(free_gb=free_gb), mode="directory")
    home = homes.ensure("alice", UID, UID)
    return DatasetStore(homes, **kw), home


def folder(home: Path, files: dict[str, bytes]) -> Path:
    top = home / "f"
    top.mkdir()
    own(top)
    for rel, data in files.items():
        p = top / rel
        for d in reversed(p.relative_to(home).parents[:-1]):
            if not (home / d).exists():
                (home / d).mkdir()
                own(home / d)
        p.write_bytes(data)
        own(p)
    return top


def publish(store: DatasetStore, name: str = "ds", where: str = "f"):
    return store.run_publish(store.start_publish("alice", where, name))


def test_a_snapshot_copies_files_and_folders_only_and_keeps_holes_and_links_as_they_were(
    tmp_path: Path,
) -> None:
    store, home = make_store(tmp_path)
    top = folder(home, {"a.txt": b"hello", "sub/b.bin": b"x" * 9000})
    with open(top / "holes", "wb") as f:  # a 4 MiB file of holes and one block of data
        f.seek(2 << 20)
        f.write(b"data")
        f.truncate(4 << 20)
    own(top / "holes")
    os.link(top / "a.txt", top / "a-again.txt")  # two names, one file of alice's
    os.mkfifo(top / "pipe")  # would hang a copy that opened it for reading
    own(top / "pipe")
    os.symlink("/etc/passwd", top / "passwd")
    m = publish(store)
    assert m is not None
    data = store.source("alice", "ds")
    assert sorted(os.listdir(data)) == ["a-again.txt", "a.txt", "holes", "sub"]
    assert {p: w.split(" ")[0] for p, w in m.skipped} == {"passwd": "symlink", "pipe": "special"}
    assert os.stat(data / "a.txt").st_ino == os.stat(data / "a-again.txt").st_ino
    held = os.stat(data / "holes")
    assert held.st_size == 4 << 20 and held.st_blocks * 512 < 1 << 20  # still sparse
    assert (data / "holes").read_bytes()[2 << 20 : (2 << 20) + 4] == b"data"
    st = os.stat(data / "sub" / "b.bin")
    assert stat.S_IMODE(st.st_mode) == 0o444 and stat.S_IMODE(os.stat(data).st_mode) == 0o555
    if os.geteuid() == 0:
        assert st.st_uid == 0
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert store.datasets_bytes("alice") == m.size_bytes > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
def test_files_the_home_owner_does_not_own_are_not_copied(tmp_path: Path) -> None:
    store, home = make_store(tmp_path)
    top = folder(home, {"mine.txt": b"m"})
    (top / "roots.txt").write_text("root's")  # e.g. a hard link to another user's file
    m = publish(store)
    assert sorted(os.listdir(store.source("alice", "ds"))) == ["mine.txt"]
    assert [p for p, _ in m.skipped] == ["roots.txt"]


def test_a_folder_that_grows_past_the_quota_during_the_copy_is_stopped(tmp_path: Path) -> None:
    store, home = make_store(tmp_path)
    top = folder(home, {"small": b"s"})
    job = store.start_publish("alice", "f", "ds")  # measured: fits
    with pytest.raises(StorageError) as busy:  # one publish at a time per owner
        store.start_publish("alice", "f", "other")
    assert busy.value.status == 409 and busy.value.field == "name"
    with open(top / "big", "wb") as f:  # then the folder grows past the quota (64 MiB)
        f.truncate(100 << 20)
    own(top / "big")
    assert store.run_publish(job) is None
    assert job.state == "failed" and job.error["status"] == 409
    assert job.error["field"] == "folder"
    assert store.get("alice", "ds") is None and os.listdir(store.root / "alice") == []


def test_depth_and_file_count_are_bounded(tmp_path: Path) -> None:
    store, home = make_store(tmp_path, max_depth=2, max_files=5)
    folder(home, {"1/2/3/deep.txt": b"d", "top.txt": b"t"})
    m = publish(store)
    assert ("1/2/3", "deeper than 2 folders") in m.skipped
    for i in range(6):
        (home / "f" / f"n{i}").write_text("x")
        own(home / "f" / f"n{i}")
    with pytest.raises(StorageError) as e:
        store.start_publish("alice", "f", "many")
    assert e.value.status == 409 and e.value.field == "folder" and "files" in str(e.value)


def test_manifests_survive_a_restart_and_a_crashs_leftovers_go(tmp_path: Path) -> None:
    store, home = make_store(tmp_path)
    folder(home, {"a": b"a"})
    publish(store)
    store.set_sharing("alice", "ds", ["bob", "alice"], ["ml1"])
    (store.root / "alice" / ".half.partial" / "data").mkdir(parents=True)
    again = DatasetStore(store.homes)
    m = again.get("alice", "ds")
    assert m is not None and m.users == ("bob",) and m.courses == ("ml1",)
    assert os.listdir(store.root / "alice") == ["ds"]
    assert again.readable("@alice/ds", "carol", ["ml1"]) is m
    assert again.readable("@alice/ds", "carol", ["ml2"]) is None
    assert again.readable("@alice/nope", "alice", []) is None
    assert again.delete("alice", "ds") and os.listdir(store.root / "alice") == []
    assert again.datasets_bytes("alice") == 0


def test_the_options_read_a_users_dataset_by_its_spelling_and_course_limits_leave_it() -> None:
    catalog = load_catalog(None)
    opts = parse_options({"datasets": ["@alice/faces", "sklearn-toy"]}, catalog)
    assert opts.datasets == ("@alice/faces", "sklearn-toy")
    assert mount_name("@alice/faces") == "@alice.faces" and mount_name("iris") == "iris"
    for bad in ("@alice", "@/x", "@alice/Faces", "@a/b/c", "@al ice/x", "@alice/../x"):
        with pytest.raises(OptionsError) as e:
            parse_options({"datasets": [bad]}, catalog)
        assert e.value.field == "datasets", bad
    course = Course(name="ml1", limits=CourseLimits(datasets=("sklearn-toy",)))
    assert apply_course_rules(opts, [course], catalog).course == "ml1"
