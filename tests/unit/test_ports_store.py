"""The published ports' store (hub_config/api/ports.py: PortStore): what is published survives a
hub restart, is private to root (0600: it holds the public links' secrets), and a save that
finishes late never puts back what a later one removed (issue 25, published ports "listed and
revocable": a revoked port must stay revoked)."""

from __future__ import annotations

import asyncio
import json
import stat
from datetime import datetime
from pathlib import Path

from gpulab.hub_config.api.ports import PortStore, account_key
from gpulab.hub_config.origin import user_label


def test_publications_survive_a_restart_privately(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    store = PortStore(path)
    entry = store.put("alice@uni.edu", 8080, "public", "1:2026-01-01")
    asyncio.run(store.save())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = PortStore(path)
    assert again.get("alice@uni.edu", 8080) == entry and entry["secret"]
    assert again.get("alice@uni.edu", 8080, "1:2026-01-01") == entry
    # Another account under the same name sees nothing of it.
    assert again.get("alice@uni.edu", 8080, "1:2026-02-02") is None
    assert again.owner_of_label(user_label("alice@uni.edu")) == "alice@uni.edu"
    assert again.owner_of_label("alice") is None


def test_a_late_save_never_brings_a_revoked_port_back(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    store = PortStore(path)
    store.put("bob", 9000, "login", "2:x")
    # A save of the published state starts (its number and text taken on the event loop) ...
    store._seq += 1
    early = (store._seq, json.dumps(store.data))
    # ... the port is revoked and that save finishes first ...
    store.remove("bob", 9000)
    asyncio.run(store.save())
    # ... then the earlier one finishes: it writes nothing.
    store._write(*early)
    assert PortStore(path).get("bob", 9000) is None


def test_an_account_key_changes_when_a_name_comes_back() -> None:
    class Account:
        def __init__(self, id: int, created) -> None:
            self.id, self.created = id, created

    first = account_key(Account(3, datetime(2026, 1, 1)))
    assert first != account_key(Account(3, datetime(2026, 2, 1)))
    assert first == account_key(Account(3, datetime(2026, 1, 1)))
