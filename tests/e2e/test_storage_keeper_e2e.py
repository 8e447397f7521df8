"""Homes kept and released on a schedule, against a real hub (issue 23, "data kept and released
on a schedule": the operator sets how long a home of a user who no longer runs anything is kept,
users are warned before, nothing is deleted without warning or while a server runs).

The keeper's clock is moved days ahead through ``StorageKeeper.clock_offset_file`` (config), so
nothing sleeps; a test waits for a keeper round through its state file. Each test failed on the
code before part F: no home was ever warned about or released (no keeper).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from harness import Hub, catalog_with, wait_for, write_in_home

DAY = 86400.0
KIND = "storage-release"


def keeper_catalog(folder: Path) -> Path:
    """The shipped catalog with homes kept 3 days after last use, warned 2 and 1 days before."""
    return catalog_with(folder, keep_days=3, warn_days=[2, 1])


class Clock:
    """The keeper's clock offset, in days, written where the hub's config points."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.set(0)

    def set(self, days: float) -> None:
        self.days = days
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(str(days * DAY))
        tmp.replace(self.path)

    def now(self) -> float:
        return time.time() + self.days * DAY


def start_keeper_hub(
    hub_factory, tmp_path: Path, name: str, mode: str = "auto"
) -> tuple[Hub, Clock]:
    clock = Clock(tmp_path / "clock")
    hub = hub_factory(
        name,
        simulate="RTX-4090:1",
        catalog=keeper_catalog(tmp_path),
        extra_args=[
            "--StorageKeeper.interval=0.3",
            f"--StorageKeeper.clock_offset_file={clock.path}",
            f"--HomeStore.mode={mode}",
        ],
    )
    return hub, clock


