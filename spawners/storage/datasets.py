"""Users' own datasets: a folder of a home published as a private, read-only snapshot.

A user publishes ``relative/folder`` of their home as ``@OWNER/NAME`` (NAME a slug). The hub
copies it once into ``{data_dir}/user-datasets/HOME/NAME/data`` (HOME: the owner's
:func:`~gpulab.spawners.storage.homes.home_name`), next to its ``manifest.json`` (owner, name,
size, files, created, who it is shared with). The snapshot is root's, read-only for all, and
outside every home: editing the folder afterwards changes nothing in it, and servers mount it
read-only (``~/datasets/@OWNER.NAME``) like a catalog dataset. Its size counts against the
owner's quota (:meth:`DatasetStore.datasets_bytes`, added to the home by the hub's storage API
and by billing).

Root never acts on a path the user controls (docs/security.md): the copy opens every folder of
the home from its parent's descriptor with ``O_NOFOLLOW`` and reads files through descriptors
it checked. What is not copied, and said so in the manifest's ``skipped``: symlinks (they could
point at ``/etc/shadow`` or into another home), special files (FIFOs, sockets, devices),
anything on another filesystem (a mount below the folder), and files or folders the home's
owner does not own (a hard link to another user's file). A hard link between two files of the
folder is kept as one file.

The copy is bounded before it begins and while it runs: every file costs at least one 4 KiB
block and its full length (a sparse file counts at its length, so a 1 TB file of holes cannot
slip past), and the home's usage plus the owner's datasets plus the snapshot must fit the quota
(else :class:`~gpulab.spawners.storage.homes.StorageError` 409 naming ``folder``); a folder that
grows during the copy is stopped at the same bound. The node's disk is therefore never filled
through a snapshot.

Who may read a dataset is decided here and nowhere else (:meth:`Manifest.readable_by`): its
owner, the users it is shared with by name, and the members (students) of the courses it is
shared with. Who may share with a course is the hub's rule (``hub_config/courses/staff.py``).

The store keeps every manifest in memory (the hub is their only writer), so a spawn's access
check reads no file; publishing, sharing and deleting block (call them in a thread).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from traitlets import Float, Integer
from traitlets.config import LoggingConfigurable

from gpulab.spawners.storage.homes import HomeStore, StorageError, home_name, walk_usage

# ``@OWNER/NAME``: OWNER a hub user name (plain ASCII), NAME a lowercase slug.
NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SLUG_RE = re.compile(r"^@([A-Za-z0-9][A-Za-z0-9._-]{0,63})/([a-z0-9]+(?:-[a-z0-9]+)*)$")
MAX_NAME = 64
BLOCK = 4096
CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def is_private(slug: str) -> bool:
    """Whether a ``datasets`` entry names a user's dataset (``@OWNER/NAME``)."""
    return isinstance(slug, str) and slug.startswith("@")


def parse_slug(slug: str) -> tuple[str, str] | None:
    """(owner, name) of ``@OWNER/NAME``, or None when it is not written that way."""
    m = SLUG_RE.match(slug) if isinstance(slug, str) else None
    return (m.group(1), m.group(2)) if m else None


