"""Per-user spot settings: the webhook URL with its HMAC secret, and the checkpoint command.

Kept in ``DATA_DIR/spot/settings.json`` (mode 0600: it holds every user's webhook secret). A
user's secret is created the first time their settings are read, so the secret is known before
the first webhook is signed with it.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from gpulab.spawners.market.store import SETTINGS_FILE, read_json, write_json_atomic


class SpotSettings:
    """Read and change users' spot settings in the market's directory."""

    def __init__(self, market_dir: Path) -> None:
        self.path = market_dir / SETTINGS_FILE

    def get(self, user: str, create_secret: bool = True) -> dict[str, Any]:
        """``user``'s settings: webhook_url, checkpoint_command (None when unset) and
        webhook_secret (created and saved first if missing, unless ``create_secret`` is False)."""
        all_settings = read_json(self.path, {})
        mine = all_settings.get(user, {})
        if create_secret and not mine.get("webhook_secret"):
            mine["webhook_secret"] = secrets.token_hex(32)
            all_settings[user] = mine
            write_json_atomic(self.path, all_settings)
        return {"webhook_url": None, "checkpoint_command": None, **mine}

    def update(self, user: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply validated ``changes`` to ``user``'s settings; returns them all."""
        all_settings = read_json(self.path, {})
        mine = {**self.get(user), **changes}
        all_settings[user] = mine
        write_json_atomic(self.path, all_settings)
        return mine
