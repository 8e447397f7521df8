"""Resumable uploads into a user's home, kept by the hub while they arrive.

A user brings data without holding a GPU (or any server): the hub takes the file in chunks
(``hub_config/api/uploads.py``, a tus-like protocol) and, once every byte is there, puts it into
the home. This module is the part that touches the disk; everything in it blocks (the hub calls
it in a thread).

- **Pending data lives outside the user's reach**: ``{data_dir}/uploads/NAME/ID/`` (root's,
  0700) holds ``meta.json`` (the destination, the declared size, who made it) and ``data`` (the
  bytes received so far: its length *is* the upload's offset, so a dropped connection leaves the
  offset at what was written). A pending upload reserves its whole declared size against the
  user's quota (:meth:`UploadStore.pending_bytes`) and expires ``expire_seconds`` after its
  last accepted write (:meth:`UploadStore.sweep`; a last chunk refused for want of room does
  not extend it, :meth:`UploadStore.keep_expiry`). What the pending files hold on the node's
  disk (:meth:`UploadStore.held_bytes`, allocated blocks) counts like published datasets in
  the hub's storage answers and in billing, so bytes parked here are never free storage.
- **Root never acts on a path the user controls**: the destination is reached from the home's
  descriptor one folder at a time with ``O_NOFOLLOW`` (a link anywhere on the way is refused, a
  mount below the home, such as a dataset, too, and so is a folder the home's owner does not own,
  such as an image's root-owned ``lost+found``), folders it makes are handed to the home's owner
  through their own descriptor, the file is written under a fresh name with ``O_EXCL`` and put in
  place by ``rename`` inside that folder's descriptor, which replaces a directory entry and never
  writes through one. Only a regular file at the destination is replaced.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import stat
import threading
import time
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

from gpulab.spawners.storage.homes import HomeStore

ID_CHARS = 32  # hex digits of an upload's id (128 random bits)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_PREFIX = ".gpulab-upload-"
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
# Unicode categories refused in a path: controls, formats (bidi overrides such as U+202E, zero
# widths), unpaired surrogates, line and paragraph separators: a name that reads unlike it is.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


class UploadError(ValueError):
    """A refused upload request; ``field`` names what was wrong, ``offset`` is the upload's
    offset where the caller needs it (a chunk at the wrong offset)."""

    def __init__(
        self, message: str, field: str, status: int = 400, offset: int | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.status = status
        self.offset = offset


@dataclass(frozen=True)
class Upload:
    """One upload as its ``meta.json`` records it."""

    id: str
    user: str  # the home's name (homes.home_name)
    path: str  # destination, relative to the home
    size: int  # declared bytes
    created: float
    complete: bool = False

    def as_json(self, offset: int, expires_at: float) -> dict[str, Any]:
        return {**asdict(self), "offset": offset, "expires_at": expires_at}


def clean_path(path: Any) -> list[str]:
    """The destination's components, or UploadError naming ``path``: relative to the home, no
    empty, ``.`` or ``..`` component, no control, invisible formatting (bidi overrides, zero
    widths) or line/paragraph separator characters, within the kernel's lengths."""
    allowed = (
        "a path relative to your home with '/' between folders, e.g. data/faces.zip "
        "(no leading '/', no '.' or '..', no empty parts, no control or invisible formatting "
        "characters)"
    )
    if not isinstance(path, str) or not path:
        raise UploadError(f"path is required: {allowed}", "path")
    if path.startswith("/"):
        raise UploadError(f"path must not be absolute: {allowed}", "path")
    bad = next((c for c in path if unicodedata.category(c) in _REFUSED_CATEGORIES), None)
    if bad is not None:
        raise UploadError(
            f"path holds a control or invisible formatting character (U+{ord(bad):04X}): {allowed}",
            "path",
        )
    parts = path.split("/")
    if ".." in parts:
        raise UploadError(f"path must not leave your home ('..'): {allowed}", "path")
    if any(p in ("", ".") for p in parts):
        raise UploadError(f"path has an empty or '.' part: {allowed}", "path")
    if len(path.encode()) > MAX_PATH_BYTES or any(len(p.encode()) > MAX_NAME_BYTES for p in parts):
        raise UploadError(
            f"path is too long (at most {MAX_PATH_BYTES} bytes, {MAX_NAME_BYTES} per name)",
            "path",
        )
    if parts[-1].startswith(_TEMP_PREFIX):
        raise UploadError(f"path: names starting with {_TEMP_PREFIX} are the hub's", "path")
    return parts


