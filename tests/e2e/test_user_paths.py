"""A root hub and what a user controls: the user's home, the node's temp folder, a server that
never comes up. Each test is an attack from a user's own server (a kernel, their files); root must
never act on a path the user can point elsewhere, nor give a card back while a process of a failed
server still runs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from harness import Hub, wait_for

from gpulab.spawners.local.accounts import account_name
from gpulab.spawners.local.cgroup import Cgroups

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root hub")


def make_sentinel(path: Path) -> Path:
    """A root-owned folder outside every home: a file, a link and an empty folder in it."""
    path.mkdir(parents=True)
    path.chmod(0o755)
    (path / "file").write_text("root's\n")
    os.symlink("/etc", path / "link")
    (path / "empty").mkdir()
    return path


def snapshot(path: Path) -> dict[str, tuple]:
    out = {}
    for entry in [path, *sorted(path.rglob("*"))]:
        st = entry.lstat()
        out[str(entry.relative_to(path))] = (st.st_mode, st.st_uid, st.st_gid)
    return out


def alive(pid: int) -> bool:
    try:
        fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X")


@pytest.fixture(scope="module")
def symlink_hub(module_hub_factory) -> Hub:
    """A hub whose servers get datasets as links (made in the home) instead of bind mounts."""
    return module_hub_factory(
        "symlink-hub",
        simulate="A100-80G:1",
        extra_args=["--GpuLocalSpawner.dataset_mode=symlink"],
    )


@pytest.mark.parametrize("mode", ["auto", "symlink"])
def test_a_home_folder_linked_to_a_system_folder_is_never_touched_by_root(
    request, hub: Hub, mode: str, tmp_path: Path
) -> None:
    """``rm -rf ~/datasets; ln -s /some/dir ~/datasets`` (and ~/models) from a kernel, then a
    start with a dataset: the hub, as root, tidied the linked folder (unlinking its links and
    empty folders) and made the dataset's folder there."""
    target = hub if mode == "auto" else request.getfixturevalue("symlink_hub")
    user = target.create_user()
    sentinel = make_sentinel(tmp_path / "system-folder")
    before = snapshot(sentinel)
    try:
        target.spawn_ready(user, {"gpu": "none"})
        with target.kernel(user) as k:
            k.execute(
                "import os, shutil\n"
                "for name in ('datasets', 'models'):\n"
                "    p = os.path.expanduser('~/' + name)\n"
                "    shutil.rmtree(p, ignore_errors=True)\n"
                f"    os.symlink({str(sentinel)!r}, p)\n"
            )
        target.stop_server(user)
        target.spawn_ready(user, {"gpu": "none", "datasets": ["sklearn-toy"]})
        assert snapshot(sentinel) == before
        with target.kernel(user) as k:
            seen = k.execute(
                "import os\n"
                "p = os.path.expanduser('~/datasets')\n"
                "print(os.path.islink(p), 'iris.csv' in os.listdir(p + '/sklearn-toy'))"
            ).split()
        # The user's link became a real folder of theirs, with the dataset in it.
        assert seen == ["False", "True"]
    finally:
        if target.server(user) is not None:
            target.stop_server(user)
    assert snapshot(sentinel) == before


def test_user_and_logname_are_the_users_own_account(hub: Hub, user: str) -> None:
    """Every server had USER and LOGNAME "models" (a loop variable of the launcher)."""
    hub.spawn_ready(user, {"gpu": "none"})
    with hub.kernel(user) as k:
        seen = k.execute("import os; print(os.environ['USER'], os.environ['LOGNAME'])").split()
    assert seen == [account_name(user)] * 2


def test_proxy_socket_folders_go_with_the_server(hub: Hub, user: str) -> None:
    """jupyter-server-proxy makes a socket folder in /tmp for each app on ``{unix_socket}``; they
    outlived the server (and its account). Root removes only the account's own real folders."""
    hub.spawn_ready(user, {"gpu": "none"})
    with hub.kernel(user) as k:
        # What jupyter-server-proxy does in the server, as the server's account.
        folder = k.execute(
            "import tempfile, socket\n"
            "d = tempfile.mkdtemp(prefix='jupyter-server-proxy-')\n"
            "s = socket.socket(socket.AF_UNIX); s.bind(d + '/socket')\n"
            "import os; print(d, os.stat(d).st_uid)"
        ).split()
        folder, uid = folder
    roots = tempfile.mkdtemp(prefix="jupyter-server-proxy-")
    try:
        assert uid != "0"
        # (Where the server has a /tmp of its own (issue 23), the node's never sees the folder.)
        hub.stop_server(user)
        assert not os.path.exists(folder)
        assert os.path.isdir(roots)
    finally:
        os.rmdir(roots)


# A user's own Jupyter config: the server forks a helper that ignores SIGTERM, SIGINT and SIGHUP
# (and says its pid), then never listens.
HANGING_CONFIG = """
import os, signal, time
if os.fork() == 0:
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with open(os.path.expanduser("~/helper.pid"), "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)
time.sleep(3600)
"""

START_TIMEOUT = 15


def test_a_failed_start_frees_its_cards_only_once_its_processes_are_gone(hub_factory) -> None:
    """A server that never listens within ``start_timeout``: its cards went back to the pool on
    the exception, then the clean-up skipped the kill (no allocation any more), and its helper
    lived on in its cgroup until the periodic sweep (empty cgroups stayed where none ran)."""
    tree = Cgroups.detect()
    assert tree is not None, "a root hub here runs servers in cgroups"
    hub = hub_factory(
        "failed-start",
        simulate="A100-80G:2",
        extra_args=[f"--GpuLocalSpawner.start_timeout={START_TIMEOUT}"],
    )
    hub_id = (hub.data_dir / "hub-id").read_text().strip()
    user = hub.create_user()
    hub.spawn_ready(user, {"gpu": "none"})
    with hub.kernel(user) as k:
        home = k.execute(
            "import os\n"
            "os.makedirs(os.path.expanduser('~/.jupyter'), exist_ok=True)\n"
            f"open(os.path.expanduser('~/.jupyter/jupyter_server_config.py'), 'w').write({HANGING_CONFIG!r})\n"
            "print(os.path.expanduser('~'))"
        ).strip()
    hub.stop_server(user)
    pid_file = Path(home) / "helper.pid"

    r = hub.spawn(user, {"gpu": "a100-80g", "gpus": 2})
    assert r.status_code in (201, 202), r.text
    helper = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the helper"))
    assert alive(helper) and hub.free("a100-80g") == 0
    # The moment the cards are back, nothing of that server may run any more.
    wait_for(lambda: hub.free("a100-80g") == 2, timeout=START_TIMEOUT + 60, interval=0.02)
    assert not alive(helper), "the cards went back while the failed server's helper still ran"
    assert not [g for g in tree.groups() if g.startswith(f"{hub_id}-")]
    wait_for(lambda: hub.server(user) is None, what="the failed server to be gone")
    # The user's next start works once they remove their broken config.
    os.unlink(Path(home) / ".jupyter" / "jupyter_server_config.py")
    hub.spawn_ready(user, {"gpu": "a100-80g", "gpus": 1})
    hub.stop_server(user)
