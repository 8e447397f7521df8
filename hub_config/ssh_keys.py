"""Users' SSH public keys, kept by the hub: what the SSH gateway (``gpulab.ssh_service``) asks
about when someone offers a key for ``ssh NAME@hub``.

Why the hub keeps them (and not ``~/.ssh/authorized_keys`` in the home): the home is the user's
to write, and so to anything running in their server, course staff who reach it included; a key
in the home would let whoever can write a file there log in over SSH. Keys added here come only
from the user themselves (their log-in, or a token of theirs: :mod:`gpulab.hub_config.api.ssh`).

- :func:`parse_key` reads one OpenSSH public-key line (``TYPE BASE64 [comment]``) strictly:
  no authorized_keys options, no private keys pasted by mistake, no DSA, no RSA below 2048 bits;
  every refusal is a :class:`KeyRefused` whose message names ``key`` and says what is allowed.
- :class:`SshKeyStore` keeps every user's keys in ``DATA_DIR/ssh/keys.json`` (root's, 0600, in a
  0700 folder): written to a temporary file, fsynced, renamed over the old one, so a crash leaves
  either the old or the new file. A key belongs to one account only (the fingerprint names its
  user), and each record carries the user's creation time in the hub: a user deleted and made
  again under the same name (someone else) does not inherit the old keys.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

# What a user may add: the algorithms OpenSSH's client makes by default and the FIDO ones.
ALLOWED_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
MIN_RSA_BITS = 2048
MAX_KEY_CHARS = 16_384  # an RSA-16384 public key is ~2,800 characters
MAX_TITLE_CHARS = 100
ALLOWED = (
    "one OpenSSH public key line, e.g. the contents of ~/.ssh/id_ed25519.pub: "
    "'TYPE BASE64 [comment]' with TYPE one of " + ", ".join(ALLOWED_TYPES) + f" (RSA at least "
    f"{MIN_RSA_BITS} bits)"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0080-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u206f]")


class KeyRefused(ValueError):
    """A key (or its title) that is not allowed; ``field`` names the request's field."""

    def __init__(self, message: str, field: str = "key", status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass(frozen=True)
class ParsedKey:
    type: str
    fingerprint: str  # SHA256:..., as `ssh-keygen -l` prints it
    bits: int | None
    line: str  # TYPE BASE64 (no comment)
    comment: str


def parse_key(text: Any) -> ParsedKey:
    """The public key in ``text`` (one OpenSSH line), checked; :class:`KeyRefused` otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise KeyRefused(f"key: required; {ALLOWED}")
    if len(text) > MAX_KEY_CHARS:
        raise KeyRefused(f"key: too long ({len(text)} characters); {ALLOWED}")
    if "PRIVATE KEY" in text or "PuTTY-User-Key-File" in text:
        raise KeyRefused(
            "key: this is a PRIVATE key; never paste it anywhere. Paste the PUBLIC key (the .pub "
            f"file, e.g. ~/.ssh/id_ed25519.pub) instead; {ALLOWED}"
        )
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) != 1:
        raise KeyRefused(f"key: one key per request ({len(lines)} lines given); {ALLOWED}")
    parts = lines[0].strip().split(None, 2)
    if len(parts) < 2 or parts[0] not in (*ALLOWED_TYPES, "ssh-dss"):
        if parts and parts[0] not in ALLOWED_TYPES and any(t in lines[0] for t in ALLOWED_TYPES):
            raise KeyRefused(
                "key: options before the key type (authorized_keys options such as "
                f"command=...) are not accepted; {ALLOWED}"
            )
        raise KeyRefused(f"key: not a public key line of an allowed type; {ALLOWED}")
    kind, blob_text = parts[0], parts[1]
    comment = parts[2].strip() if len(parts) > 2 else ""
    if kind == "ssh-dss":
        raise KeyRefused(f"key: DSA keys are refused (broken, and OpenSSH dropped them); {ALLOWED}")
    try:
        blob = base64.b64decode(blob_text, validate=True)
    except (binascii.Error, ValueError):
        raise KeyRefused(f"key: the key data is not valid base64; {ALLOWED}") from None
    try:
        key = asyncssh.import_public_key(f"{kind} {blob_text}\n")
    except (asyncssh.KeyImportError, ValueError) as e:
        raise KeyRefused(f"key: not a valid {kind} key ({e}); {ALLOWED}") from None
    if key.get_algorithm() != kind or key.public_data != blob:
        raise KeyRefused(f"key: the key data is not a {kind} key; {ALLOWED}")
    bits = None
    if kind == "ssh-rsa":
        bits = int(key.pyca_key.key_size)
        if bits < MIN_RSA_BITS:
            raise KeyRefused(
                f"key: RSA keys need at least {MIN_RSA_BITS} bits (this one has {bits}): make an "
                f"ed25519 key (ssh-keygen -t ed25519); {ALLOWED}"
            )
    return ParsedKey(
        type=kind,
        fingerprint=key.get_fingerprint("sha256"),
        bits=bits,
        line=f"{kind} {blob_text}",
        comment=_clean(comment)[:MAX_TITLE_CHARS],
    )


def check_title(title: Any) -> str:
    """A key's title as given (or "" for none): text, at most ``MAX_TITLE_CHARS``, printable."""
    if title is None:
        return ""
    if not isinstance(title, str):
        raise KeyRefused("title: must be text", field="title")
    title = title.strip()
    if len(title) > MAX_TITLE_CHARS:
        raise KeyRefused(f"title: at most {MAX_TITLE_CHARS} characters", field="title")
    if _CONTROL.search(title):
        raise KeyRefused("title: no control or invisible characters", field="title")
    return title


def _clean(text: str) -> str:
    return _CONTROL.sub("", text).strip()


class SshKeyStore:
    """Every user's keys in one JSON file (blocking: call from a thread)."""

    def __init__(self, data_dir: str | os.PathLike, max_keys: int = 10) -> None:
        self.dir = Path(data_dir) / "ssh"
        self.path = self.dir / "keys.json"
        self.max_keys = max_keys
        self._lock = threading.Lock()

    # ---- file --------------------------------------------------------------------------------

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return dict(data.get("keys", {}))

    def _write(self, keys: dict[str, dict[str, Any]]) -> None:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        tmp = self.dir / f".keys.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"version": 1, "keys": keys}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # ---- keys --------------------------------------------------------------------------------

    @staticmethod
    def describe(fingerprint: str, rec: dict[str, Any]) -> dict[str, Any]:
        return {
            "fingerprint": fingerprint,
            "type": rec["type"],
            "bits": rec.get("bits"),
            "title": rec.get("title", ""),
            "added": rec["added"],
            "last_used": rec.get("last_used"),
        }

    def list(self, user: str, created: str) -> list[dict[str, Any]]:
        """``user``'s keys (those of a former account of that name are not theirs), oldest
        first."""
        with self._lock:
            keys = self._read()
        mine = [
            self.describe(fp, rec)
            for fp, rec in keys.items()
            if rec["user"] == user and rec.get("user_created") == created
        ]
        order = {fp: rec.get("added_ts", 0.0) for fp, rec in keys.items()}
        return sorted(mine, key=lambda k: (order[k["fingerprint"]], k["fingerprint"]))

    def add(self, user: str, created: str, text: Any, title: Any = None) -> dict[str, Any]:
        """Add the key in ``text`` to ``user``; :class:`KeyRefused` for a bad, weak or duplicate
        key, or one too many."""
        parsed = parse_key(text)
        title = check_title(title) or parsed.comment
        with self._lock:
            keys = self._read()
            # Keys of a former account of the same name go at the first change.
            keys = {
                fp: r
                for fp, r in keys.items()
                if r["user"] != user or r.get("user_created") == created
            }
            held = keys.get(parsed.fingerprint)
            if held is not None:
                whose = "your account" if held["user"] == user else "another account"
                raise KeyRefused(
                    f"key: this key ({parsed.fingerprint}) is already registered to {whose}; "
                    "a key can belong to one account only (make a new one: ssh-keygen -t ed25519)"
                )
            count = sum(1 for r in keys.values() if r["user"] == user)
            if count >= self.max_keys:
                raise KeyRefused(
                    f"key: you have {count} keys, the most allowed is {self.max_keys}; remove "
                    "one first",
                    status=409,
                )
            rec = {
                "user": user,
                "user_created": created,
                "type": parsed.type,
                "bits": parsed.bits,
                "key": parsed.line,
                "title": title,
                "added": _now(),
                "added_ts": time.time(),
            }
            keys[parsed.fingerprint] = rec
            self._write(keys)
        return self.describe(parsed.fingerprint, rec)

    def remove(self, user: str, fingerprint: str) -> bool:
        """Remove ``user``'s key ``fingerprint``; False when they have no such key."""
        with self._lock:
            keys = self._read()
            rec = keys.get(fingerprint)
            if rec is None or rec["user"] != user:
                return False
            del keys[fingerprint]
            self._write(keys)
        return True

    def owner(self, fingerprint: str) -> tuple[str, str] | None:
        """(user, user_created) the key ``fingerprint`` belongs to, or None."""
        with self._lock:
            rec = self._read().get(fingerprint)
        return (rec["user"], rec.get("user_created", "")) if rec else None

    def touch(self, fingerprint: str, every: float = 60.0) -> None:
        """Record that the key was used to log in (at most once per ``every`` seconds)."""
        with self._lock:
            keys = self._read()
            rec = keys.get(fingerprint)
            if rec is None:
                return
            last = rec.get("last_used_ts", 0)
            if time.time() - last < every:
                return
            rec["last_used"] = _now()
            rec["last_used_ts"] = time.time()
            self._write(keys)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
