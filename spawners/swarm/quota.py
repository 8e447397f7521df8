"""Quotas of shared homes on Swarm: the shared filesystem enforces them, not the hub's node.

With ``shared_home_path`` every user's home is a folder of a filesystem all nodes mount (CephFS,
NFS, ...), so a loop-mounted image on the hub's machine cannot bound it. CephFS has quotas of its
own, set per folder as the ``ceph.quota.max_bytes`` extended attribute and enforced by the
clients on every node (a write past it fails with EDQUOT, within CephFS's few-second reporting
lag); the hub sets it on each home at every start, from the home store's quota (the free size or
what the user raised it to). Other filesystems have no such attribute: NFS quotas are the NFS
server's own (``xfs_quota`` project or user quotas on the export), set up by the operator (see
the README's "Storage" section); for them, and for anything unknown, nothing is set and the hub
says so once in its log.

:func:`quota_plan` is the pure decision (unit-tested); :func:`apply_quota` reads the mount table
and the current value and applies it, never following a link.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

CEPH_QUOTA_XATTR = "ceph.quota.max_bytes"
# The kernel client mounts as 'ceph'; ceph-fuse as 'fuse.ceph-fuse' (older: 'fuse.ceph').
CEPH_TYPES = frozenset({"ceph", "fuse.ceph-fuse", "fuse.ceph"})


@dataclass(frozen=True)
class QuotaPlan:
    """What to do with one home: ``value`` to write into the xattr (None: nothing), and why."""

    value: bytes | None
    enforced: bool  # the filesystem enforces a quota on this home (after the plan is applied)
    why: str


def quota_plan(fstype: str, quota_bytes: int, current: bytes | None) -> QuotaPlan:
    """Pure: the plan for a home on a filesystem of type ``fstype`` whose quota xattr reads
    ``current`` (None: not set or unreadable) and should be ``quota_bytes``."""
    if fstype not in CEPH_TYPES:
        return QuotaPlan(
            None,
            False,
            f"{fstype or 'unknown'} filesystem: no per-folder quota the hub can set (NFS: the "
            "server's own quotas, set up by the operator)",
        )
    if quota_bytes <= 0:
        raise ValueError(f"quota_bytes: {quota_bytes} is not allowed; allowed: more than 0")
    want = str(int(quota_bytes)).encode()
    if current is not None and current.strip(b"\0 \n") == want:
        return QuotaPlan(None, True, f"CephFS quota already {quota_bytes} bytes")
    return QuotaPlan(want, True, f"CephFS quota set to {quota_bytes} bytes")


def filesystem_type(path: str | os.PathLike, mountinfo: str | None = None) -> str:
    """The type of the filesystem holding ``path`` (the longest mount point above it in
    ``/proc/self/mountinfo``); '' when none matches."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    target = os.path.abspath(path)
    best, kind = "", ""
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, right.split()[0]
    return kind


def apply_quota(path: str | os.PathLike, quota_bytes: int) -> QuotaPlan:
    """Set the shared filesystem's quota on the home folder ``path`` where it has one
    (blocking). Returns what was done; an unsupported attribute is not an error."""
    fstype = filesystem_type(path)
    try:
        current = os.getxattr(path, CEPH_QUOTA_XATTR, follow_symlinks=False)
    except OSError:
        current = None
    plan = quota_plan(fstype, quota_bytes, current)
    if plan.value is None:
        return plan
    try:
        os.setxattr(path, CEPH_QUOTA_XATTR, plan.value, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA):
            return QuotaPlan(None, False, f"{fstype}: {CEPH_QUOTA_XATTR} not supported ({e})")
        raise
    return plan
