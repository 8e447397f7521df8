"""Files the hub keeps in its data dir that must stay private: generated secrets (mode 0600)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def secret_file(path: Path) -> str:
    """A random token kept in ``path`` (mode 0600), created on first use."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        _create_private(path, secrets.token_hex(32))
        return path.read_text().strip()


def admin_password(data_dir: Path) -> tuple[str, bool]:
    """The first admin's password (``DATA_DIR/admin-password``), and whether it was just made."""
    path = Path(data_dir) / "admin-password"
    try:
        return path.read_text().strip(), False
    except FileNotFoundError:
        pass
    try:
        _create_private(path, secrets.token_urlsafe(15) + "\n")
    except FileExistsError:  # another process made it first
        return path.read_text().strip(), False
    return path.read_text().strip(), True


def _create_private(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(content)
