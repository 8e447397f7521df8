"""One injective home-name rule (issue 23, red team): two user names never share one home.

The old rule kept a literal ``-`` and wrote other characters as ``-hex-``, so ``fay.z`` and
``fay-2e-z`` both got home ``fay-2e-z`` (with its image, uploads, private datasets, quota, keeper
record and server log). These tests fail on that rule.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import passable_for_accounts
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.catalog.models import Storage
from gpulab.spawners.mixin import GpuSpawnerMixin
from gpulab.spawners.storage import loopfs
from gpulab.spawners.storage.homes import HomeStore, home_name, legacy_home_name

TINY = Storage(free_gb=Decimal("0.0625"), max_gb=Decimal("0.25"), tmp_gb=Decimal("0.03125"),
               shm_gb=Decimal("0.03125"))  # fmt: skip

SAFE = re.compile(r"[A-Za-z0-9_-]+")

# Names as sign-up takes them (hub_config/courses/roster.py USERNAME_RE), biased to the
# characters that make escapes, and any text an authenticator might hand the hub.
signup_names = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,62}", fullmatch=True)
tricky = st.text(alphabet="-.2e0abcdfz_@", min_size=1, max_size=16)
any_names = st.text(min_size=1, max_size=40)


def test_the_reported_pair_gets_two_homes():
    """Red team: ``fay.z`` and ``fay-2e-z`` (likewise ``dave.x``/``dave-2e-x``) shared a home."""
    assert home_name("fay.z") != home_name("fay-2e-z")
    assert home_name("dave.x") != home_name("dave-2e-x")


def test_plain_names_keep_their_homes():
    """Names the old rule wrote without an escape, and names without a ``-``, keep the home
    they had: no move for them."""
    for name in ("alice", "fay-z", "John_Doe", "jo-ann-smith", "fay.z", "x@y.com"):
        assert home_name(name) == legacy_home_name(name)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(signup_names, tricky, any_names), min_size=2, max_size=30, unique=True))
def test_distinct_names_get_distinct_homes(names):
    homes = {home_name(n) for n in names}
    assert len(homes) == len(names), {n: home_name(n) for n in names}


@settings(max_examples=400, deadline=None)
@given(st.one_of(signup_names, tricky, any_names))
def test_nobody_can_sign_up_as_anothers_home(name):
    """The attack: take as your user name the home name another name is given (``fay-2e-z`` for
    ``fay.z``). That twin must get a home of its own."""
    twin = home_name(name)
    if twin != name:
        assert home_name(twin) != home_name(name)
    old_twin = legacy_home_name(name)
    if old_twin != name:
        assert home_name(old_twin) != home_name(name)


@settings(max_examples=400, deadline=None)
@given(st.one_of(signup_names, tricky, any_names))
def test_each_home_name_is_one_safe_path_component(name):
    got = home_name(name)
    assert SAFE.fullmatch(got), got
    assert got not in (".", "..") and os.sep not in got and not got.startswith(".")


@settings(max_examples=400, deadline=None)
@given(signup_names)
def test_signup_names_fit_a_file_name(name):
    # users/NAME, storage/images/NAME.img, logs/NAME-SERVER.log: well below 255 bytes.
    assert len(home_name(name).encode()) <= 255 - len(".img")


@given(any_names)
def test_the_spawners_use_the_same_rule(name):
    spawner = SimpleNamespace(user=SimpleNamespace(name=name))
    assert GpuSpawnerMixin.user_home_name(spawner) == home_name(name)


# ---- homes made under the old rule: adopted by their own account only -------------------------

OLD_USER = "kim.o-1"  # old rule: kim-2e-o-1; new rule: kim-2e-o-2d-1


@pytest.fixture(params=["directory", "image"])
def store(request, tmp_path):
    if request.param == "image" and os.geteuid() != 0:
        pytest.skip("loop mounts need root")
    data = tmp_path / "data"
    data.mkdir()
    passable_for_accounts(data)
    homes = HomeStore(data, TINY, mode=request.param)
    yield homes
    loopfs.unmount_below(data)


def legacy_home(store: HomeStore, uid: int) -> Path:
    """A home as the old rule named it, made the way the store made homes then, with a file."""
    old = legacy_home_name(OLD_USER)
    home = store.ensure(old, uid, uid)
    (home / "thesis.tex").write_text("mine")
    os.chown(home / "thesis.tex", uid, uid)
    store._write_quotas({old: 2 * TINY.free_bytes})
    return home


@pytest.mark.skipif(os.geteuid() != 0, reason="homes owned by other uids need root")
def test_a_legacy_home_owned_by_the_users_account_is_adopted(store):
    """Point (red team follow-up): a user whose home name changed with the new rule keeps their
    files and quota: the old home, owned by their own account, moves to the new name."""
    old, new = legacy_home_name(OLD_USER), home_name(OLD_USER)
    assert old != new
    legacy_home(store, 4101)
    assert store.adopt(old, new, 4101) is None
    home = store.ensure(new, 4101, 4101)
    assert (home / "thesis.tex").read_text() == "mine"
    assert store.quota(new) == 2 * TINY.free_bytes
    assert old not in store.names() and new in store.names()


@pytest.mark.skipif(os.geteuid() != 0, reason="homes owned by other uids need root")
def test_a_legacy_home_owned_by_another_account_is_left_alone(store):
    """The shared home of the old rule: whoever's account does not own it never gets it; it
    stays where it is, its files and quota untouched, and the reason is returned for the log."""
    old, new = legacy_home_name(OLD_USER), home_name(OLD_USER)
    legacy_home(store, 4102)
    why = store.adopt(old, new, 4101)
    assert why and "4102" in why
    assert new not in store.names()
    assert (store.ensure(old) / "thesis.tex").read_text() == "mine"
    assert store.quota(old) == 2 * TINY.free_bytes and store.quota(new) == TINY.free_bytes
    # And a home already at the new name is never overwritten.
    store.ensure(new, 4101, 4101)
    assert "exists" in store.adopt(old, new, 4102)


def test_a_named_servers_log_is_never_another_users_log():
    """``bob``'s server ``x`` and ``bob-x``'s server wrote one log file (``logs/bob-x.log``)."""
    from gpulab.spawners.local.spawner import GpuLocalSpawner

    def log_of(user: str, server: str) -> Path:
        spawner = SimpleNamespace(
            name=server, pool=SimpleNamespace(data_dir="/d"), user_home_name=lambda: home_name(user)
        )
        return GpuLocalSpawner.log_path.fget(spawner)

    assert log_of("bob", "x") != log_of("bob-x", "")
    assert log_of("bob", "") == Path("/d/logs/bob.log")
