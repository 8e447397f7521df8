"""Root never acts on a path a user controls: each place where root works in a user's home (or
in the node's shared temp folder) meets a link to a root-owned folder outside it, or a swap of a
folder for such a link between the check and the use, and the root-owned folder stays as it was.

The code under test runs for real, as root, in a child process (the launcher enters a mount
namespace and drops to an account for good), with ``nobody`` as the user's account. A swap is the
attacker winning a race: the child's ``os.stat`` is wrapped so that, right after root has looked
at a name, that name becomes a link to the sentinel folder.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from harness import passable_for_accounts

from gpulab.spawners.local import accounts
from gpulab.spawners.local.sandbox import Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root acting on user paths needs root")

NOBODY = pwd.getpwnam("nobody")
OWNER = (NOBODY.pw_uid, NOBODY.pw_gid)
RUN_AS = f"{NOBODY.pw_uid}:{NOBODY.pw_gid}:nobody"


def make_sentinel(path: Path) -> Path:
    """A root-owned folder outside every home: a file, a link and an empty folder in it."""
    path.mkdir()
    (path / "file").write_text("root's\n")
    os.symlink("/etc", path / "link")
    (path / "empty").mkdir()
    return path


def snapshot(path: Path) -> dict[str, tuple]:
    """Everything about the folder a change by root would alter (names, types, owners, text)."""
    out = {}
    for entry in [path, *sorted(path.rglob("*"))]:
        st = entry.lstat()
        text = entry.read_text() if entry.is_file() and not entry.is_symlink() else None
        out[str(entry.relative_to(path))] = (st.st_mode, st.st_uid, st.st_gid, text)
    return out


@pytest.fixture
def place(tmp_path: Path):
    """A home owned by ``nobody``, a dataset source, and the sentinel, all reachable by nobody."""
    passable_for_accounts(tmp_path)
    tmp_path.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, *OWNER)
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.txt").write_text("the dataset\n")
    sentinel = make_sentinel(tmp_path / "sentinel")
    return home, src, sentinel


def as_user(path: Path, target: str | None = None, folder: bool = False) -> Path:
    """Make ``path`` as the user would have (a link to ``target``, or a folder), owned by them."""
    if target is not None:
        os.symlink(target, path)
    elif folder:
        path.mkdir()
    os.chown(path, *OWNER, follow_symlinks=False)
    return path


# The child: the server process up to JupyterHub's server (the launcher's main, with ENV as its
# environment and a stand-in for jupyterhub-singleuser that reports what it sees: uid, USER,
# LOGNAME and its mount namespace's mount points), or only CALL(ENV). SWAP makes a name a link
# right after root's os.stat of it.
CHILD = r"""
import json, os, sys, types
from gpulab.spawners.inside import launcher
spec = json.loads(sys.argv[1])
swap = spec.get("swap")
if swap:
    real_stat = os.stat
    def stat(path, *a, **kw):
        st = real_stat(path, *a, **kw)
        if path == swap["name"] and os.geteuid() == 0 and not swap.get("done"):
            swap["done"] = True
            at = swap["dir"] + "/" + swap["name"]
            os.rename(at, at + ".moved")
            os.symlink(swap["target"], at)
        return st
    os.stat = stat
def report(error=None):
    mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
    print(json.dumps({"error": error, "uid": os.getuid(), "user": os.environ.get("USER"),
                      "logname": os.environ.get("LOGNAME"), "mounts": mounts}), flush=True)
    return 0
server = types.ModuleType("jupyterhub.singleuser")
server.main = report
sys.modules["jupyterhub.singleuser"] = server
os.environ.clear()
os.environ.update(spec["env"])
try:
    if spec["call"] == "main":
        launcher.main([])  # ends with the stand-in's report
    getattr(launcher, spec["call"])(spec["env"])
except OSError as e:
    sys.exit(report(str(e)))
report()
"""


def run_child(env: dict, call: str = "main", swap: dict | None = None) -> dict:
    spec = {"env": env, "call": call, "swap": swap}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def launcher_env(home: Path, src: Path, mode: str) -> dict[str, str]:
    return {
        "HOME": str(home),
        "GPULAB_RUN_AS": RUN_AS,
        "GPULAB_DATASET_MODE": mode,
        "GPULAB_DATASET_MOUNTS": json.dumps([[str(src), str(home / "datasets" / "toy")]]),
    }


def can_bind() -> bool:
    probe = "import ctypes,sys;sys.exit(ctypes.CDLL(None,use_errno=True).unshare(0x20000))"
    return subprocess.run([sys.executable, "-c", probe]).returncode == 0


MODES = [
    "symlink",
    pytest.param(
        "bind", marks=pytest.mark.skipif(not can_bind(), reason="no CAP_SYS_ADMIN for mounts")
    ),
]


@pytest.mark.parametrize("mode", MODES)
def test_a_mount_folder_linked_to_a_system_folder_is_left_alone(place, mode: str) -> None:
    """``rm -rf ~/datasets; ln -s /etc ~/datasets`` (and ~/models), then a start with a dataset:
    the old launcher, as root, tidied the linked folder (unlinking its links, removing its empty
    folders) and made the dataset's folder or link in it."""
    home, src, sentinel = place
    before = snapshot(sentinel)
    as_user(home / "datasets", str(sentinel))
    as_user(home / "models", str(sentinel))
    seen = run_child(launcher_env(home, src, mode))
    assert seen["error"] is None
    assert snapshot(sentinel) == before
    assert str(sentinel) not in seen["mounts"]
    # The user's links are replaced by a real folder of theirs, holding the dataset.
    datasets = home / "datasets"
    assert not datasets.is_symlink() and datasets.stat().st_uid == NOBODY.pw_uid
    if mode == "symlink":
        assert (datasets / "toy").readlink() == src
    else:
        assert str(datasets / "toy") in seen["mounts"]


