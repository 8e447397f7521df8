"""The grading sandbox's file handling without a hub: what root unpacks into a sandbox and what it
reads back never follows a link the student's code could plant (spawners/local/grader.py)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpulab.spawners.local import grader


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
