"""The storage keeper's rule (issue 23, "data kept and released on a schedule"): a home is
warned at the catalog's warn_days before its release, never released unwarned, a late warning
pushes the release, and nothing is released while its user runs anything; the home store's
release never follows a link out of the home nor deletes through a mount.

These fail on the code before part F (no gpulab.hub_config.storage_keeper, no
HomeStore.release)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpulab.catalog.models import Storage
from gpulab.hub_config.storage_keeper import (
    DAY,
    Keep,
    Record,
    Release,
    Warn,
    decide,
    observe,
    release_at,
)
from gpulab.spawners.storage.homes import HomeStore

KEEP = 90
WARN = (14, 3)


def run(record: Record, start: float, end: float, step: float, active=lambda t: False):
    """Drive the rule like the keeper does, from ``start`` to ``end`` every ``step`` seconds:
    returns the (time, decision) of every warning and release."""
    out = []
    t = start
    while t <= end:
        on = active(t)
        record = observe(record, on, t)
        d = decide(t, record, active=on, keep_days=KEEP, warn_days=WARN)
        if isinstance(d, Warn):
            record.warned[d.days] = t
            out.append((t, d))
        elif isinstance(d, Release):
            out.append((t, d))
            break
        t += step
    return out


def test_warned_at_the_right_days_then_released_once():
    """Points: warned at warn_days before release, each once, released at keep_days."""
    events = run(Record(last_used=0.0), 0.0, 200 * DAY, DAY / 4)
    kinds = [(round(t / DAY, 2), type(d).__name__, getattr(d, "days", None)) for t, d in events]
    assert kinds == [(76.0, "Warn", 14), (87.0, "Warn", 3), (90.0, "Release", None)]
    assert events[0][1].days_left == 14 and events[1][1].days_left == 3


def test_never_released_unwarned_even_long_past_due():
    """Point: never released unwarned. A hub down for a year (or a record older than keep_days
    when the keeper first sees it) still gives every warning, each its days ahead."""
    record = Record(last_used=0.0)
    now = 365 * DAY
    d = decide(now, record, active=False, keep_days=KEEP, warn_days=WARN)
    assert isinstance(d, Warn) and d.days == 14 and d.at == now + 14 * DAY
    record.warned[14] = now
    # The 3-day warning comes 3 days before the pushed release, not at once.
    assert isinstance(decide(now + DAY, record, active=False, keep_days=KEEP, warn_days=WARN), Keep)
    d = decide(now + 11 * DAY, record, active=False, keep_days=KEEP, warn_days=WARN)
    assert isinstance(d, Warn) and d.days == 3 and d.days_left == 3
    record.warned[3] = now + 11 * DAY
    keep = decide(now + 14 * DAY - 1, record, active=False, keep_days=KEEP, warn_days=WARN)
    assert isinstance(keep, Keep) and keep.at == now + 14 * DAY
    assert isinstance(
        decide(now + 14 * DAY, record, active=False, keep_days=KEEP, warn_days=WARN), Release
    )
    # With a warning missing, never a release, however late.
    partial = Record(last_used=0.0, warned={14: 10 * DAY})
    for t in (100 * DAY, 1000 * DAY):
        d = decide(t, partial, active=False, keep_days=KEEP, warn_days=WARN)
        assert isinstance(d, Warn) and d.days == 3


def test_a_late_warning_pushes_the_release():
    """Point: a warning given late (the keeper was down at day 76) pushes the release so that
    the warning is at least its days before it."""
    events = run(Record(last_used=0.0), 80 * DAY, 200 * DAY, DAY / 4)
    (t14, w14), (t3, w3), (tr, _) = events
    assert (t14, w14.days, w14.at) == (80 * DAY, 14, 94 * DAY)
    assert (t3, w3.days) == (91 * DAY, 3)
    assert tr == 94 * DAY
    assert release_at(Record(0.0, {14: 80 * DAY, 3: 91 * DAY}), KEEP) == 94 * DAY


def test_running_or_pending_is_never_released_and_resets_the_clock():
    """Point: running/pending never released; a server started after a warning resets the
    clock and the warnings (the next release is keep_days after it stopped, warned anew)."""
    record = Record(last_used=0.0, warned={14: 76 * DAY, 3: 87 * DAY})
    for t in (90 * DAY, 500 * DAY):
        assert decide(t, record, active=True, keep_days=KEEP, warn_days=WARN) == Keep(None)
    # Started at day 88 (after both warnings) and stopped at day 89.
    running = lambda t: 88 * DAY <= t < 89 * DAY  # noqa: E731
    events = run(record, 87.25 * DAY, 400 * DAY, DAY / 4, active=running)
    assert [(round(t / DAY, 2), getattr(d, "days", None)) for t, d in events] == [
        (164.75, 14),
        (175.75, 3),
        (178.75, None),
    ]


def test_a_first_sight_starts_the_clock():
    """A home the keeper has no record of (an upgrade, a lost state file) is kept keep_days
    from when it is first seen: nothing is released early."""
    record = observe(None, False, 1000 * DAY)
    assert record == Record(last_used=1000 * DAY)
    assert decide(1000 * DAY, record, active=False, keep_days=KEEP, warn_days=WARN) == Keep(
        1090 * DAY
    )


@pytest.fixture
def store(tmp_path: Path) -> HomeStore:
    return HomeStore(tmp_path / "data", Storage(), mode="directory")


def test_release_deletes_the_home_but_never_through_a_link(store: HomeStore, tmp_path: Path):
    """Attack: a symlink (or hard link) in the home pointing at another user's files or a system
    path; releasing the home deletes the link, not its target."""
    other = store.ensure("bob")
    (other / "thesis.txt").write_text("bob's")
    outside = tmp_path / "etc-like"
    outside.mkdir()
    (outside / "passwd").write_text("root")
    home = store.ensure("alice")
    (home / "sub" / "deep").mkdir(parents=True)
    (home / "sub" / "deep" / "f").write_text("x")
    os.symlink(other, home / "to-bob")
    os.symlink(outside / "passwd", home / "sub" / "pw")
    os.link(other / "thesis.txt", home / "hard")
    store.set_quota("alice", store.storage.free_bytes * 2)

    assert store.release("alice") is True
    assert not store.path("alice").exists()
    assert (other / "thesis.txt").read_text() == "bob's"
    assert (outside / "passwd").read_text() == "root"
    assert store.quota("alice") == store.storage.free_bytes
    assert store.names() == ["bob"]
    assert store.release("alice") is False


def test_release_stops_at_a_mount_and_the_trash_is_no_ones_home(store: HomeStore, tmp_path):
    """Attack: a filesystem mounted inside the home (a dataset's bind left behind) must not be
    emptied by the release; the home is moved aside first, so a new home is a fresh folder and
    a later purge never touches it."""
    shared = tmp_path / "dataset"
    shared.mkdir()
    (shared / "data.csv").write_text("1,2")
    home = store.ensure("alice")
    (home / "mine.txt").write_text("x")
    (home / "datasets").mkdir()
    subprocess.run(["mount", "--bind", str(shared), str(home / "datasets")], check=True)
    try:
        with pytest.raises(OSError, match="mounted"):
            store.release("alice")
        assert (shared / "data.csv").read_text() == "1,2"
        assert not store.path("alice").exists()  # moved aside before anything was deleted
        fresh = store.ensure("alice")
        (fresh / "new.txt").write_text("new")
        assert store.purge_released()  # still stopped by the mount
    finally:
        trash = next(store.homes_dir.glob(".released-alice-*"))
        subprocess.run(["umount", str(trash / "datasets")], check=True)
    assert store.purge_released() == []
    assert list(store.homes_dir.glob(".released-*")) == []
    assert (store.path("alice") / "new.txt").read_text() == "new"
    assert (shared / "data.csv").read_text() == "1,2"


def test_a_release_takes_the_private_datasets_shared_with_nobody(store: HomeStore):
    """Point (what happens to private datasets at release): those shared with nobody are
    deleted with the home; one shared with a course or a user stays for them."""
    from types import SimpleNamespace

    from gpulab.hub_config.storage_keeper import StorageKeeper
    from gpulab.spawners.storage.datasets import DatasetStore

    datasets = DatasetStore(store)
    home = store.ensure("alice")
    for name in ("faces", "voices", "notes"):
        (home / name).mkdir()
        (home / name / "a.txt").write_text(name)
        datasets.run_publish(datasets.start_publish("alice", name, name))
    datasets.set_sharing("alice", "voices", ["bob"], [])
    keeper = StorageKeeper()
    keeper.pool = SimpleNamespace(datasets=datasets)

    assert keeper.release_datasets("alice") == ["@alice/faces", "@alice/notes"]
    assert [m.slug for m in datasets.owned_by("alice")] == ["@alice/voices"]
    assert (datasets.source("alice", "voices") / "a.txt").read_text() == "voices"