def state(hub: Hub) -> dict:
    try:
        return json.loads((hub.data_dir / "storage" / "keeper.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def wait_round(hub: Hub, clock: Clock, timeout: float = 60) -> dict:
    """Until the keeper has begun and finished a round after now (on its clock)."""
    since = clock.now()
    return wait_for(
        lambda: (s := state(hub)).get("looked_at") and s["looked_at"] >= since and s,
        timeout,
        what="a storage keeper round",
    )


def notices(hub: Hub, user: str) -> list[str]:
    r = hub.api("GET", f"/gpulab/users/{user}/notices")
    assert r.status_code == 200, r.text
    return [n["message"] for n in r.json()["notices"] if n["kind"] == KIND]


def home(hub: Hub, user: str) -> Path:
    return hub.data_dir / "users" / user


def run_once(hub: Hub, user: str, text: str | None = None) -> None:
    """Start a no-GPU server, optionally write a file in the home, stop it."""
    hub.spawn_ready(user, {"gpu": "none"}, timeout=120)
    if text is not None:
        write_in_home(home(hub, user), "keep.txt", text)
    hub.stop_server(user)


def test_an_idle_home_is_warned_then_released_and_a_start_resets_the_clock(hub_factory, tmp_path):
    """Points: the operator's keep_days; warned before (each warning once, with the date, kept
    across a hub restart between warnings: not lost, not repeated); released only after every
    warning; a user who starts a server resets the clock; the next server starts with a fresh
    home."""
    hub, clock = start_keeper_hub(hub_factory, tmp_path, "keeper")
    alice, bob = hub.create_user("kalice"), hub.create_user("kbob")
    run_once(hub, alice, "alice's thesis")
    run_once(hub, bob, "bob's data")
    wait_round(hub, clock)
    assert notices(hub, alice) == [] and notices(hub, bob) == []

    # Day 1.2: the 2-day warning, with the date (the release is 3 days after the last use).
    clock.set(1.2)
    wait_for(lambda: notices(hub, alice) and notices(hub, bob), 60, what="the first warnings")
    (first,) = notices(hub, alice)
    assert "in 2 days" in first and "Start any server" in first
    assert time.strftime("%Y-%m-%d", time.gmtime(clock.now() + 1.8 * DAY)) in first
    assert state(hub)["homes"][alice]["warned"].keys() == {"2"}
    # The storage API says when (the user's own figure and the admins' list).
    release = hub.api("GET", f"/users/{alice}/storage").json()["release"]
    assert release["days_left"] == 2 and release["at"][:10] in first
    rows = {r["user"]: r for r in hub.api("GET", "/storage").json()["homes"]}
    assert rows[alice]["release"] == release

    # A hub restart between the warnings: the warning is neither lost nor given again.
    hub.stop()
    hub.start()
    wait_round(hub, clock)
    wait_round(hub, clock)
    assert notices(hub, alice) == [first]
    assert state(hub)["homes"][alice]["warned"].keys() == {"2"}

    # Bob starts a server after his warning: his clock starts again.
    run_once(hub, bob)
    wait_round(hub, clock)
    assert state(hub)["homes"][bob]["warned"] == {}
    assert "deletion you were warned of is cancelled" in notices(hub, bob)[-1]
    assert hub.api("GET", f"/users/{bob}/storage").json()["release"] is None

    # Day 2.2: alice's 1-day warning; day 3.3: her home is released, bob's kept.
    clock.set(2.2)
    wait_for(lambda: len(notices(hub, alice)) == 2, 60, what="alice's second warning")
    assert "in 1 day:" in notices(hub, alice)[1]
    assert (home(hub, alice) / "keep.txt").exists()
    clock.set(3.3)
    # 180 s: an image home is refused offline while any process on the node holds a copy of
    # its mount (another test's sandbox); the keeper retries every round.
    wait_for(lambda: len(notices(hub, alice)) == 3, 180, what="alice's home released")
    assert "was deleted" in notices(hub, alice)[2]
    s = wait_round(hub, clock)
    assert alice not in s["homes"] and [r["user"] for r in s["released"]] == [alice]
    assert not (home(hub, alice) / "keep.txt").exists()
    assert (home(hub, bob) / "keep.txt").read_text() == "bob's data"
    assert not any("was deleted" in n for n in notices(hub, bob))

    # Alice's next server starts with an empty home.
    hub.spawn_ready(alice, {"gpu": "none"}, timeout=120)
    assert not (home(hub, alice) / "keep.txt").exists()
    hub.stop_server(alice)


@pytest.mark.parametrize("mode", ["image", "directory"])
def test_a_sigkill_mid_release_spares_a_running_users_home(hub_factory, tmp_path, mode):
    """Points: nothing is deleted while a server runs, and a hub killed in the middle of a
    release neither deletes a running user's home nor the fresh home of the user released (the
    release resumes on what was moved aside, not on a path). With plain-folder homes alice's
    release is stalled half-way by an immutable file, so the SIGKILL lands mid-release; an image
    home is released in one unlink (nothing half-way to stall)."""
    hub, clock = start_keeper_hub(hub_factory, tmp_path, f"keeper-kill-{mode}", mode)
    # Names of this variant's own: a root hub runs each user as a Unix account named after them,
    # and the other variant (perhaps on another worker at the same time) stops its users'
    # servers by ending their accounts' processes.
    alice, bob = hub.create_user(f"kkalice{mode[:3]}"), hub.create_user(f"kkbob{mode[:3]}")
    hub.spawn_ready(bob, {"gpu": "none"}, timeout=120)
    write_in_home(home(hub, bob), "keep.txt", "bob's data")
    hub.spawn_ready(alice, {"gpu": "none"}, timeout=120)
    stuck = write_in_home(home(hub, alice), "stuck.txt", "x")
    subprocess.run(["chattr", "+i", str(stuck)], check=True)
    trash_glob = f".released-{alice}-*"
    try:
        hub.stop_server(alice)
        for days, count in ((1.2, 1), (2.2, 2), (3.3, 3)):
            clock.set(days)
            wait_for(lambda c=count: len(notices(hub, alice)) == c, 180, what=f"notice {count}")
        assert "was deleted" in notices(hub, alice)[2]
        # Bob's server ran all along: never warned, never released.
        assert notices(hub, bob) == []
        if mode == "directory":  # the release stopped half-way: moved aside, not deleted
            assert list((hub.data_dir / "users").glob(trash_glob))
        hub.kill()

        # A hundred days later (on the keeper's clock) the hub comes back: bob's server was
        # restored before the keeper's first round, so he still counts as running.
        clock.set(103.3)
        hub.start()
        wait_round(hub, clock)
        assert hub.server(bob)["ready"]
        assert (home(hub, bob) / "keep.txt").read_text() == "bob's data"
        hub.spawn_ready(alice, {"gpu": "none"}, timeout=120)
        fresh = write_in_home(home(hub, alice), "new.txt", "alice again")
    finally:
        for trash in (hub.data_dir / "users").glob(trash_glob):
            # os.walk, not rglob: the resumed release may be deleting this folder meanwhile.
            for folder, _, files in os.walk(trash):
                if "stuck.txt" in files:
                    subprocess.run(["chattr", "-i", os.path.join(folder, "stuck.txt")], check=False)
        if stuck.exists():
            subprocess.run(["chattr", "-i", str(stuck)], check=False)
    wait_for(lambda: not list((hub.data_dir / "users").glob(trash_glob)), 60, what="the purge")
    wait_round(hub, clock)
    assert fresh.read_text() == "alice again"
    assert (home(hub, bob) / "keep.txt").read_text() == "bob's data"
    assert hub.server(bob)["ready"] and hub.server(alice)["ready"]
    assert notices(hub, bob) == []
    hub.stop_server(alice)
    hub.stop_server(bob)


pytestmark = pytest.mark.timeout(600)
