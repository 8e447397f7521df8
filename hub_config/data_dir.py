"""The hub's data dir and the files in it that must stay private.

Everything the hub (and the billing service and fork server it starts) creates is private to its
user: :func:`make_private_data_dir` sets the process umask to 077, so databases, logs, ledgers
and secrets are 0600 and folders 0700. The data dir itself is 0711 when users' homes live inside
it (the default): each user's server may pass through to its own home (0700, its own account),
but nobody may list the data dir or open anything else in it.
"""

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


def make_private_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` (0711, see above) and make this process's new files private."""
    os.umask(0o077)
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o711)
