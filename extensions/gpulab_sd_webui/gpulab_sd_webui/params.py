"""What a txt2img request may ask for, checked before anything runs or is written.

The fields are AUTOMATIC1111's names. A field this app cannot honour is refused rather than
ignored (an ignored ``batch_size: 4`` would silently return one image); the few that A1111 clients
send by habit are accepted when they ask for what this app does anyway.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MAX_SEED = 2**32 - 1  # A1111's seed range (numpy's), so a seed means the same in both
MAX_PROMPT_CHARS = 10_000


@dataclass(frozen=True)
class Txt2ImgRequest:
    prompt: str
    negative_prompt: str = ""
    steps: int = 4
    width: int = 64
    height: int = 64
    seed: int = -1  # -1: a random seed, reported back in the answer's info
    cfg_scale: float = 7.0
    save_images: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class BadRequest(ValueError):
    """A request the app refuses; ``field`` names the culprit, ``allowed`` what it may be."""

    def __init__(self, field: str, allowed: str, got: Any = None, missing: bool = False) -> None:
        self.field = field
        self.allowed = allowed
        if missing:
            text = f"{field}: required field is missing; allowed: {allowed}"
        else:
            text = f"{field}: got {got!r}; allowed: {allowed}"
        super().__init__(text)

    def as_json(self) -> dict[str, str]:
        return {"detail": str(self), "field": self.field, "allowed": self.allowed}


def _int(field: str, value: Any, low: int, high: int, allowed: str, step: int = 1) -> int:
    # bool is an int in Python; a JSON true is not a step count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(field, allowed, value)
    if not low <= value <= high or value % step:
        raise BadRequest(field, allowed, value)
    return value


def _seed(value: Any) -> int:
    allowed = f"an integer from 0 to {MAX_SEED}, or -1 for a random seed"
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("seed", allowed, value)
    if value != -1 and not 0 <= value <= MAX_SEED:
        raise BadRequest("seed", allowed, value)
    return value


def _number(field: str, value: Any, low: float, high: float) -> float:
    allowed = f"a number from {low:g} to {high:g}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(field, allowed, value)
    if not low <= value <= high:
        raise BadRequest(field, allowed, value)
    return float(value)


def _text(field: str, value: Any) -> str:
    allowed = f"a string of at most {MAX_PROMPT_CHARS} characters"
    if not isinstance(value, str) or len(value) > MAX_PROMPT_CHARS:
        raise BadRequest(field, allowed, value if not isinstance(value, str) else "(too long)")
    return value


def _size(field: str, value: Any) -> int:
    return _int(field, value, 32, 1024, "a multiple of 8 from 32 to 1024", step=8)


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(field, "true or false", value)
    return value


def _only(field: str, value: Any, accepted: tuple[Any, ...], allowed: str) -> None:
    # Exact type too: a JSON 1.0 or true is not the integer 1.
    if not any(type(value) is type(a) and value == a for a in accepted):
        raise BadRequest(field, allowed, value)


# Field -> (kind, check): the kind tells how a query-string value is read (SSE requests).
CHECKS: dict[str, tuple[str, Any]] = {
    "prompt": ("str", _text),
    "negative_prompt": ("str", _text),
    "steps": ("int", lambda f, v: _int(f, v, 1, 50, "an integer from 1 to 50")),
    "width": ("int", _size),
    "height": ("int", _size),
    "seed": ("int", lambda f, v: _seed(v)),
    "cfg_scale": ("float", lambda f, v: _number(f, v, 1, 30)),
    "save_images": ("bool", _bool),
}
# A1111 fields accepted only with the value that means what this app does anyway.
FIXED: dict[str, tuple[str, tuple[Any, ...], str]] = {
    "batch_size": ("int", (1,), "1 (one image per request)"),
    "n_iter": ("int", (1,), "1 (one image per request)"),
    "send_images": ("bool", (True,), "true"),
}
# Accepted and not honoured: the model's own scheduler samples; info's sampler_name says which.
IGNORED = {"sampler_name": "str", "sampler_index": "str"}
ALLOWED_FIELDS = ", ".join([*CHECKS, *FIXED, *IGNORED])


def parse_txt2img(data: Any) -> Txt2ImgRequest:
    """The request ``data`` (decoded JSON) asks for, or BadRequest naming the first bad field."""
    if not isinstance(data, dict):
        raise BadRequest("body", "a JSON object with txt2img fields", type(data).__name__)
    if "prompt" not in data:
        raise BadRequest("prompt", "a string", missing=True)
    values: dict[str, Any] = {}
    for field, value in data.items():
        if field in CHECKS:
            values[field] = CHECKS[field][1](field, value)
        elif field in FIXED:
            _, accepted, allowed = FIXED[field]
            _only(field, value, accepted, allowed)
        elif field in IGNORED:
            _text(field, value)
        else:
            raise BadRequest(str(field), f"one of the fields {ALLOWED_FIELDS}", "unknown field")
    return Txt2ImgRequest(**values)


def _from_text(field: str, kind: str, text: str) -> Any:
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            return text  # the field's own check then refuses it, naming what it allows
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            return text
    if kind == "bool":
        return {"true": True, "false": False, "1": True, "0": False}.get(text.lower(), text)
    return text


def parse_query(args: dict[str, list[bytes]]) -> Txt2ImgRequest:
    """As ``parse_txt2img``, from a query string (``?prompt=...&steps=4``); the last value of a
    repeated field counts."""
    kinds = {f: kind for f, (kind, _) in CHECKS.items()}
    kinds.update({f: kind for f, (kind, _, _) in FIXED.items()})
    kinds.update(IGNORED)
    data: dict[str, Any] = {}
    for field, raw in args.items():
        text = raw[-1].decode("utf-8", errors="replace")
        data[field] = _from_text(field, kinds[field], text) if field in kinds else text
    return parse_txt2img(data)
