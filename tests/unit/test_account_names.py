"""One Unix account per hub user (spawners/local/accounts.py: account_name). Two hub users who
shared an account would share a uid, and with it each other's homes, kernels and processes."""

from __future__ import annotations

import hashlib
import re

import pytest

from gpulab.spawners.local.accounts import MAX_LEN, account_name


def test_a_plain_name_cannot_be_chosen_to_equal_anothers_escaped_account() -> None:
    # The old escaped form of "alice@" was "jupyter-alice-" + "-" + 8 hex digits of SHA-256:
    # a tester signed up as "alice--<those digits>", a name safe as it is, and got that account
    # with no search at all.
    victim = "alice@"
    legacy_tail = hashlib.sha256(victim.encode()).hexdigest()[:8]
    attacker = f"alice--{legacy_tail}"
    assert account_name(attacker) != account_name(victim)
    # Nor under the new form: a name holding the victim's escaped account is escaped itself.
    forged = account_name(victim).removeprefix("jupyter-")
    assert account_name(forged) != account_name(victim)


@pytest.mark.parametrize(
    "name", ["alice@uni.edu", "Ann", "x--y", "a" * 40, "émile", "bob.smith", "-bob"]
)
def test_a_name_that_needs_escaping_gets_64_bits_and_a_double_dash(name: str) -> None:
    account = account_name(name)
    assert re.fullmatch(r"jupyter-[a-z0-9_-]{0,6}--[0-9a-f]{16}", account), account
    assert len(account) <= MAX_LEN


def test_plain_names_stay_readable_and_never_hold_a_double_dash() -> None:
    assert account_name("alice") == "jupyter-alice"
    assert account_name("bo-b_2") == "jupyter-bo-b_2"
    assert "--" not in account_name("a" * 24)
    assert account_name("Ann") != account_name("ann")
