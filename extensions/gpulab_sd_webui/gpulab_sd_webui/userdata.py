"""A per-user file store like ComfyUI's ``/userdata/{file}``: ``file`` is one URL path segment in
which an encoded slash (``%2F``) names a sub-folder, e.g. ``workflows%2Fmy.json`` ->
``DATA_DIR/userdata/workflows/my.json``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# mkstemp creates 0600; stored files get the mode a plain open() would give them. Read once, at
# import (the main thread, before any other): os.umask() sets while it reads.
_UMASK = os.umask(0)
os.umask(_UMASK)


class BadPath(ValueError):
    pass


def resolve(root: Path, name: str) -> Path:
    """The file ``name`` (already %-decoded) stands for under ``root``; BadPath for names that
    would leave it (``..``, absolute paths, empty parts)."""
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        raise BadPath(f"file: got {name!r}; allowed: a relative path such as workflows%2Fmy.json")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BadPath(f"file: got {name!r}; allowed: path parts other than '', '.' and '..'")
    path = root.joinpath(*parts)
    # A symlink inside the store must not lead a name out of it either.
    if not path.resolve().is_relative_to(root.resolve()):
        raise BadPath(f"file: got {name!r}; it leads out of the user-data folder")
    return path


def read(root: Path, name: str) -> bytes | None:
    """The file's bytes, or None when there is no such file."""
    path = resolve(root, name)
    try:
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def write(root: Path, name: str, data: bytes, overwrite: bool = True) -> Path | None:
    """Store ``data`` as ``name`` (creating sub-folders); a reader sees the old or the new file,
    never half of one. None when the file exists and ``overwrite`` is false."""
    root.mkdir(parents=True, exist_ok=True)
    path = resolve(root, name)
    if path.exists() and not overwrite:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