def test_a_mount_point_linked_to_a_system_folder_is_never_mounted_on(place) -> None:
    """``~/datasets/toy -> /etc``: the old launcher bind-mounted the dataset through the link,
    over the system folder (in the server's namespace, where root then still acts)."""
    if not can_bind():
        pytest.skip("no CAP_SYS_ADMIN for mounts")
    home, src, sentinel = place
    before = snapshot(sentinel)
    as_user(home / "datasets", folder=True)
    as_user(home / "datasets" / "toy", str(sentinel))
    seen = run_child(launcher_env(home, src, "bind"))
    assert seen["error"] is None
    assert str(sentinel) not in seen["mounts"]
    assert str(home / "datasets" / "toy") in seen["mounts"]
    assert snapshot(sentinel) == before


@pytest.mark.parametrize("swapped", ["datasets", "toy"])
def test_a_folder_swapped_for_a_link_after_the_check_is_never_mounted_on(
    place, swapped: str
) -> None:
    """The attacker wins the race: right after root looked at ``~/datasets`` (or the mount point
    ``toy``) and saw a real folder, it becomes a link to the system folder. Root opens it only
    without following links, so the start fails instead of mounting there. (In symlink mode root
    does nothing in the home: the links are made by the user's own account.)"""
    if not can_bind():
        pytest.skip("no CAP_SYS_ADMIN for mounts")
    home, src, sentinel = place
    before = snapshot(sentinel)
    as_user(home / "datasets", folder=True)
    as_user(home / "datasets" / "toy", folder=True)
    parent = home if swapped == "datasets" else home / "datasets"
    swap = {"name": swapped, "dir": str(parent), "target": str(sentinel)}
    seen = run_child(launcher_env(home, src, "bind"), swap=swap)
    assert swap_happened(parent, swapped)
    assert seen["error"] is not None
    assert str(sentinel) not in seen["mounts"]
    assert snapshot(sentinel) == before


def swap_happened(parent: Path, name: str) -> bool:
    return (parent / name).is_symlink() and (parent / f"{name}.moved").is_dir()


def test_entering_the_sandbox_touches_no_path_of_the_user(place) -> None:
    """``enter_sandbox`` also runs (as root) before a checkpoint command: with ``~/models -> /etc``
    the old one gave the user every link in /etc (lchown), and the server's USER and LOGNAME
    were "models" (a loop variable)."""
    home, _src, sentinel = place
    before = snapshot(sentinel)
    as_user(home / "models", str(sentinel))
    as_user(home / "datasets", str(sentinel))
    seen = run_child({"HOME": str(home), "GPULAB_RUN_AS": RUN_AS}, call="enter_sandbox")
    assert seen["error"] is None and seen["uid"] == NOBODY.pw_uid
    assert snapshot(sentinel) == before
    assert (seen["user"], seen["logname"]) == ("nobody", "nobody")


def test_folders_root_made_in_a_home_are_handed_over_without_leaving_it(place) -> None:
    """A home from an older gpulab: ~/datasets made by root, with root's links in it (handed to
    the user), and a hard link to a root-owned link from outside (not handed over)."""
    home, src, sentinel = place
    datasets = home / "datasets"
    datasets.mkdir()
    os.symlink(src, datasets / "old")
    os.link(sentinel / "link", datasets / "planted", follow_symlinks=False)
    before = snapshot(sentinel)
    seen = run_child({"HOME": str(home), "GPULAB_RUN_AS": RUN_AS})
    assert seen["error"] is None
    assert datasets.stat().st_uid == NOBODY.pw_uid
    assert snapshot(sentinel) == before
    # The stale links went, tidied by the user's own account.
    assert not (datasets / "old").is_symlink() and not (datasets / "planted").is_symlink()


def account() -> accounts.Account:
    return accounts.Account("nobody", NOBODY.pw_uid, NOBODY.pw_gid, "/nonexistent")