def mount_name(slug: str) -> str:
    """The folder name under ``~/datasets`` (and a container's ``/datasets``) of a dataset:
    a catalog slug as it is, ``@alice/faces`` as ``@alice.faces`` (one path component; NAME has
    no dot, so the last dot splits it)."""
    return slug.replace("/", ".") if is_private(slug) else slug


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Manifest:
    """One published dataset, as its ``manifest.json`` keeps it."""

    owner: str
    name: str
    folder: str  # the folder of the owner's home it was copied from
    size_bytes: int  # what the snapshot takes on disk (counted against the owner's quota)
    files: int
    created: float
    users: tuple[str, ...] = ()  # shared with these users by name
    courses: tuple[str, ...] = ()  # shared with the members of these courses
    skipped: tuple[tuple[str, str], ...] = ()  # (path in the folder, why), at most 100
    skipped_count: int = 0

    @property
    def slug(self) -> str:
        return f"@{self.owner}/{self.name}"

    def readable_by(self, user: str, courses: Iterable[str]) -> bool:
        """THE access rule: the owner, the users it is shared with, the members of its courses."""
        return user == self.owner or user in self.users or bool(set(self.courses) & set(courses))

    def as_json(self, *, for_owner: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "slug": self.slug,
            "owner": self.owner,
            "name": self.name,
            "state": "ready",
            "size_bytes": self.size_bytes,
            "files": self.files,
            "created": _iso(self.created),
            "mount": f"~/datasets/{mount_name(self.slug)}",
        }
        if for_owner:  # a reader learns nothing of the owner's home or of the other readers
            out["folder"] = self.folder
            out["shared_with"] = {"users": list(self.users), "courses": list(self.courses)}
            out["skipped"] = [{"path": p, "why": w} for p, w in self.skipped]
            out["skipped_count"] = self.skipped_count
        return out

    def to_file(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "name": self.name,
            "folder": self.folder,
            "size_bytes": self.size_bytes,
            "files": self.files,
            "created": self.created,
            "shared_with": {"users": list(self.users), "courses": list(self.courses)},
            "skipped": [list(s) for s in self.skipped],
            "skipped_count": self.skipped_count,
        }

    @classmethod
    def from_file(cls, data: dict[str, Any]) -> Manifest:
        shared = data.get("shared_with") or {}
        return cls(
            owner=str(data["owner"]),
            name=str(data["name"]),
            folder=str(data.get("folder", "")),
            size_bytes=int(data["size_bytes"]),
            files=int(data["files"]),
            created=float(data["created"]),
            users=tuple(shared.get("users") or ()),
            courses=tuple(shared.get("courses") or ()),
            skipped=tuple((str(p), str(w)) for p, w in data.get("skipped") or ()),
            skipped_count=int(data.get("skipped_count", 0)),
        )


@dataclass
class Job:
    """A publish under way (or one that failed): what the owner's GET shows until it ends."""

    owner: str
    name: str
    folder: str
    total_bytes: int = 0
    total_files: int = 0
    done_bytes: int = 0
    done_files: int = 0
    state: str = "publishing"  # publishing | failed
    error: dict[str, Any] | None = None  # {"status", "field", "message"} when failed
    started: float = field(default_factory=time.time)
    cancel: bool = False

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "slug": f"@{self.owner}/{self.name}",
            "owner": self.owner,
            "name": self.name,
            "folder": self.folder,
            "state": self.state,
            "progress": {
                "bytes": self.done_bytes,
                "total_bytes": self.total_bytes,
                "files": self.done_files,
                "total_files": self.total_files,
            },
        }
        if self.error is not None:
            out["error"] = self.error
        return out


class _Over(Exception):
    """The folder is larger than what the owner's quota leaves for it."""


