"""A job's output across its attempts, as the hub keeps it (never read from the user's home).

Each attempt's output is what its server's spawner kept: a local server's bounded log
(``DATA_DIR/logs/NAME.job-ID.log`` and its rotated half, written by a root keeper outside the
user's reach, :mod:`gpulab.spawners.local.serverlog`), or what a container spawner returns from
``gpulab_read_log()``. While an attempt runs, its live log is read; when it ends, the scheduler
archives it into the job's own folder (``DATA_DIR/jobs/ID/attempt-N.log``, root 0600, at most
``JobScheduler.log_max_bytes``: the newest output is kept) and removes the server's log, so the
next attempt of the same server starts on an empty one. The API serves one byte stream: the
archived attempts in order, then the live one, addressed by offsets.

The same copy tells which checkpoint an attempt resumed from: the runner's ``[gpulab] resuming
from PATH`` line (the user's own text, kept only for display: control characters stripped, length
capped), read from the head of the live log once the attempt runs, else from its archive at the end.
"""

from __future__ import annotations

import asyncio
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from gpulab.spawners.jobs.model import Attempt, Job

# The runner prints its resume line before the command runs: it is in the output's head.
RESUME_HEAD_BYTES = 64 * 1024
RESUME_MAX_CHARS = 512
# How long after an attempt runs its live log is looked at for the runner's resume line.
RESUME_WATCH_SECONDS = 120.0
_RESUME_RE = re.compile(
    rb"^\[gpulab\] (?:resuming from (.*)|no checkpoint to resume from: .*)$", re.M
)


def _local_paths(spawner: Any) -> list[Path] | None:
    path = getattr(spawner, "log_path", None)
    if not isinstance(path, Path | str):
        return None
    path = Path(path)
    return [path.with_name(path.name + ".1"), path]


def _read_files(paths: list[Path], limit: int | None = None) -> bytes:
    out = b""
    for p in paths:
        if limit is not None and len(out) >= limit:
            break
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            out += f.read() if limit is None else f.read(limit - len(out))
    return out


async def server_output(spawner: Any) -> bytes:
    """What ``spawner``'s server printed, as its spawner kept it (b"" when nothing is known)."""
    if spawner is None:
        return b""
    paths = _local_paths(spawner)
    if paths is not None:
        return await asyncio.to_thread(_read_files, paths)
    reader = getattr(spawner, "gpulab_read_log", None)
    if reader is None:
        return b""
    try:
        data = await reader()
    except Exception:
        return b""
    return data if isinstance(data, bytes) else str(data or "").encode()


def attempt_file(log_dir: Path, n: int) -> Path:
    return log_dir / f"attempt-{n}.log"


async def archived(log_dir: Path, n: int) -> bytes:
    """Attempt ``n``'s archived output (b"" before it is archived)."""
    return await asyncio.to_thread(_read_files, [attempt_file(log_dir, n)])


def _write_archive(path: Path, data: bytes, max_bytes: int) -> None:
    if len(data) > max_bytes:
        data = data[-max_bytes:]
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _remove(paths: list[Path]) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


async def archive_attempt(log_dir: Path, n: int, spawners: list[Any], max_bytes: int) -> None:
    """Keep attempt ``n``'s output (rank 0 first, then the other ranks, each under a header)
    in the job's folder, then clear the servers' own logs."""
    parts: list[bytes] = []
    for rank, spawner in enumerate(spawners):
        data = await server_output(spawner)
        if rank and data:
            data = f"\n[gpulab] rank {rank}:\n".encode() + data
        parts.append(data)
    path = attempt_file(log_dir, n)
    if not path.exists():
        await asyncio.to_thread(_write_archive, path, b"".join(parts), max_bytes)
    for spawner in spawners:
        paths = _local_paths(spawner)
        if paths is not None:
            await asyncio.to_thread(_remove, paths)


async def clear(spawners: list[Any]) -> None:
    """Remove the servers' own logs (a start that did not count as an attempt)."""
    for spawner in spawners:
        paths = _local_paths(spawner)
        if paths is not None:
            await asyncio.to_thread(_remove, paths)


async def job_output(log_dir: Path, job: Job, live: Any) -> bytes:
    """The job's whole output so far: every archived attempt, then the running attempt's live
    log (rank 0's server, ``live``) when it is not archived yet."""

    def archived() -> tuple[bytes, bool]:
        out = b""
        last_done = False
        for attempt in job.attempts:
            path = attempt_file(log_dir, attempt.n)
            data = _read_files([path])
            out += data
            last_done = path.exists()
        return out, last_done

    data, last_done = await asyncio.to_thread(archived)
    if job.attempts and not last_done and live is not None:
        data += await server_output(live)
    return data


def exit_code_in(output: bytes, job_id: int) -> int | None:
    """The exit code the job runner printed last for job ``job_id`` ("[gpulab] job 17 exited
    with code 3"), or None."""
    found = re.findall(rb"^\[gpulab\] job %d exited with code (\d+)$" % job_id, output, re.M)
    return int(found[-1]) if found else None


def display_text(raw: bytes, limit: int = RESUME_MAX_CHARS) -> str:
    """``raw`` (a user's bytes) as text that is safe to show: invalid UTF-8 replaced, control and
    format characters (escapes, bidi overrides) dropped, at most ``limit`` characters."""
    text = raw.decode("utf-8", "replace")
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("C")).strip()
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def resumed_from_in(output: bytes) -> str | None:
    """The checkpoint the job runner said the attempt resumed from (its first ``[gpulab]
    resuming from PATH`` line in ``output``'s head), "" when it said it started fresh, None when
    it said neither (yet)."""
    found = _RESUME_RE.search(output[:RESUME_HEAD_BYTES])
    if found is None:
        return None
    return display_text(found.group(1)) if found.group(1) is not None else ""


async def note_resumed(attempt: Attempt, spawner: Any, now: float) -> bool:
    """Fill ``attempt.resumed_from`` from the head of its running server's own log (rank 0's,
    ``spawner``) in the first ``RESUME_WATCH_SECONDS`` it runs; True when it was filled."""
    if attempt.resumed_from is not None or spawner is None:
        return False
    if attempt.running_at is None or now - attempt.running_at > RESUME_WATCH_SECONDS:
        return False
    paths = _local_paths(spawner)
    if paths is not None:
        head = await asyncio.to_thread(_read_files, paths, RESUME_HEAD_BYTES)
    else:
        head = await server_output(spawner)
    found = resumed_from_in(head)
    if found is None:
        return False
    attempt.resumed_from = found
    return True


async def archived_resume(log_dir: Path, attempt: Attempt) -> str | None:
    """``attempt.resumed_from``, or what its archived output says (an attempt that ended before
    a pass saw the runner's line)."""
    if attempt.resumed_from is not None:
        return attempt.resumed_from
    path = attempt_file(log_dir, attempt.n)
    return resumed_from_in(await asyncio.to_thread(_read_files, [path], RESUME_HEAD_BYTES))
