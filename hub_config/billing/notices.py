"""Messages the platform leaves a user when it acts on their server by itself (an idle GPU moved
to no-GPU mode, an idle server stopped), shown in JupyterLab and on the hub's pages.

Kept in ``DATA_DIR/notices.json`` (the last few per user), so they survive a hub restart.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

KEEP = 10


class Notices:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._data: dict[str, list[dict[str, Any]]] = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            self._data = {}

    def add(self, user: str, kind: str, message: str, *, at: float) -> dict[str, Any]:
        notice = {"kind": kind, "message": message, "t": at}
        with self._lock:
            self._data[user] = [*self._data.get(user, []), notice][-KEEP:]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._data))
            os.replace(tmp, self.path)
        return notice

    def for_user(self, user: str, since: float = 0.0) -> list[dict[str, Any]]:
        with self._lock:
            return [n for n in self._data.get(user, []) if n["t"] > since]


_STORES: dict[Path, Notices] = {}


def notices_for(data_dir: str | os.PathLike) -> Notices:
    """The notices of a hub's data dir (one store per process)."""
    path = Path(data_dir) / "notices.json"
    store = _STORES.get(path)
    if store is None:
        store = _STORES[path] = Notices(path)
    return store