class _Walk:
    """One pass over a published folder, by descriptors only: what to copy, what to skip, and
    the bound (bytes and files) it must stay within. ``dst`` None: measure only."""

    def __init__(self, store: DatasetStore, owner_uid: int, dev: int, budget: int, job: Job):
        self.store = store
        self.owner_uid = owner_uid
        self.dev = dev
        self.budget = budget
        self.job = job
        self.cost = 0
        self.files = 0
        self.skipped: list[tuple[str, str]] = []
        self.skipped_count = 0
        self.copied: dict[tuple[int, int], str] = {}  # (dev, ino) -> path in the snapshot
        self.dst_root: int | None = None  # the snapshot's top folder while copying

    def skip(self, path: str, why: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < 100:
            self.skipped.append((path, why))

    def charge(self, size: int) -> int:
        cost = max(BLOCK, -(-size // BLOCK) * BLOCK)
        self.cost += cost
        self.files += 1
        if self.cost > self.budget or self.files > self.store.max_files:
            raise _Over()
        return cost

    def run(self, src_fd: int, dst_fd: int | None) -> None:
        # An explicit stack (no recursion): each entry holds its folder's descriptors.
        stack: list[tuple[int, int | None, str, int]] = [(os.dup(src_fd), dst_fd, "", 0)]
        self.dst_root = dst_fd
        own_dst = False
        try:
            while stack:
                s_fd, d_fd, rel, depth = stack.pop()
                try:
                    for name in sorted(os.listdir(s_fd)):
                        if self.job.cancel:
                            raise StorageError("the publish was cancelled", "name", 409)
                        child = self._entry(s_fd, d_fd, name, f"{rel}{name}", depth)
                        if child is not None:
                            stack.append(child)
                finally:
                    os.close(s_fd)
                    if own_dst and d_fd is not None:
                        os.close(d_fd)
                own_dst = True  # every folder after the top one was opened here
        finally:
            for s_fd, d_fd, _, _ in stack:
                os.close(s_fd)
                if d_fd is not None:
                    os.close(d_fd)

    def _entry(self, s_fd: int, d_fd: int | None, name: str, path: str, depth: int):
        st = os.stat(name, dir_fd=s_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            self.skip(path, "symlink (links are not followed)")
            return None
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            self.skip(path, "special file (FIFO, socket or device)")
            return None
        if st.st_dev != self.dev:
            self.skip(path, "on another filesystem (a mount)")
            return None
        if st.st_uid != self.owner_uid:
            self.skip(path, "not the home owner's (e.g. a hard link to another user's file)")
            return None
        if stat.S_ISDIR(st.st_mode):
            if depth >= self.store.max_depth:
                self.skip(path, f"deeper than {self.store.max_depth} folders")
                return None
            try:
                sub = os.open(name, _DIR, dir_fd=s_fd)
            except OSError:
                self.skip(path, "changed while it was copied")
                return None
            got = os.fstat(sub)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                os.close(sub)
                self.skip(path, "changed while it was copied")
                return None
            cost = self.charge(0)
            dsub = None
            if d_fd is not None:
                self.job.done_bytes += cost
                self.job.done_files += 1
                os.mkdir(name, 0o700, dir_fd=d_fd)
                dsub = os.open(name, _DIR, dir_fd=d_fd)
            return (sub, dsub, f"{path}/", depth + 1)
        key = (st.st_dev, st.st_ino)
        if key in self.copied:
            if d_fd is not None:  # a second name of a file already copied: one file again
                os.link(self.copied[key], name, src_dir_fd=self.dst_root, dst_dir_fd=d_fd)
            return None
        self._copy_file(s_fd, d_fd, name, path, st)
        return None

    def _copy_file(self, s_fd: int, d_fd: int | None, name: str, path: str, st) -> None:
        try:
            fd = os.open(name, _FILE, dir_fd=s_fd)
        except OSError:
            self.skip(path, "changed while it was copied")
            return
        try:
            got = os.fstat(fd)
            if not stat.S_ISREG(got.st_mode) or (got.st_dev, got.st_ino) != (
                st.st_dev,
                st.st_ino,
            ):
                self.skip(path, "changed while it was copied")
                return
            if got.st_uid != self.owner_uid:
                self.skip(path, "not the home owner's (e.g. a hard link to another user's file)")
                return
            size = got.st_size  # what is read: a file that grows meanwhile stops here
            cost = self.charge(size)
            self.copied[(got.st_dev, got.st_ino)] = path
            if d_fd is None:
                return
            os.set_blocking(fd, True)
            out = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=d_fd
            )
            before = self.job.done_bytes
            try:
                for start, end in _data_ranges(fd, size):
                    pos = start
                    while pos < end:
                        chunk = os.pread(fd, min(CHUNK, end - pos), pos)
                        if not chunk:
                            break  # the file shrank meanwhile: the rest stays a hole
                        if chunk.strip(b"\0"):
                            os.pwrite(out, chunk, pos)  # zeros are left as holes
                        pos += len(chunk)
                        self.job.done_bytes += len(chunk)
                os.ftruncate(out, size)
            finally:
                os.close(out)
            # Progress counts what the file was charged (its holes too), as the total does.
            self.job.done_bytes = before + cost
            self.job.done_files += 1
        finally:
            os.close(fd)


def _data_ranges(fd: int, size: int):
    """The [start, end) ranges of ``fd``'s first ``size`` bytes that hold data (holes are
    skipped, so a sparse file stays sparse and costs no reading); all of it where the
    filesystem cannot tell."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = os.lseek(fd, start, os.SEEK_HOLE)
        except OSError as e:
            if e.errno == errno.ENXIO:  # nothing but a hole from pos on
                return
            yield pos, size  # no SEEK_DATA here: read it all
            return
        if start >= size:
            return
        yield start, min(end, size)
        pos = end


class DatasetStore(LoggingConfigurable):
    """The users' datasets of this hub (one per hub process, made by the pool)."""

    max_files = Integer(
        200_000,
        config=True,
        help="""Most files and folders one published dataset may hold (each also counts at
        least one 4 KiB block against its owner's quota); a larger folder is refused (409).""",
    )
    max_depth = Integer(
        64,
        config=True,
        help="""How many folders deep a publish copies; deeper folders are skipped (and listed
        in the dataset's skipped entries).""",
    )
    quick_answer_seconds = Float(
        2.0,
        config=True,
        help="""How long the publish request waits for the copy: a copy done by then is
        answered 201 with the dataset; a longer one 202, and the owner polls its progress.""",
    )

    copy_threads = Integer(
        2,
        config=True,
        help="""How many publishes copy at once on this hub (in threads of their own, so a big
        copy never holds up the hub's other work); more wait their turn, shown as publishing.""",
    )

    def __init__(self, homes: HomeStore, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.homes = homes
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.RLock()
        self._jobs: dict[tuple[str, str], Job] = {}
        self._manifests: dict[tuple[str, str], Manifest] = {}
        self._loaded = False

    # ---- where -------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return Path(self.homes.data_dir) / "user-datasets"

    def dir_of(self, owner: str, name: str) -> Path:
        return self.root / home_name(owner) / name

    def source(self, owner: str, name: str) -> Path:
        """The snapshot's folder: what a server mounts read-only."""
        return self.dir_of(owner, name) / "data"

    def source_of(self, slug: str, catalog: Any) -> Path:
        """The folder a server mounts read-only for a ``datasets`` entry: a catalog dataset's
        source, or a user's snapshot (access is checked before, at the start's request)."""
        parsed = parse_slug(slug)
        if parsed is None:
            return catalog.datasets[slug].resolve_source()
        return self.source(*parsed)

    # ---- reading (memory only after the first load) ------------------------------------------

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            # What a crash left (a copy cut short, a delete half done) goes before anything runs.
            for left in self.root.glob("*/.*"):
                if not self._jobs:
                    _remove(left)
            found: dict[tuple[str, str], Manifest] = {}
            for path in sorted(self.root.glob("*/*/manifest.json")):
                if path.parent.name.startswith("."):
                    continue
                try:
                    m = Manifest.from_file(json.loads(path.read_text()))
                except (OSError, ValueError, KeyError, TypeError) as e:
                    self.log.warning("Dataset manifest %s cannot be read: %s", path, e)
                    continue
                if self.dir_of(m.owner, m.name) == path.parent:
                    found[(m.owner, m.name)] = m
            self._manifests = found
            self._loaded = True

    def get(self, owner: str, name: str) -> Manifest | None:
        self._load()
        return self._manifests.get((owner, name))

    def readable(self, slug: str, user: str, courses: Iterable[str]) -> Manifest | None:
        """The dataset ``slug`` names when ``user`` (in ``courses``) may read it, else None:
        "no such dataset" and "not shared with you" are one answer."""
        parsed = parse_slug(slug)
        m = self.get(*parsed) if parsed else None
        return m if m is not None and m.readable_by(user, courses) else None

    def check_readable(self, slugs: Iterable[str], user: str, courses: Iterable[str]) -> None:
        """Raise StorageError (400, ``datasets``) for the first private slug ``user`` may not
        read, in the same words whether it exists or not."""
        courses = list(courses)
        for slug in slugs:
            if is_private(slug) and self.readable(slug, user, courses) is None:
                raise StorageError(
                    f"datasets: no dataset {slug!r} that you may read; your own and those "
                    "shared with you are listed at GET /hub/api/users/NAME/datasets",
                    "datasets",
                    400,
                )

    def owned_by(self, owner: str) -> list[Manifest]:
        self._load()
        return sorted((m for (o, _), m in self._manifests.items() if o == owner), key=_by_name)

    def shared_with(self, user: str, courses: Iterable[str]) -> list[Manifest]:
        """Others' datasets ``user`` may read, by slug."""
        self._load()
        courses = list(courses)
        out = [m for m in self._manifests.values() if m.owner != user]
        return sorted((m for m in out if m.readable_by(user, courses)), key=lambda m: m.slug)

    def datasets_bytes(self, owner: str) -> int:
        """What ``owner``'s datasets take on disk (counted against their quota)."""
        return sum(m.size_bytes for m in self.owned_by(owner))

    def jobs_of(self, owner: str) -> list[Job]:
        with self._lock:
            return [j for (o, _), j in self._jobs.items() if o == owner]

    def job(self, owner: str, name: str) -> Job | None:
        with self._lock:
            return self._jobs.get((owner, name))

    # ---- publishing --------------------------------------------------------------------------

    def start_publish(self, owner: str, folder: Any, name: Any) -> Job:
        """Check the request and measure the folder (blocking, fast: metadata only); raise
        StorageError naming the field (400 bad input, 409 taken or over the quota) with
        nothing created. The copy itself is :meth:`run_publish` (the caller's thread)."""
        if not isinstance(name, str) or len(name) > MAX_NAME or not NAME_RE.match(name):
            raise StorageError(
                f"name: must be a slug of lowercase letters, digits and '-' (at most {MAX_NAME} "
                f"characters), not {name!r}",
                "name",
            )
        parts = _folder_parts(folder)
        if not OWNER_RE.match(owner):
            raise StorageError(f"owner: {owner!r} cannot publish datasets", "name", 400)
        self._load()
        with self._lock:
            busy = [j for (o, _), j in self._jobs.items() if o == owner and j.state == "publishing"]
            if busy:
                # One at a time per owner: each is bounded by what the others left of the quota.
                raise StorageError(
                    f"name: your dataset {busy[0].name!r} is being published; wait for it "
                    "(GET its progress) before the next",
                    "name",
                    409,
                )
            if (owner, name) in self._manifests:
                raise StorageError(
                    f"name: you already have a dataset {name!r}; delete it first or pick "
                    "another name",
                    "name",
                    409,
                )
            job = Job(owner=owner, name=name, folder="/".join(parts) or ".")
            self._jobs[(owner, name)] = job
        try:
            src, uid, dev = self._open_folder(owner, parts, folder)
            try:
                walk = _Walk(self, uid, dev, self._allowance(owner, job), job)
                try:
                    walk.run(src, None)
                except _Over:
                    raise self._over(owner, folder, walk) from None
            finally:
                os.close(src)
            job.total_bytes, job.total_files = walk.cost, walk.files
        except BaseException:
            with self._lock:
                self._jobs.pop((owner, name), None)
            raise
        return job

    @property
    def executor(self) -> ThreadPoolExecutor:
        """Where copies run (not the event loop's default executor, which the hub's other
        blocking calls share)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max(1, self.copy_threads), thread_name_prefix="gpulab-publish"
            )
        return self._executor

    def run_publish(self, job: Job) -> Manifest | None:
        """Copy the folder into the snapshot (blocking); the manifest, or None when it failed
        (the job then says why)."""
        owner, name = job.owner, job.name
        owner_dir = self.root / home_name(owner)
        partial = owner_dir / f".{name}.partial"
        try:
            self._make_private_dir(self.root)
            self._make_private_dir(owner_dir)
            if partial.exists():
                _remove(partial)
            partial.mkdir(0o700)
            (partial / "data").mkdir(0o700)
            src, uid, dev = self._open_folder(owner, _folder_parts(job.folder), job.folder)
            dst = os.open(partial / "data", _DIR)
            walk = _Walk(self, uid, dev, self._allowance(owner, job), job)
            try:
                walk.run(src, dst)
            except _Over:
                raise self._over(owner, job.folder, walk) from None
            finally:
                os.close(src)
                os.close(dst)
            _seal(partial / "data")
            used, files = walk_usage(partial / "data")
            manifest = Manifest(
                owner=owner,
                name=name,
                folder=job.folder,
                size_bytes=used,
                files=files,
                created=time.time(),
                skipped=tuple(walk.skipped),
                skipped_count=walk.skipped_count,
            )
            with self._lock:
                if job.cancel:
                    raise StorageError("the publish was cancelled", "name", 409)
                _write_json(partial / "manifest.json", manifest.to_file())
                os.rename(partial, self.dir_of(owner, name))
                self._manifests[(owner, name)] = manifest
                self._jobs.pop((owner, name), None)
            self.log.info(
                "Published %s: %d bytes, %d files, %d skipped",
                manifest.slug,
                used,
                files,
                walk.skipped_count,
            )
            return manifest
        except Exception as e:
            status = e.status if isinstance(e, StorageError) else 500
            fld = e.field if isinstance(e, StorageError) else "folder"
            if not isinstance(e, StorageError):
                self.log.exception("Publishing @%s/%s failed", owner, name)
            _remove(partial)
            with self._lock:
                job.state = "failed"
                job.error = {"status": status, "field": fld, "message": str(e)}
                if job.cancel:
                    self._jobs.pop((owner, name), None)
            return None

    def _allowance(self, owner: str, job: Job) -> int:
        """What the owner's quota leaves for this snapshot: quota - home - datasets - other
        publishes of theirs under way."""
        home = self.homes.usage(home_name(owner))
        with self._lock:
            others = sum(
                j.total_bytes
                for (o, n), j in self._jobs.items()
                if o == owner and j is not job and j.state == "publishing"
            )
        return home.quota_bytes - home.used_bytes - self.datasets_bytes(owner) - others

    def _over(self, owner: str, folder: Any, walk: _Walk) -> StorageError:
        home = self.homes.usage(home_name(owner))
        if walk.files > self.max_files:
            return StorageError(
                f"folder: {folder!r} holds more than {self.max_files} files and folders, the "
                "most one dataset may hold",
                "folder",
                409,
            )
        return StorageError(
            f"folder: {folder!r} does not fit your quota: home "
            f"{home.used_bytes / 2**30:.3f} GB + datasets "
            f"{self.datasets_bytes(owner) / 2**30:.3f} GB + this folder (at least "
            f"{walk.cost / 2**30:.3f} GB, files counted at their length) > quota "
            f"{home.quota_bytes / 2**30:.3f} GB; raise your quota or delete files",
            "folder",
            409,
        )

    def _open_folder(self, owner: str, parts: list[str], folder: Any) -> tuple[int, int, int]:
        """(descriptor, home owner's uid, device) of the folder, every component opened from
        its parent without following links; StorageError 400 naming ``folder`` otherwise."""
        hname = home_name(owner)
        home = self.homes.path(hname)
        if not home.exists():
            raise StorageError(f"folder: {folder!r} is not a folder of your home", "folder")
        self.homes.ensure(hname)  # mounted (image backend), ownership untouched
        fd = os.open(home, _DIR)
        try:
            top = os.fstat(fd)
            for part in parts:
                nxt = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
                if os.fstat(fd).st_uid != top.st_uid:
                    # Root's lost+found (or any folder not the owner's): nothing of it would be
                    # copied, and an empty dataset only looks like one.
                    os.close(fd)
                    raise StorageError(
                        f"folder: {folder!r} is not yours (a folder on its way is owned by "
                        "another account, e.g. the filesystem's lost+found); publish a folder "
                        "you own",
                        "folder",
                        409,
                    )
        except OSError:
            os.close(fd)
            raise StorageError(
                f"folder: {folder!r} is not a folder of your home (missing, a file, or a link)",
                "folder",
            ) from None
        return fd, top.st_uid, os.fstat(fd).st_dev

    @staticmethod
    def _make_private_dir(path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # only root (the hub) passes: servers get snapshots by mounts

    # ---- sharing and deleting ----------------------------------------------------------------

    def set_sharing(
        self, owner: str, name: str, users: Iterable[str], courses: Iterable[str]
    ) -> Manifest:
        """Share ``@owner/name`` with exactly these users and courses (the hub checked that they
        exist and that the owner may share with each course)."""
        with self._lock:
            m = self.get(owner, name)
            if m is None:
                raise StorageError(f"name: you have no dataset {name!r}", "name", 404)
            new = replace(
                m,
                users=tuple(sorted(set(users) - {owner})),
                courses=tuple(sorted(set(courses))),
            )
            _write_json(self.dir_of(owner, name) / "manifest.json", new.to_file())
            self._manifests[(owner, name)] = new
            return new

    def delete(self, owner: str, name: str) -> bool:
        """Delete ``@owner/name`` (or cancel its publish); False when there is none. Servers
        that mount it lose its files; its bytes no longer count against the quota."""
        with self._lock:
            job = self._jobs.get((owner, name))
            if job is not None:
                job.cancel = True
                if job.state == "failed":
                    self._jobs.pop((owner, name), None)
            m = self.get(owner, name)
            if m is None:
                return job is not None
            path = self.dir_of(owner, name)
            trash = path.with_name(f".{name}.deleted-{time.time_ns()}")
            os.rename(path, trash)  # gone for every reader at once
            del self._manifests[(owner, name)]
        _remove(trash)
        self.log.info("Deleted dataset %s", m.slug)
        return True


def _by_name(m: Manifest) -> str:
    return m.name


def _folder_parts(folder: Any) -> list[str]:
    """The components of a folder of the home; StorageError 400 naming ``folder`` for an
    absolute path, ``..``, or anything that is not a plain relative path."""
    if not isinstance(folder, str) or not folder.strip() or "\0" in folder or len(folder) > 4096:
        raise StorageError(
            f"folder: must be a folder of your home as a relative path, like data/faces; "
            f"not {folder!r}",
            "folder",
        )
    if folder.startswith("/") or folder.startswith("~"):
        raise StorageError(
            f"folder: must be relative to your home (like data/faces), not {folder!r}", "folder"
        )
    parts = [p for p in folder.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StorageError(f"folder: '..' is not allowed (got {folder!r})", "folder")
    return parts


def _seal(root: Path) -> None:
    """The snapshot root's and read-only for all: files 0444, folders 0555 (root's own tree
    outside every home, so paths are safe here)."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames:
            p = os.path.join(dirpath, n)
            if os.geteuid() == 0:
                os.lchown(p, 0, 0)
            os.chmod(p, 0o444, follow_symlinks=False)
        for n in dirnames:
            p = os.path.join(dirpath, n)
            if os.geteuid() == 0:
                os.lchown(p, 0, 0)
            os.chmod(p, 0o555)
    os.chmod(root, 0o555)


def _remove(path: Path) -> None:
    """Remove a snapshot (root's own tree): folders made writable first, links not followed."""
    if not os.path.lexists(path):
        return
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o700)
        for n in dirnames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
