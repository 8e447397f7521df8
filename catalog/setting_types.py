"""What a ``GPULAB_*`` setting is: its declaration (:class:`Setting`) and how a value is parsed.

The table of every setting is :mod:`gpulab.catalog.settings`; this module is the type system it
stands on, kept apart so that the table reads as a table. A value that is not allowed raises
:class:`SettingError` naming the variable and what is allowed. Standard library only.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

# Types: how a value is parsed. Unset is the default; so is empty, except for "str", whose empty
# value is a value ("" for an optional address or name).
KINDS = {
    "str": "text",
    "path": "a path",
    "port": "a port 1-65535",
    "port-or-off": "a port 1-65535, or 0 for off",
    "number": "a number >= 0",
    "bool": "1 or 0 (also true/false, yes/no, on/off)",
    "choice": "one of the choices",
    "url": "an http(s) URL",
    "base-url": "an http(s)://HOST[:PORT] URL with no path",
    "list": "a comma-separated list",
    "args": "shell-quoted arguments",
    "json-map": 'a JSON object of strings, e.g. {"gpu-box-2": "tcp://10.0.0.12:2376"}',
    "int": "an integer",
}
SCOPES = ("operator", "internal", "test")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingError(ValueError):
    """A ``GPULAB_*`` value that is not allowed; the message names the variable."""


class _Why(ValueError):
    """Why a value is not allowed, when the type alone does not say (added to the message)."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: str
    default: Any
    help: str
    group: str = ""
    scope: str = "operator"
    # The flag of `gpulab up` (and `gpulab config`) that overrides it, if any.
    flag: str = ""
    choices: tuple[str, ...] = ()
    # Traitlets whose default (or value, set by the hub config) is this variable.
    traitlets: tuple[str, ...] = ()
    # Never printed (tokens; a password in a URL is masked).
    secret: bool = False
    # The default as the README and --help say it, where the value alone does not.
    default_text: str = ""

    @property
    def expected(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        return KINDS[self.kind]

    def shown_default(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default is None or self.default == "":
            return "(unset)"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)

    def text(self, value: Any) -> str:
        """``value`` as the environment says it (what :meth:`parse` reads back)."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "1" if value else "0"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        if isinstance(value, (tuple, list)):
            return ",".join(value) if self.kind == "list" else shlex.join(value)
        if isinstance(value, dict):
            return json.dumps(value)
        return str(value)

    def parse(self, raw: str | None, label: str = "") -> Any:
        """The typed value of ``raw`` (None: unset); :class:`SettingError` if not allowed, named
        by ``label`` (default: the variable)."""
        if raw is None or (raw.strip() == "" and self.kind != "str"):
            return self.default
        value = raw.strip()
        try:
            return _PARSERS[self.kind](self, value)
        except ValueError as e:
            why = f" ({e})" if isinstance(e, _Why) else ""
            raise SettingError(
                f"{label or self.name}: {raw!r} is not allowed; expected {self.expected}{why}"
            ) from None


def _port(s: Setting, v: str) -> int:
    port = int(v)
    if not 0 < port < 65536:
        raise ValueError
    return port


def _port_or_off(s: Setting, v: str) -> int:
    port = int(v)
    if not 0 <= port < 65536:
        raise ValueError
    return port


def _number(s: Setting, v: str) -> float:
    x = float(v)
    if not x >= 0 or x == float("inf"):
        raise ValueError
    return x


def _bool(s: Setting, v: str) -> bool:
    if v.lower() in _TRUE:
        return True
    if v.lower() in _FALSE:
        return False
    raise ValueError


def _choice(s: Setting, v: str) -> str:
    if v not in s.choices:
        raise ValueError
    return v


def _url(s: Setting, v: str) -> str:
    p = urlparse(v)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError
    return v


def _base_url(s: Setting, v: str) -> str:
    v = v.rstrip("/")
    p = urlparse(v)
    if p.scheme not in ("http", "https") or not p.hostname or p.path:
        raise ValueError
    return v


def _json_map(s: Setting, v: str) -> dict[str, str]:
    try:
        m = json.loads(v)
    except ValueError as e:
        raise _Why(f"not valid JSON: {e}") from None
    if not isinstance(m, dict) or not all(
        isinstance(k, str) and isinstance(x, str) for k, x in m.items()
    ):
        raise _Why("not an object of strings")
    return m


_PARSERS = {
    "str": lambda s, v: v,
    "path": lambda s, v: v,
    "port": _port,
    "port-or-off": _port_or_off,
    "number": _number,
    "bool": _bool,
    "choice": _choice,
    "url": _url,
    "base-url": _base_url,
    "list": lambda s, v: tuple(x.strip() for x in v.split(",") if x.strip()),
    "args": lambda s, v: shlex.split(v),
    "json-map": _json_map,
    "int": lambda s, v: int(v),
}