def test_handing_over_an_old_home_gives_away_nothing_outside_it(place) -> None:
    """A home made before isolation belongs to root; the hub hands it to the user's account.
    The old walk chowned a hard link to a root file outside the home (and would have followed a
    folder swapped for a link between listing and descending)."""
    home, _src, sentinel = place
    os.chown(home, 0, 0)
    (home / "work").mkdir()
    (home / "work" / "notes.txt").write_text("mine")
    os.link(sentinel / "file", home / "planted")
    os.symlink(sentinel, home / "linked")
    before = snapshot(sentinel)
    accounts.prepare_home(home, account())
    assert snapshot(sentinel) == before
    for mine in (home, home / "work", home / "work" / "notes.txt"):
        assert mine.lstat().st_uid == NOBODY.pw_uid, mine
    assert (home / "linked").lstat().st_uid == NOBODY.pw_uid  # the link itself, not its target
    assert (home / "planted").lstat().st_uid == 0
    assert oct(home.stat().st_mode & 0o777) == oct(0o700)


def test_handing_over_an_old_home_survives_a_swap(place, monkeypatch) -> None:
    """A folder of the home becomes a link to the sentinel right after the walk has looked at
    it: the walk never follows it (descriptors), and the link itself is all that changes."""
    home, _src, sentinel = place
    os.chown(home, 0, 0)
    (home / "work").mkdir()
    (home / "work" / "notes.txt").write_text("mine")
    before = snapshot(sentinel)
    real_stat = os.stat
    done = []

    def stat(path, *a, **kw):
        st = real_stat(path, *a, **kw)
        if path == "work" and not done:
            done.append(True)
            os.rename(home / "work", home / "work.moved")
            os.symlink(sentinel, home / "work")
        return st

    monkeypatch.setattr(os, "stat", stat)
    accounts.prepare_home(home, account())
    monkeypatch.undo()
    assert done
    assert snapshot(sentinel) == before


def test_proxy_socket_folders_are_removed_without_following_links(tmp_path: Path) -> None:
    """jupyter-server-proxy's socket folders (mkdtemp in /tmp, the server's account) go at stop;
    root removes only real folders that account owns, never through a link."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    sentinel = make_sentinel(tmp_path / "sentinel")
    before = snapshot(sentinel)
    mine = as_user(temp / "jupyter-server-proxy-mine", folder=True)
    as_user(mine / "socket-link", str(sentinel))
    (mine / "sock").write_text("")
    roots = temp / "jupyter-server-proxy-roots"
    roots.mkdir()
    as_user(temp / "jupyter-server-proxy-link", str(sentinel))
    other = as_user(temp / "unrelated", folder=True)
    sandbox = Sandbox(alloc_id="x", account=account())
    removed = sandbox.remove_temp_dirs(temp_dirs=(str(temp),))
    assert removed == [str(mine)]
    assert not mine.exists()
    assert roots.is_dir() and other.is_dir()
    assert (temp / "jupyter-server-proxy-link").is_symlink()
    assert snapshot(sentinel) == before


def test_the_apps_config_is_written_as_the_user_never_through_their_link(place) -> None:
    """The launcher writes jupyter-server-proxy's config into ``~/.gpulab/jupyter-config``; with
    that folder linked to a root-owned one, the write is the user's own (and is refused there)."""
    home, _src, sentinel = place
    before = snapshot(sentinel)
    as_user(home / ".gpulab", folder=True)
    as_user(home / ".gpulab" / "jupyter-config", str(sentinel))
    env = {"HOME": str(home), "GPULAB_RUN_AS": RUN_AS, "GPULAB_APP_SERVERS": '{"x": {}}'}
    seen = run_child(env)
    assert seen["error"] is not None and "Permission denied" in seen["error"]
    assert snapshot(sentinel) == before


def test_a_home_below_a_folder_its_user_can_change_is_refused(tmp_path: Path) -> None:
    """With ``home_dir_template`` putting the home below a folder of the user's (or one anyone
    may write to), the user could swap the home itself for a link before root prepares it."""
    passable_for_accounts(tmp_path)
    theirs = as_user(tmp_path / "theirs", folder=True)
    assert accounts.changeable_at(theirs / "home", account()) == theirs
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert accounts.changeable_at(shared / "deeper" / "home", account()) == shared
    shared.chmod(0o1777)  # sticky, as /tmp: nobody can swap what they do not own...
    roots = shared / "roots"
    roots.mkdir(mode=0o711)
    assert accounts.changeable_at(roots / "home", account()) is None
    # ...but anyone can take a name there first.
    planted = as_user(shared / "planted", folder=True)
    assert accounts.changeable_at(planted / "home", account()) == planted
    assert accounts.changeable_at(shared / "home", account()) == shared
    os.symlink(roots, shared / "link")
    os.chown(shared / "link", *OWNER, follow_symlinks=False)
    assert accounts.changeable_at(shared / "link" / "home", account()) == shared / "link"