def clean_size(size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise UploadError("size must be the file's length in bytes (an integer >= 0)", "size")
    return size


class UploadStore(LoggingConfigurable):
    """The pending uploads of this hub's users, and how they reach a home."""

    expire_seconds = Float(
        86400.0,
        config=True,
        help="""Seconds after its last chunk that an unfinished upload is removed (its bytes
        are deleted and its space goes back to the user's quota).""",
    )

    sweep_seconds = Float(
        300.0,
        config=True,
        help="""Seconds between sweeps for expired uploads (a random jitter of up to 10% is
        added).""",
    )

    max_chunk_bytes = Integer(
        64 * 2**20,
        config=True,
        help="""The largest chunk (PATCH body) the hub accepts, in bytes; a larger one is a 413
        naming Content-Length. Clients send smaller chunks and resume after a dropped one.""",
    )

    stale_seconds = Float(
        60.0,
        config=True,
        help="""Seconds a chunk may send nothing before another chunk of the same upload takes
        over (its connection is closed; what it wrote stays). Covers a client whose connection
        died without the hub hearing of it.""",
    )

    max_pending = Integer(
        20,
        config=True,
        help="""How many unfinished uploads one user may have at once (each reserves its size
        against the quota until it completes or expires).""",
    )

    def __init__(self, data_dir: str | os.PathLike, homes: HomeStore, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data_dir = Path(data_dir)
        self.homes = homes
        self._lock = threading.Lock()
        self._user_locks: dict[str, threading.Lock] = {}  # one reservation check per user at once

    # ---- where -------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.data_dir / "uploads"

    def _dir(self, user: str, upload_id: str | None = None) -> Path:
        d = self.root / user
        return d / upload_id if upload_id else d

    def _made_dir(self, path: Path) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)

    # ---- records -----------------------------------------------------------------------------

    def get(self, user: str, upload_id: str) -> Upload | None:
        if len(upload_id) != ID_CHARS or not all(c in "0123456789abcdef" for c in upload_id):
            return None
        try:
            raw = json.loads((self._dir(user, upload_id) / "meta.json").read_text())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        return Upload(**raw)

    def offset(self, upload: Upload) -> int:
        """Bytes received so far (the length of its data; all of it once complete)."""
        if upload.complete:
            return upload.size
        try:
            return os.stat(self._dir(upload.user, upload.id) / "data").st_size
        except FileNotFoundError:
            return 0

    def last_write(self, upload: Upload) -> float:
        d = self._dir(upload.user, upload.id)
        for name in ("data", "meta.json"):
            try:
                return os.stat(d / name).st_mtime
            except FileNotFoundError:
                continue
        return upload.created

    def keep_expiry(self, upload: Upload, last_write: float) -> None:
        """Put the upload's last write back at ``last_write``: a chunk whose end was refused
        (no room in the home) does not extend how long the upload's bytes are kept."""
        try:
            os.utime(self._dir(upload.user, upload.id) / "data", (last_write, last_write))
        except FileNotFoundError:
            pass

    def expires_at(self, upload: Upload) -> float:
        return self.last_write(upload) + self.expire_seconds

    def describe(self, upload: Upload) -> dict[str, Any]:
        return upload.as_json(self.offset(upload), self.expires_at(upload))

    def _write_meta(self, upload: Upload) -> None:
        d = self._dir(upload.user, upload.id)
        tmp = d / "meta.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(upload), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, d / "meta.json")

    def list(self, user: str) -> list[Upload]:
        try:
            ids = sorted(p.name for p in self._dir(user).iterdir())
        except FileNotFoundError:
            return []
        found = (self.get(user, i) for i in ids)
        return sorted((u for u in found if u is not None), key=lambda u: u.created)

    def pending_bytes(self, user: str) -> int:
        """What ``user``'s unfinished uploads reserve against their quota (declared sizes)."""
        return sum(u.size for u in self.list(user) if not u.complete)

    def held_bytes(self, user: str) -> int:
        """What ``user``'s unfinished uploads hold on the node's disk now (the pending files'
        allocated blocks): counted beside the home and the datasets in storage answers and
        billing."""
        total = 0
        for upload in self.list(user):
            if upload.complete:
                continue
            try:
                total += os.stat(self._dir(user, upload.id) / "data").st_blocks * 512
            except FileNotFoundError:
                continue
        return total

    # ---- making one --------------------------------------------------------------------------

    def create(
        self, user: str, path: Any, size: Any, owner: tuple[int, int] | None, quota_extra: int = 0
    ) -> Upload:
        """A new upload of ``size`` bytes to ``path`` in ``user``'s home (ensured, owned by
        ``owner``). Refused up front (UploadError) when the destination cannot be written (409
        naming ``path``) or when what the home holds, ``quota_extra`` (bytes counted against the
        quota besides the home, e.g. published datasets), the pending uploads and ``size``
        exceed the quota (413 naming ``size``)."""
        parts = clean_path(path)
        size = clean_size(size)
        home = self.homes.ensure(user, *(owner or (None, None)))
        self._precheck_target(home, parts, owner)
        with self._lock:
            lock = self._user_locks.setdefault(user, threading.Lock())
        with lock:
            pending = [u for u in self.list(user) if not u.complete]
            if len(pending) >= self.max_pending:
                raise UploadError(
                    f"size: you have {len(pending)} unfinished uploads (at most "
                    f"{self.max_pending}); finish or cancel one first",
                    "size",
                    409,
                )
            usage = self.homes.usage(user)
            reserved = sum(u.size for u in pending)
            if usage.used_bytes + quota_extra + reserved + size > usage.quota_bytes:
                free = max(0, usage.quota_bytes - usage.used_bytes - quota_extra - reserved)
                raise UploadError(
                    f"size: {size} bytes do not fit in your storage: your home holds "
                    f"{usage.used_bytes} of {usage.quota_bytes} bytes"
                    + (f", your datasets {quota_extra}" if quota_extra else "")
                    + (f", unfinished uploads reserve {reserved}" if reserved else "")
                    + f"; {free} bytes are free. Delete files, cancel an upload or raise "
                    "your quota.",
                    "size",
                    413,
                )
            upload = Upload(
                id=secrets.token_hex(ID_CHARS // 2),
                user=user,
                path="/".join(parts),
                size=size,
                created=time.time(),
            )
            d = self._dir(user, upload.id)
            self._made_dir(d)
            fd = os.open(d / "data", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.close(fd)
            self._write_meta(upload)
        return upload

    def _precheck_target(
        self, home: Path, parts: list[str], owner: tuple[int, int] | None = None
    ) -> None:
        """Refuse early what :meth:`finish` would refuse: a link, a non-folder or a folder the
        home's owner does not own on the way, or something other than a regular file at the
        destination (nothing is made here)."""
        home_fd = os.open(home, _DIR_FLAGS)
        try:
            parent = _walk(home_fd, parts, create=False, owner=owner)
            if parent is None:
                return  # folders still to be made: nothing in the way yet
            try:
                st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                return
            finally:
                os.close(parent)
            if not stat.S_ISREG(st.st_mode):
                raise UploadError(_not_a_file(parts), "path", 409)
        finally:
            os.close(home_fd)

    # ---- chunks ------------------------------------------------------------------------------

    def open_data(self, upload: Upload) -> int:
        """A descriptor to append chunks to (the caller holds the upload's writer lock)."""
        return os.open(self._dir(upload.user, upload.id) / "data", os.O_WRONLY | os.O_CLOEXEC)

    # ---- finishing ---------------------------------------------------------------------------

    def finish(self, upload: Upload, owner: tuple[int, int] | None, quota_extra: int = 0) -> Upload:
        """Put a fully received upload at its destination in the home, owned by ``owner``;
        the pending bytes go. UploadError (nothing changes, the upload stays pending, so the
        client may retry) when the destination became a link or a folder (409 naming ``path``),
        or the home has no room for it (413 naming ``size``)."""
        if upload.complete:
            return upload
        d = self._dir(upload.user, upload.id)
        received = self.offset(upload)
        if received != upload.size:
            raise UploadError(
                f"Upload-Offset: {received} of {upload.size} bytes received",
                "Upload-Offset",
                409,
                offset=received,
            )
        parts = upload.path.split("/")
        home = self.homes.ensure(upload.user, *(owner or (None, None)))
        src = os.open(d / "data", os.O_RDONLY | os.O_CLOEXEC)
        home_fd = os.open(home, _DIR_FLAGS)
        parent = None
        try:
            parent = _walk(home_fd, parts, create=True, owner=owner)
            assert parent is not None
            name = parts[-1]
            replaced = _regular_or_absent(parent, name, parts)
            # Checked again at the end: the home may have grown since the start (and with the
            # directory backend nothing below enforces the quota; datasets count on top).
            usage = self.homes.usage(upload.user)
            after = usage.used_bytes - replaced + quota_extra + upload.size
            if after > usage.quota_bytes:
                free = usage.quota_bytes - usage.used_bytes - quota_extra + replaced
                raise UploadError(_full(upload, free), "size", 413)
            _place(src, parent, name, upload, owner)
        finally:
            for fd in (src, home_fd, parent):
                if fd is not None:
                    os.close(fd)
        done = Upload(**{**asdict(upload), "complete": True})
        self._write_meta(done)
        try:
            os.unlink(d / "data")
        except FileNotFoundError:
            pass
        return done

    # ---- removing ----------------------------------------------------------------------------

    def remove(self, upload: Upload) -> None:
        shutil.rmtree(self._dir(upload.user, upload.id), ignore_errors=True)

    def sweep(self, now: float | None = None, busy: set[str] = frozenset()) -> list[Upload]:
        """Remove every upload whose last write is ``expire_seconds`` old (none in ``busy``, the
        ids being written now); the removed ones."""
        now = time.time() if now is None else now
        removed = []
        try:
            users = [p.name for p in self.root.iterdir()]
        except FileNotFoundError:
            return []
        for user in users:
            for upload in self.list(user):
                if upload.id not in busy and self.expires_at(upload) <= now:
                    self.remove(upload)
                    removed.append(upload)
            try:
                self._dir(user).rmdir()  # empty now
            except OSError:
                pass
        return removed


# ---- below the home: descriptors only ---------------------------------------------------------


def _not_a_file(parts: list[str]) -> str:
    return (
        f"path: {'/'.join(parts)} is a folder, a link or a special file in your home; only a "
        "regular file is replaced. Choose another name or remove it first."
    )


def _full(upload: Upload, free: int) -> str:
    return (
        f"size: your home has no room for {upload.path} ({upload.size} bytes; {max(0, free)} "
        "free). Delete files or raise your quota, then send the last chunk again (an empty "
        "PATCH at the final offset)."
    )


def _walk(home_fd: int, parts: list[str], *, create: bool, owner: tuple[int, int] | None):
    """A descriptor of the destination's folder, reached from the home without following a link,
    leaving the home's filesystem or entering a folder the home's owner does not own (root's
    ``lost+found``: what root wrote there its owner could neither see nor delete); None when a
    folder is missing and ``create`` is false. Folders made here are given to ``owner`` through
    their own descriptor."""
    top = os.fstat(home_fd)
    dev = top.st_dev
    home_uid = owner[0] if owner is not None and owner[0] != 0 else top.st_uid
    fd = os.dup(home_fd)
    try:
        for i, part in enumerate(parts[:-1]):
            so_far = "/".join(parts[: i + 1])
            made = False
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass  # made meanwhile: opened (or refused) below like any other
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    raise _in_the_way(so_far, e) from None
            except OSError as e:
                raise _in_the_way(so_far, e) from None
            st = os.fstat(nxt)
            if st.st_dev != dev:
                os.close(nxt)
                raise UploadError(
                    f"path: {so_far} is not part of your home (a dataset, the model store or "
                    "another mount); choose a folder of your own",
                    "path",
                    409,
                )
            if made and owner is not None and owner[0] != 0 and st.st_uid == 0:
                os.fchown(nxt, *owner)
            elif st.st_uid != home_uid:
                os.close(nxt)
                raise UploadError(
                    f"path: {so_far} in your home is not yours (e.g. the filesystem's "
                    "lost+found, root's); files are only put in folders you own. Choose "
                    "another folder.",
                    "path",
                    409,
                )
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _in_the_way(so_far: str, e: OSError) -> UploadError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
        return UploadError(
            f"path: {so_far} in your home is a link or a file, not a folder; links are never "
            "followed. Choose another folder.",
            "path",
            409,
        )
    return UploadError(f"path: {so_far} cannot be opened ({os.strerror(e.errno)})", "path", 409)


def _regular_or_absent(parent: int, name: str, parts: list[str]) -> int:
    """Bytes the destination holds now (0 when absent); UploadError when it is no regular file."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode):
        raise UploadError(_not_a_file(parts), "path", 409)
    return st.st_blocks * 512 if st.st_nlink == 1 else 0


def _place(src: int, parent: int, name: str, upload: Upload, owner: tuple[int, int] | None) -> None:
    """Copy ``src`` into a fresh file in ``parent``, then rename it to ``name`` there."""
    tmp = f"{_TEMP_PREFIX}{upload.id}"
    try:
        os.unlink(tmp, dir_fd=parent)  # a previous try's (unlink never follows a link)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        raise UploadError(_not_a_file([*upload.path.split("/")[:-1], tmp]), "path", 409) from None
    out = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=parent,
    )
    placed = False
    try:
        if owner is not None and owner[0] != 0:
            os.fchown(out, *owner)
        copied = 0
        while copied < upload.size:
            try:
                n = os.copy_file_range(src, out, min(upload.size - copied, 2**30), copied, copied)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise UploadError(_full(upload, 0), "size", 413) from None
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                try:
                    n = _copy_plain(src, out, copied, upload.size - copied)
                except OSError as e2:
                    if e2.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise UploadError(_full(upload, 0), "size", 413) from None
                    raise
            if n == 0:
                raise UploadError(
                    "Upload-Offset: the pending data is shorter than its size", "Upload-Offset", 409
                )
            copied += n
        try:
            os.fsync(out)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise UploadError(_full(upload, 0), "size", 413) from None
            raise
        try:
            os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except (IsADirectoryError, NotADirectoryError, OSError) as e:
            if isinstance(e, IsADirectoryError | NotADirectoryError) or e.errno in (
                errno.EISDIR,
                errno.ENOTEMPTY,
                errno.EEXIST,
            ):
                raise UploadError(_not_a_file(upload.path.split("/")), "path", 409) from None
            raise
        placed = True
        os.fsync(parent)
    finally:
        os.close(out)
        if not placed:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass


def _copy_plain(src: int, out: int, at: int, count: int) -> int:
    """Copy up to ``count`` bytes at ``at`` by read and write (filesystems without
    copy_file_range across them); bytes copied."""
    done = 0
    while done < count:
        buf = os.pread(src, min(count - done, 8 * 2**20), at + done)
        if not buf:
            break
        os.pwrite(out, buf, at + done)  # a regular file takes all of it, or raises
        done += len(buf)
    return done
