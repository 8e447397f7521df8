"""The home store: one persistent home per user, its quota and its measured usage.

Every spawner asks the store for a user's home before a server starts (``ensure``), the hub's
storage API and billing's metering read ``usage``/``scan``, and a user raises their quota with
``set_quota``. Two backends sit behind one interface:

- ``image``: each home is a filesystem image of its own, loop-mounted at the home's path, so the
  kernel enforces the quota (ENOSPC in the writer's code), hard links cannot cross into another
  home, and measuring a home is one ``statvfs`` (see :mod:`.loopfs`). Needs root.
- ``directory``: a plain folder, measured by a walk that never follows a link and never leaves
  the home's filesystem. Nothing is enforced, and every answer says so (``enforced: false``).

All methods block (filesystem calls, mounts): the hub calls them in a thread.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from traitlets import Unicode
from traitlets.config import LoggingConfigurable

from gpulab.catalog.models import Storage
from gpulab.spawners.storage.loopfs import ImageError, ImageHomes, can_loop_mount, mounts

MODES = ("auto", "image", "directory")


class StorageError(ValueError):
    """A quota or home request that cannot be done; ``field`` names what was wrong."""

    def __init__(self, message: str, field: str = "quota_gb", status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass(frozen=True)
class HomeUsage:
    """One home as the hub measured it."""

    name: str
    used_bytes: int
    quota_bytes: int
    files: int | None  # files and folders (inodes) in use, where known
    files_limit: int | None  # most files the home can hold (image backend), else None
    enforced: bool  # the kernel refuses writes past quota_bytes
    measured_at: float  # unix time of the measurement

    @property
    def percent(self) -> float:
        return 100.0 * self.used_bytes / self.quota_bytes if self.quota_bytes else 0.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["percent"] = round(self.percent, 2)
        return out


# An escape as home_name writes it: a character's code point in lowercase hex between dashes.
_ESCAPE = re.compile(r"-[0-9a-f]+-")
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")


def home_name(user_name: str) -> str:
    """A user name made safe as one path component, and never another user's (issue 23).

    Every per-user path and key (``users/NAME``, its image, uploads, private datasets, quota,
    keeper record, server log, exchange folder) goes through this one rule; the spawners'
    ``user_home_name`` calls it. A name of letters, digits, ``_`` and ``-`` holding no escape
    (``-hex-``) is used as it is (``alice``, ``fay-z``). Every other name has each character
    outside ``[A-Za-z0-9_]``, ``-`` included, written as ``-hex-`` (``fay.z`` -> ``fay-2e-z``,
    ``fay-2e-z`` -> ``fay-2d-2e-2d-z``). Injective: a plain name holds no escape and an escaped
    one always does, and in an escaped one every ``-`` opens or closes an escape, so it reads
    back one way only. (The old rule kept a literal ``-`` everywhere: ``fay.z`` and ``fay-2e-z``
    shared one home.) Names the old rule wrote differently are adopted by the local spawner
    (:func:`legacy_home_name`)."""
    if _PLAIN.fullmatch(user_name) and not _ESCAPE.search(user_name):
        return user_name
    return "".join(
        ch if ch.isascii() and (ch.isalnum() or ch == "_") else f"-{ord(ch):x}-" for ch in user_name
    )


def legacy_home_name(user_name: str) -> str:
    """The home name the old, non-injective rule gave ``user_name`` (a literal ``-`` kept):
    where a home made before issue 23's fix may still lie."""
    return "".join(
        ch if ch.isascii() and (ch.isalnum() or ch in "_-") else f"-{ord(ch):x}-"
        for ch in user_name
    )


def walk_usage(root: Path) -> tuple[int, int]:
    """(bytes allocated, files) under ``root``: hard links counted once, links never followed,
    nothing outside ``root``'s filesystem. Sparse files count what they hold, not their length."""
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return 0, 0
    if not stat.S_ISDIR(top.st_mode):
        return 0, 0
    seen: set[tuple[int, int]] = set()
    used = 0
    for _dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
        keep = []
        for name in dirnames + filenames:
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if st.st_dev != top.st_dev:
                continue  # a mount below the home (a dataset bind) is not the home's
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            used += st.st_blocks * 512
            if name in dirnames and stat.S_ISDIR(st.st_mode):
                keep.append(name)
        dirnames[:] = [d for d in dirnames if d in keep]
    return used + top.st_blocks * 512, len(seen) + 1


