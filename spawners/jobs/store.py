"""The durable record of training jobs: ``DATA_DIR/jobs/jobs.jsonl``, one line per version.

Every change to a job (submitted, started, an attempt ended, cancelled) appends the job's whole
new version, fsynced before the call returns; on load the latest version of each id wins. A
SIGKILL mid-append leaves at most a torn last line: it is skipped, and cut off before the next
append so that the next version lands on a line of its own. Ids count from 1 and are never
reused (the next id is one above the highest ever written). When old versions far outnumber the
jobs, a load rewrites the file with the latest versions only (atomically).

The folder is root's (0700) and the file 0600: jobs name users' commands and folders, and only the
hub reads them (users see their own jobs through the API). Each job's folder
(:meth:`JobStore.log_dir`, ``DATA_DIR/jobs/<id>/``) is root's too, for what the hub keeps of it.
One store per data dir per process (:meth:`JobStore.instance`); every method is thread-safe.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from gpulab.spawners.jobs.model import Job
from gpulab.spawners.jobs.spec import JobSpec

log = logging.getLogger(__name__)

JOBS_DIR = "jobs"
JOBS_FILE = "jobs.jsonl"


class JobStore:
    """Jobs by id, loaded once from the file and kept in memory; writes go to both."""

    # Old versions kept before a load rewrites the file with the latest ones only.
    compact_after: ClassVar[int] = 10_000
    _instances: ClassVar[dict[Path, JobStore]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir) / JOBS_DIR
        self.path = self.dir / JOBS_FILE
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}
        self._next_id = 1
        self._make_dir(self.dir)
        self._load()

    @classmethod
    def instance(cls, data_dir: str | Path) -> JobStore:
        """The one store of ``data_dir`` in this process (two would hand out the same ids)."""
        key = Path(data_dir).resolve()
        with cls._instances_lock:
            store = cls._instances.get(key)
            if store is None:
                store = cls._instances[key] = cls(key)
            return store

    # ---- reading ---------------------------------------------------------------------------

    def get(self, job_id: int) -> Job | None:
        """A copy of the job's latest version (change it, then :meth:`save`), or None."""
        with self._lock:
            job = self._jobs.get(job_id)
            return job.copy() if job is not None else None

    def list(self, owner: str | None = None, states: Iterable[str] | None = None) -> list[Job]:
        """Copies of the jobs (of ``owner``, in ``states``), oldest first."""
        wanted = None if states is None else set(states)
        with self._lock:
            return [
                job.copy()
                for job_id, job in sorted(self._jobs.items())
                if (owner is None or job.owner == owner) and (wanted is None or job.state in wanted)
            ]

    # ---- writing ---------------------------------------------------------------------------

    def submit(self, owner: str, spec: JobSpec) -> Job:
        """Record a new queued job of ``owner`` under the next id; durable when this returns."""
        with self._lock:
            now = time.time()
            job = Job(id=self._next_id, owner=owner, spec=spec, submitted_at=now, updated_at=now)
            self._append(job)
            self._jobs[job.id] = job.copy()
            self._next_id += 1
            return job

    def save(self, job: Job) -> None:
        """Record a new version of a submitted job (``updated_at`` set to now)."""
        with self._lock:
            old = self._jobs.get(job.id)
            if old is None:
                raise KeyError(f"no job {job.id} to save; submit it first")
            if old.owner != job.owner:
                raise ValueError(f"job {job.id} belongs to {old.owner!r}, not {job.owner!r}")
            job.updated_at = time.time()
            self._append(job)
            self._jobs[job.id] = job.copy()

    def log_dir(self, job_id: int) -> Path:
        """``DATA_DIR/jobs/<id>/``, root's own (0700), made on first use."""
        if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 1:
            raise ValueError(f"no job id {job_id!r}")
        path = self.dir / str(job_id)
        self._make_dir(path)
        return path

    # ---- the file --------------------------------------------------------------------------

    @staticmethod
    def _make_dir(path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_symlink() or not path.is_dir():
            raise RuntimeError(f"{path} must be a folder of its own")
        os.chmod(path, 0o700)

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        keep = len(raw) if raw.endswith(b"\n") or not raw else raw.rfind(b"\n") + 1
        highest = 0
        for n, line in enumerate(raw[:keep].splitlines(), 1):
            if not line.strip():
                continue
            try:
                job = Job.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                log.warning("%s line %d skipped: %s", self.path, n, e)
                continue
            self._jobs[job.id] = job
            highest = max(highest, job.id)
        if keep < len(raw):
            # A torn last line (a SIGKILL mid-append): its version never returned to a caller.
            log.warning("%s: a torn last line (%d bytes) cut off", self.path, len(raw) - keep)
            with open(self.path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
        self._next_id = highest + 1
        if self.path.exists():
            os.chmod(self.path, 0o600)
        lines = raw[:keep].count(b"\n")
        if lines - len(self._jobs) > max(self.compact_after, 2 * len(self._jobs)):
            self._compact()

    def _compact(self) -> None:
        """Rewrite the file with only the latest version of each job (at load, when old
        versions outnumber the jobs): a temporary file, fsynced, renamed over the old one.
        The highest id stays in it, so ids are still never reused."""
        tmp = self.path.with_suffix(".jsonl.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            for _, job in sorted(self._jobs.items()):
                f.write((json.dumps(job.to_json(), separators=(",", ":")) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dirfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)

    def _append(self, job: Job) -> None:
        line = (json.dumps(job.to_json(), separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            start = os.fstat(fd).st_size
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError:
                # A half-written version (disk full) must not glue itself to the next one.
                os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)
