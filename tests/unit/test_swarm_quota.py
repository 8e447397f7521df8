"""Shared homes on Swarm (issue 23, part B): the hub sets CephFS's own quota on each home and
leaves other filesystems alone (spawners/swarm/quota.py)."""

from __future__ import annotations

import pytest

from gpulab.spawners.swarm.quota import apply_quota, filesystem_type, quota_plan

MOUNTINFO = """\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:50 / /srv/gpulab/homes rw,relatime shared:20 - ceph 10.0.0.1:6789:/homes rw,name=hub
41 22 0:51 / /srv/gpulab/homes-fuse rw shared:21 - fuse.ceph-fuse ceph-fuse rw
42 22 0:52 / /srv/nfs rw shared:22 - nfs4 nas:/export rw,vers=4.2
43 22 0:53 / /srv/with\\040space rw shared:23 - tmpfs tmpfs rw
"""


def test_a_ceph_home_gets_its_quota_and_nothing_else_does() -> None:
    """Issue 23: "on Swarm the shared filesystem's own quota (CephFS ceph.quota.max_bytes, NFS
    server quotas)": the decision, for each kind of filesystem."""
    plan = quota_plan("ceph", 50 * 2**30, None)
    assert plan.value == str(50 * 2**30).encode() and plan.enforced
    assert quota_plan("fuse.ceph-fuse", 2**20, b"1").value == b"1048576"
    # Already right: nothing written (a raised quota is written at the next start).
    same = quota_plan("ceph", 2**20, b"1048576")
    assert same.value is None and same.enforced
    for other in ("nfs4", "ext4", "xfs", ""):
        plan = quota_plan(other, 2**20, None)
        assert plan.value is None and not plan.enforced and "quota" in plan.why
    with pytest.raises(ValueError, match="quota_bytes"):
        quota_plan("ceph", 0, None)


def test_the_filesystem_of_a_home_is_its_longest_mount_point() -> None:
    assert filesystem_type("/srv/gpulab/homes/alice", MOUNTINFO) == "ceph"
    assert filesystem_type("/srv/gpulab/homes-fuse/bob", MOUNTINFO) == "fuse.ceph-fuse"
    assert filesystem_type("/srv/gpulab/homesick/bob", MOUNTINFO) == "ext4"  # not a prefix
    assert filesystem_type("/srv/nfs/carol", MOUNTINFO) == "nfs4"
    assert filesystem_type("/srv/with space/dan", MOUNTINFO) == "tmpfs"
    assert filesystem_type("/home/x", MOUNTINFO) == "ext4"


def test_applying_on_a_filesystem_without_ceph_quotas_is_harmless(tmp_path) -> None:
    home = tmp_path / "alice"
    home.mkdir()
    plan = apply_quota(home, 2**30)
    assert plan.value is None and not plan.enforced
    assert list(home.iterdir()) == []