def mount_points() -> list[str]:
    """Every mount point this process sees (``/proc/self/mountinfo``, octal escapes undone)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    return [
        re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        for line in lines
        if len(line.split()) > 4
    ]


def remove_tree(root: Path) -> None:
    """Delete ``root`` and all below it: links are removed, never followed, and a folder of
    another filesystem (a mount) below it stops the removal before anything is deleted."""
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        os.unlink(root)
        return
    # A bind mount of the same filesystem has the same st_dev: the mount table names them all.
    inside = [m for m in mount_points() if m.startswith(f"{os.path.realpath(root)}/")]
    if inside:
        raise OSError(errno.EBUSY, "another filesystem is mounted here", inside[0])
    for dirpath, dirnames, _files, dirfd in os.fwalk(root, follow_symlinks=False):
        for name in dirnames:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) and st.st_dev != top.st_dev:
                raise OSError(
                    errno.EXDEV, "another filesystem is mounted here", f"{dirpath}/{name}"
                )
    for _dirpath, dirnames, filenames, dirfd in os.fwalk(
        root, topdown=False, follow_symlinks=False
    ):
        for name in filenames:
            os.unlink(name, dir_fd=dirfd)
        for name in dirnames:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.rmdir(name, dir_fd=dirfd)
            else:
                os.unlink(name, dir_fd=dirfd)
    os.rmdir(root)


class HomeStore(LoggingConfigurable):
    """The homes of this node's users (one per hub process, made by the pool)."""

    mode = Unicode(
        "auto",
        config=True,
        help="""How homes are kept and their quota enforced: 'image' (a filesystem image per
        user, loop-mounted at the home: the kernel enforces the quota; needs root), 'directory'
        (plain folders: usage is measured but not enforced, and every answer says so), or 'auto'
        (image where the hub runs as root and can loop-mount, else directory).""",
    )

    def __init__(self, data_dir: str | os.PathLike, storage: Storage, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.mode not in MODES:
            raise ValueError(f"HomeStore.mode: {self.mode!r} is not allowed; allowed: {MODES}")
        self.data_dir = Path(data_dir)
        self.storage = storage
        self._lock = threading.Lock()
        self._backend: str | None = None
        self._probe_lock = threading.Lock()
        self.images = ImageHomes(self.homes_dir, self.data_dir / "storage" / "images")

    # ---- where -------------------------------------------------------------------------------

    @property
    def homes_dir(self) -> Path:
        return self.data_dir / "users"

    def path(self, name: str) -> Path:
        """Where the home of ``name`` (a :func:`home_name`) lives on this machine."""
        return self.homes_dir / name

    @property
    def enforced(self) -> bool:
        """Whether the kernel enforces quotas on this hub."""
        return self.backend == "image"

    @property
    def backend(self) -> str:
        """'image' or 'directory'; 'auto' probes once whether this process can loop-mount."""
        if self._backend is None:
            with self._probe_lock:
                if self._backend is None:
                    self._backend = self._pick_backend()
        return self._backend

    def _pick_backend(self) -> str:
        if self.mode != "auto":
            return self.mode
        why_not = can_loop_mount(self.data_dir / "storage" / "probe")
        if why_not:
            self.log.warning("Homes are plain folders, their quotas NOT enforced: %s", why_not)
            return "directory"
        self.log.info("Homes are loop-mounted ext4 images: the kernel enforces their quotas")
        return "image"

    # ---- quotas ------------------------------------------------------------------------------

    @property
    def _quota_file(self) -> Path:
        return self.data_dir / "storage" / "quotas.json"

    def _quotas(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self._quota_file.read_text()).items()}
        except FileNotFoundError:
            return {}

    def quota(self, name: str) -> int:
        """The quota of ``name`` in bytes: the free size unless they raised it."""
        return self._quotas().get(name, self.storage.free_bytes)

    def set_quota(self, name: str, quota_bytes: int) -> HomeUsage:
        """Set the quota of ``name``: between the free size and the operator's maximum, and never
        below what the home holds now (StorageError naming ``quota_gb`` otherwise)."""
        s = self.storage
        if not s.free_bytes <= quota_bytes <= s.max_bytes:
            raise StorageError(
                f"quota_gb must be between {s.free_gb} and {s.max_gb} (GB); "
                f"got {quota_bytes / 2**30:.3f}"
            )
        with self._lock:
            now = self.usage(name)
            if quota_bytes < now.used_bytes:
                raise StorageError(
                    f"quota_gb: the home holds {now.used_bytes / 2**30:.3f} GB; delete files "
                    "first or choose a larger quota",
                    status=409,
                )
            if self.backend == "image":
                try:
                    self.images.resize(name, quota_bytes)
                except ImageError as e:
                    raise StorageError(f"quota_gb: {e}", status=e.status) from None
            quotas = self._quotas()
            if quota_bytes == s.free_bytes:
                quotas.pop(name, None)
            else:
                quotas[name] = quota_bytes
            self._write_quotas(quotas)
        return self.usage(name)

    def _write_quotas(self, quotas: dict[str, int]) -> None:
        path = self._quota_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(quotas, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # ---- homes -------------------------------------------------------------------------------

    def ensure(self, name: str, uid: int | None = None, gid: int | None = None) -> Path:
        """The home of ``name`` exists (and, with the image backend, is mounted at its path), its
        top folder owned by ``uid``:``gid`` when given. Idempotent."""
        if self.backend == "image":
            try:
                return self.images.ensure(name, self.quota(name), uid, gid)
            except (ImageError, OSError) as e:
                raise StorageError(f"home of {name}: {e}", field="home", status=500) from e
        home = self.path(name)
        home.mkdir(parents=True, exist_ok=True)
        if uid is not None:
            fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchown(fd, uid, -1 if gid is None else gid)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        return home

    def owner_of(self, name: str) -> int | None:
        """The uid owning the top folder of ``name``'s home (its image mounted first, without a
        change of owner), or None when there is no home yet."""
        if self.backend == "image" and self.images.image(name).exists():
            self.ensure(name)
        try:
            st = os.lstat(self.path(name))
        except FileNotFoundError:
            return None
        return st.st_uid if stat.S_ISDIR(st.st_mode) else None

    def adopt(self, old: str, new: str, uid: int) -> str | None:
        """Give the home made under the old home-name rule (``old``: a plain folder
        ``users/OLD`` or an image ``storage/images/OLD.img``) the name ``new``, with its quota
        and private datasets, when its top folder belongs to ``uid`` (the user's own account:
        account names are injective, the old home names were not). Renames only, inside the
        hub's own folders, never through a link; nothing is overwritten. Returns why a home
        found was left where it is (the caller logs it), or None (adopted, or nothing to adopt).
        StorageError 409 when the old home is in use by a running server."""
        if old == new or not _PLAIN.fullmatch(old) or not _PLAIN.fullmatch(new):
            return None
        is_image = self.backend == "image" and self.images.image(old).exists()
        if not is_image and not os.path.lexists(self.path(old)):
            return None
        with self._lock:
            if os.path.lexists(self.path(new)) or (
                self.backend == "image" and self.images.image(new).exists()
            ):
                return f"home {old} (old rule) left: {new} exists already"
            try:
                owner = self.owner_of(old)
            except (StorageError, OSError) as e:
                return f"home {old} (old rule) left: {e}"
            if owner != uid:
                return f"home {old} (old rule) left: owned by uid {owner}, not {uid}"
            try:
                if is_image:
                    self.images.unmount(old)
                    os.rename(self.images.image(old), self.images.image(new))
                    os.rmdir(self.path(old))  # the empty mount point
                else:
                    os.rename(self.path(old), self.path(new))
            except ImageError as e:
                raise StorageError(f"home: {e}", field="home", status=e.status) from None
            except OSError as e:
                return f"home {old} (old rule) left: {e}"
            quotas = self._quotas()
            if old in quotas:
                quotas[new] = quotas.pop(old)
                self._write_quotas(quotas)
            datasets = self.data_dir / "user-datasets"
            try:
                if not os.path.lexists(datasets / new):
                    os.rename(datasets / old, datasets / new)
            except FileNotFoundError:
                pass
            except OSError as e:
                self.log.warning("Private datasets of %s left at %s: %s", new, old, e)
        self.log.info("Home %s (old home-name rule) adopted as %s", old, new)
        return None

    def names(self) -> list[str]:
        """Every home on this node."""
        try:
            found = {p.name for p in self.homes_dir.iterdir() if not p.name.startswith(".")}
        except FileNotFoundError:
            found = set()
        return sorted(found | set(self.images.names()))

    def usage(
        self, name: str, quotas: dict[str, int] | None = None, table: list | None = None
    ) -> HomeUsage:
        """What the home of ``name`` holds, measured now by the hub (``quotas``: the quota
        file, ``table``: the mounts, when the caller read them already)."""
        quota = self.quota(name) if quotas is None else quotas.get(name, self.storage.free_bytes)
        if self.backend == "image":
            try:
                got = self.images.usage(name, table)
            except ImageError as e:
                self.log.warning("Home %s: %s", name, e)
                got = None
            if got is not None:
                return HomeUsage(
                    name=name,
                    used_bytes=got.used_bytes,
                    quota_bytes=quota,
                    files=got.files,
                    files_limit=got.files_limit,
                    enforced=True,
                    measured_at=time.time(),
                )
        # A plain folder (directory backend, or a home not yet moved into its image).
        used, files = walk_usage(self.path(name))
        return HomeUsage(
            name=name,
            used_bytes=used,
            quota_bytes=quota,
            files=files,
            files_limit=None,
            enforced=False,
            measured_at=time.time(),
        )

    # ---- release (hub_config/storage_keeper.py decides when) ----------------------------------

    RELEASED_PREFIX = ".released-"

    def release(self, name: str) -> bool:
        """Delete the home of ``name`` for good, with its quota. First moved aside in one rename
        (a ``.released-`` entry is no one's home: a server started afterwards gets a fresh home),
        then removed without following a link or leaving the home's filesystem. The caller has
        made sure no server of ``name`` runs or starts. False when there was no home. An image
        home is taken offline and its image deleted first (StorageError 409 while anything still
        holds it, and nothing changes)."""
        had_image = False
        if self.backend == "image":
            try:
                had_image = self.images.release(name)
            except ImageError as e:
                raise StorageError(f"home: {e}", field="home", status=e.status) from None
        home = self.path(name)
        trash = self.homes_dir / f"{self.RELEASED_PREFIX}{name}-{time.time_ns()}"
        with self._lock:
            try:
                os.rename(home, trash)
            except FileNotFoundError:
                return had_image
            quotas = self._quotas()
            if quotas.pop(name, None) is not None:
                self._write_quotas(quotas)
        remove_tree(trash)
        return True

    def purge_released(self) -> list[str]:
        """Finish the releases a crash or an error interrupted; the entries still left."""
        left = []
        try:
            entries = [
                p for p in self.homes_dir.iterdir() if p.name.startswith(self.RELEASED_PREFIX)
            ]
        except FileNotFoundError:
            return []
        for trash in entries:
            try:
                remove_tree(trash)
            except OSError as e:
                self.log.error("Removing the released home %s failed: %s", trash, e)
                left.append(trash.name)
        return left

    def scan(self) -> list[HomeUsage]:
        """Every home's usage, largest first."""
        quotas = self._quotas()
        table = mounts() if self.backend == "image" else None
        out = [self.usage(n, quotas, table) for n in self.names()]
        return sorted(out, key=lambda u: u.used_bytes, reverse=True)

    # ---- offline and release (image backend) ---------------------------------------------------

    def trim(self, name: str) -> int:
        """Return the blocks the home of ``name`` no longer uses to the node's disk (image
        backend; a spawner calls it when a server stops); bytes trimmed."""
        if self.backend != "image":
            return 0
        try:
            return self.images.trim(name)
        except (ImageError, OSError) as e:
            raise StorageError(f"home: {e}", field="home", status=500) from None

    def unmount(self, name: str) -> bool:
        """Take the home offline (StorageError 409 while anything uses it). Homes stay mounted
        from their first ensure until this, a shrink or a release: never behind a server."""
        if self.backend != "image":
            return False
        try:
            return self.images.unmount(name)
        except ImageError as e:
            raise StorageError(f"home: {e}", field="home", status=e.status) from None
