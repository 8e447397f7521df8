"""Each user's own Unix account for local servers, when the hub runs as root.

The JupyterHub ecosystem's convention (The Littlest JupyterHub) is one account per hub user, named
``jupyter-NAME``. They are regular accounts (useradd's UID_MIN..UID_MAX, about 59,000), not
system ones: the system range (100..999) holds fewer than 900, and a platform outgrows that.
Kernels then run as that account, so they cannot read the hub's secrets (files 0600 and
``/proc/PID/environ`` of root's processes), another user's home (0700) or signal another user's
processes. Accounts are made once, on a user's first spawn.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

PREFIX = "jupyter-"
# useradd's limit on Debian (and the one shown by `ps`/`ls` without truncation).
MAX_LEN = 32
_UNSAFE = re.compile(r"[^a-z0-9_-]")

_lock = threading.Lock()
# useradd lives in sbin, which a hub started from a user's shell may not have on its PATH.
_SBIN = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])


class AccountError(RuntimeError):
    """The account could not be made or found; the message says why."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


# Hex digits of SHA-256 in an escaped account name: 64 bits, so that nobody can search for a
# name that shares another user's account (32 bits fall to a laptop in minutes).
DIGEST_HEX = 16
# Used as they are: no capitals, no "--", no "-" at either end.
_PLAIN = re.compile(r"[a-z0-9_]+(?:-[a-z0-9_]+)*")


def account_name(username: str, prefix: str = PREFIX) -> str:
    """``jupyter-alice``: one Unix account per hub user, never shared.

    A name that is safe as it is (lowercase letters, digits, ``_``, and single ``-`` between them) and short
    enough is used plainly. Every other name (capitals, ``@``, ``--``, too long) is escaped as
    ``PREFIX + its first letters + '--' + 64 bits of SHA-256`` of the original name, so ``Ann``
    and ``ann`` differ. Escaped names always hold ``--`` and plain ones never do: nobody can sign
    up under a plain name equal to another user's escaped one (a tester did, with the old
    ``-``-joined 32-bit form, and shared the victim's account)."""
    safe = _UNSAFE.sub("-", username.lower())
    name = prefix + safe
    if _PLAIN.fullmatch(username) and len(name) <= MAX_LEN:
        return name
    digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]
    keep = max(0, MAX_LEN - len(prefix) - 2 - DIGEST_HEX)
    return f"{prefix}{safe[:keep].rstrip('-')}--{digest}"


def lookup(name: str) -> Account | None:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    return Account(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, home=pw.pw_dir)


def ensure_account(name: str, home: str | os.PathLike) -> Account:
    """The account ``name`` with ``home``, created if missing (blocking: run it in a thread).

    The home directory itself is made by the caller (it lives under the hub's data dir, which
    useradd must not populate from /etc/skel).
    """
    with _lock:
        found = lookup(name)
        if found is not None:
            return found
        useradd = shutil.which("useradd", path=_SBIN) or shutil.which("useradd")
        if useradd is None:
            raise AccountError("useradd is missing (Debian: apt-get install passwd)")
        cmd = [
            useradd,
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/bin/bash",
            "--user-group",
            "--comment",
            "gpulab user",
            name,
        ]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise AccountError(f"could not run useradd for {name}: {e}") from None
        found = lookup(name)
        if found is None:
            raise AccountError(
                f"useradd {name} failed ({out.returncode}): {out.stderr.strip() or out.stdout}"
            )
        return found


def blocked_at(path: str | os.PathLike, account: Account) -> Path | None:
    """The first folder on the way to ``path`` that ``account`` may not pass through (no
    execute bit for it), or None when it can reach ``path``."""
    target = Path(path).absolute()
    for folder in [*reversed(target.parents)]:
        st = folder.stat()
        if st.st_uid == account.uid:
            bit = 0o100
        elif st.st_gid == account.gid:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            return folder
    return None


def changeable_at(path: str | os.PathLike, account: Account) -> Path | None:
    """The first folder above ``path`` that ``account`` could change, or None. A home below such
    a folder could be swapped for a link by its user, and root, which prepares the home, would
    then act wherever it points.

    Changeable: a folder the account owns or may write to; a link owned by anyone but root (or
    the hub); below a sticky folder anyone may write to (``/tmp``), an entry not made by root (or
    the hub). The home's own folder may not be writable by others at all, sticky or not: the
    home's name could be taken before the hub makes it.
    """
    trusted = {0, os.geteuid()}
    below_shared = False
    target = Path(path).absolute()
    for folder in [*reversed(target.parents)]:
        lst = folder.lstat()
        if lst.st_uid not in trusted and (below_shared or stat.S_ISLNK(lst.st_mode)):
            return folder
        st = folder.stat()
        if st.st_uid == account.uid:
            return folder
        writable = st.st_mode & stat.S_IWOTH or (
            st.st_gid == account.gid and st.st_mode & stat.S_IWGRP
        )
        if writable and (folder == target.parent or not st.st_mode & stat.S_ISVTX):
            return folder
        below_shared = bool(writable)
    return None


def prepare_home(home: Path, account: Account) -> None:
    """The home exists, belongs to the account and is private (0700).

    The home itself is the hub's path (no folder above it is the user's: :func:`changeable_at`),
    but everything inside it is the user's, and may be a link anywhere: the hand-over walks it by
    descriptors (``os.fwalk``, which never follows a link, also one swapped in meanwhile) and
    changes entries by name inside their folder without following links.
    """
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (account.uid, account.gid):
            # A home made before isolation (or by a restore) still holds root's files: hand all
            # of it over once, so the user can keep working on their files.
            _hand_over_tree(fd, account)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _hand_over_tree(home_fd: int, account: Account) -> None:
    ids = (account.uid, account.gid)
    # Bottom-up: each folder is handed over only after its entries, so the entries are changed
    # while their folder is still root's and nobody else can swap them.
    walk = os.fwalk(".", dir_fd=home_fd, topdown=False, follow_symlinks=False)
    for _, dirs, files, dir_fd in walk:
        if os.fstat(dir_fd).st_uid != 0:
            continue  # the user's already: whatever is in it may change under us
        for name in dirs + files:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                # A file with other names elsewhere (a hard link to, say, /etc/shadow) is not
                # the home's to give away.
                if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                    continue
                os.chown(name, *ids, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass
    os.fchown(home_fd, *ids)
