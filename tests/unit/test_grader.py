"""The grading sandbox's file handling without a hub: what root unpacks into a sandbox and what it
reads back never follows a link the student's code could plant (spawners/local/grader.py)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest
from harness import wait_for

from gpulab.spawners.local import grader

# Grading sandboxes share the machine's "gpulab-grading" cgroups and grading uids: a hub's grading
# sweeps orphaned groups and the tests count those machine-wide, so gradings never run side by side
# (one worker of a parallel run runs these modules one after another).
pytestmark = pytest.mark.xdist_group("grading")


def tar_of(*members: tuple[str, bytes | None, bytes]) -> bytes:
    """A tar of (name, link target or None, content) entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        for name, link, data in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_unpack_takes_regular_files_and_refuses_escapes(tmp_path) -> None:
    dest = tmp_path / "work"
    dest.mkdir()
    data = tar_of(
        ("submitted/s/ps1/ps1.ipynb", None, b"{}"),
        ("submitted/s/ps1/secret", b"/etc/shadow", b""),
    )
    grader._unpack(data, dest, 1 << 20)
    assert (dest / "submitted/s/ps1/ps1.ipynb").read_bytes() == b"{}"
    assert not os.path.lexists(dest / "submitted/s/ps1/secret")
    for bad in ("../outside", "/abs/path", "a/../../b"):
        with pytest.raises(grader.GradingError, match="refused a path"):
            grader._unpack(tar_of((bad, None, b"x")), dest, 1 << 20)
    assert not (tmp_path / "outside").exists()
    with pytest.raises(grader.GradingError, match="larger than"):
        grader._unpack(tar_of(("big", None, b"x" * 2048)), dest, 1024)


def test_read_outputs_follows_no_link(tmp_path) -> None:
    work = tmp_path / "work"
    out = work / "autograded" / "s" / "ps1"
    out.mkdir(parents=True)
    (out / "ps1.ipynb").write_text('{"ok": 1}')
    secret = tmp_path / "secret.ipynb"
    secret.write_text("root's secret")
    (out / "leak.ipynb").symlink_to(secret)
    assert grader._read_outputs(work, "s", "ps1", 1 << 20) == {"ps1.ipynb": '{"ok": 1}'}
    # A link in place of a folder on the way: nothing is read through it.
    other = tmp_path / "other"
    (other / "s" / "ps1").mkdir(parents=True)
    (other / "s" / "ps1" / "x.ipynb").write_text("elsewhere")
    work2 = tmp_path / "work2"
    work2.mkdir()
    (work2 / "autograded").symlink_to(other)
    assert grader._read_outputs(work2, "s", "ps1", 1 << 20) == {}


def test_export_leaves_links_out(tmp_path) -> None:
    src = tmp_path / "sub"
    src.mkdir()
    (src / "ps1.ipynb").write_text("{}")
    (src / "teacher_key").symlink_to(Path("/etc/hostname"))
    (src / "dir_link").symlink_to(tmp_path, target_is_directory=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        grader._add_tree(tar, src, "submitted/s/ps1", False)
    names = tarfile.open(fileobj=io.BytesIO(buf.getvalue())).getnames()
    assert sorted(names) == ["submitted/s/ps1", "submitted/s/ps1/ps1.ipynb"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (namespaces, setuid)")
def test_sandbox_ends_at_its_time_limit_without_the_hub(tmp_path) -> None:
    """A hub that dies mid-grading enforces nothing: the sandbox still ends itself (``timeout``
    as root around ``unshare --kill-child``), every process in it included, and has no network."""
    import subprocess
    import time

    uid = 2_100_000_000 + os.getpid() % 1_000_000
    work = tmp_path / "work"
    (work / "home").mkdir(parents=True)
    marker = f"grader-test-{uid}"
    # nbgrader reads ./nbgrader_config.py first: this one detaches a process and loops.
    (work / "nbgrader_config.py").write_text(
        "import socket, subprocess, sys\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    open('net', 'w').write('reached')\n"
        "except OSError:\n"
        "    open('net', 'w').write('none')\n"
        "subprocess.Popen(['setsid', sys.executable, '-c', 'import time; time.sleep(1000)', "
        f"'{marker}'], start_new_session=True)\n"
        "while True:\n"
        "    pass\n"
    )
    grader._chown_tree(work, uid)
    os.chmod(tmp_path, 0o711)
    for parent in tmp_path.parents:
        if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
            pytest.skip(f"{parent} is not passable for other users")
    started = time.monotonic()
    proc = subprocess.run(
        grader._helper(
            "sandbox", "--uid", str(uid), "--work", str(work), "--time-limit", "1", "ps1", "s"
        ),
        capture_output=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert proc.returncode != 0
    assert 10 <= took < 30, took
    assert (work / "net").read_text() == "none"

    def left() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            try:
                if (
                    entry.isdigit()
                    and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes()
                ):
                    found.append(int(entry))
            except OSError:
                pass
        return found

    assert left() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
def test_sweep_empties_grading_cgroups_no_grading_runs_in() -> None:
    """A hub that stopped mid-grading leaves its sandboxes' cgroups: the next grading empties and
    removes them, and leaves a running grading's group alone."""
    import subprocess

    from gpulab.spawners.local.cgroup import Cgroups, Limits

    tree = Cgroups.detect(parent=f"gpulab-grading-test-{os.getpid()}")
    if tree is None:
        pytest.skip("no writable cgroups")
    orphan, running = tree.group("orphan"), tree.group("running")
    procs = []
    try:
        for group in (orphan, running):
            group.create(Limits(pids=16))
            procs.append(
                subprocess.Popen(["sh", "-c", f"echo $$ > {group.procs_files[0]}; exec sleep 1000"])
            )
        wait_for(lambda: orphan.pids() and running.pids(), what="both groups populated")
        grader.ACTIVE.add("running")
        assert grader.sweep_orphans(tree) == ["orphan"]
        assert procs[0].wait(timeout=10) == -9
        assert not orphan.exists() and running.pids() and procs[1].poll() is None
    finally:
        grader.ACTIVE.discard("running")
        for group in (orphan, running):
            if group.exists():
                group.kill_all()
                group.remove()
        for p in procs:
            p.wait(timeout=10)
        for path in tree.paths.values():
            path.rmdir()


def test_software_in_a_folder_the_sandbox_makes_private_is_bound_back(monkeypatch, tmp_path):
    """A checkout and its venv under /tmp (CI clones there) would vanish under the sandbox's
    private /tmp: nbgrader was 'No such file'. They are listed, outermost first, to be bound
    back read-only."""
    checkout = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        venv = checkout / ".venv"
        (venv / "lib").mkdir(parents=True)
        monkeypatch.setattr(grader.sys, "prefix", str(venv))
        monkeypatch.setattr(grader.sys, "path", [str(venv / "lib"), str(tmp_path), ""])
        listed = grader._software_under_tmp()
        assert str(venv) in listed
        assert str(venv / "lib") not in listed  # inside one already listed
        assert all(p.startswith(("/tmp/", "/var/tmp/", "/dev/shm/", "/run/lock/")) for p in listed)
    finally:
        shutil.rmtree(checkout)
