"""A job attempt's server tokens die with the attempt (issue 26, F6).

JupyterHub gives every server it starts an API token of its owner (note ``Server at
/user/NAME/SERVER/``, no expiry) and deletes it in ``User.stop`` only if the spawner still holds
it then. A job server always ends by itself (the runner exits), and the local spawner's poll that
sees the exit clears its state, the token included, before ``User.stop`` reads it: so every
attempt left one permanent credential of its owner behind (it could submit billed jobs, start and
stop the owner's servers), and a job that printed its environment leaked it into its log.

When an attempt's servers have stopped, the scheduler calls :func:`revoke`: in the hub's own
process, every API token of the owner that JupyterHub made for one of those servers is deleted
(the token a server re-used, ``retrieved from spawner SERVER``, too). Plain servers are left to
JupyterHub as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from jupyterhub import orm
from jupyterhub.utils import url_escape_path, url_path_join

from gpulab.spawners.node.allocator import owner_key


def server_token_notes(user_base_url: str, servers: Iterable[str]) -> set[str]:
    """The notes JupyterHub writes on the tokens it makes for ``servers`` of the user whose
    server URLs start with ``user_base_url`` (``/user/NAME/``)."""
    notes = set()
    for server in servers:
        notes.add(f"Server at {url_path_join(user_base_url, url_escape_path(server), '/')}")
        notes.add(f"retrieved from spawner {server}")
    return notes


def revoke(owner: str, servers: list[str], spawner_record: Callable[[str], Any], log: Any) -> int:
    """Delete every API token of ``owner`` made for one of ``servers`` (their attempt has ended);
    returns how many. ``spawner_record``: the hub's spawner of a server, also of a stopped one
    (through it, the hub's database and the owner's record). Never raises."""
    try:
        spawners = [spawner_record(owner_key(owner, s)) for s in servers]
        user = next((s.user for s in spawners if getattr(s, "user", None) is not None), None)
        if user is None:
            return 0
        notes = server_token_notes(user.base_url, servers)
        gone = [t for t in list(user.orm_user.api_tokens) if (t.note or "") in notes]
        for spawner in spawners:  # the token a spawner still holds, whatever its note
            secret = getattr(spawner, "api_token", "") or ""
            held = orm.APIToken.find(user.db, secret) if secret else None
            if held is not None and held.user is user.orm_user and held not in gone:
                gone.append(held)
        for token in gone:
            user.db.delete(token)
        if gone:
            user.db.commit()
            log.info("Revoked %d server token(s) of %s's ended job servers", len(gone), owner)
        return len(gone)
    except Exception:
        log.exception("Could not revoke the tokens of %s's job servers %s", owner, servers)
        return 0
