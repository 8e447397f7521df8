"""Bounded server logs: what a user's server prints reaches the node's disk only up to a cap.

A local server's stdout and stderr (and those of every kernel and process it starts, which
inherit them) are the user's to fill: a kernel printing in a loop would otherwise grow
``{data_dir}/logs/NAME.log`` until the disk the hub, billing and every home share is full. So a
server never writes its log file itself: it writes into a pipe, and a small keeper process (this
module, run by the hub or the fork server as root, outside the user's cgroup and account, so the
user can neither kill it nor write its files) copies the pipe into the log with rotation by size:
``NAME.log`` holds the newest output and, once it would pass half the cap, becomes ``NAME.log.1``
(replacing the older half). At most ``max_bytes`` of output are ever on disk, whatever the server
prints; the hub's own lines (start banners, exit codes) are appended to the current file as before.

A writer faster than the disk only blocks on the full pipe (back-pressure on the user's own
process, never on the hub). The keeper exits once every holder of the pipe's write end is gone
(the server, its kernels and whatever the stop's cgroup kill ended).
"""

from __future__ import annotations

import os
import subprocess
import sys

CHUNK = 64 * 1024
MIN_MAX_BYTES = 2 * CHUNK


def rotated(path: str) -> str:
    """Where the older half of a log lives."""
    return f"{path}.1"


def _open_log(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)


def keep(source: int, path: str, max_bytes: int) -> None:
    """Copy ``source`` (a pipe's read end) into ``path`` until end of file, keeping at most
    ``max_bytes`` on disk over ``path`` and its rotated half. Blocking; returns at EOF."""
    half = max(max_bytes, MIN_MAX_BYTES) // 2
    out = _open_log(path)
    try:
        while True:
            try:
                data = os.read(source, CHUNK)
            except InterruptedError:
                continue
            if not data:
                return
            size = os.fstat(out).st_size
            if size + len(data) > half:
                # The hub's lines are appended to the same file, so size is asked each time.
                os.close(out)
                out = -1
                os.replace(path, rotated(path))
                out = _open_log(path)
                data = data[-half:]
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
    finally:
        if out >= 0:
            os.close(out)


def open_bounded(path: str, max_bytes: int, env: dict[str, str] | None = None) -> int:
    """Start a keeper for ``path`` and return the write end of its pipe (the caller hands it to
    the server as stdout and stderr, then closes its own copy)."""
    read, write = os.pipe()
    try:
        subprocess.Popen(
            [sys.executable, "-m", "gpulab.spawners.local.serverlog", path, str(max_bytes)],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # the hub's signals (Ctrl-C) are not the keeper's
            env=env if env is not None else dict(os.environ),
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    return write


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(
            "usage: python -m gpulab.spawners.local.serverlog LOG_PATH MAX_BYTES", file=sys.stderr
        )
        return 2
    keep(0, argv[0], int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
