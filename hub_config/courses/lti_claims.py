"""What an LTI 1.3 launch's claims mean to gpulab: the username, the course and the course role.

Pure functions of the id_token's claims (no request, no database), so the mapping is tested on
its own and :mod:`.lti`'s handlers stay about the OpenID Connect flow. The rules:
:func:`username_candidates` (the same LMS person always maps to the same readable hub name),
:func:`course_slug` (an LMS context as a course name) and :func:`course_role` (LIS roles as
student, TA or teacher).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tornado import web

from gpulab.hub_config.courses.roster import USERNAME_RE
from gpulab.spawners.options import COURSE_RE

CLAIM = "https://purl.imsglobal.org/spec/lti/claim/"
CONTEXT_CLAIM = CLAIM + "context"
ROLES_CLAIM = CLAIM + "roles"
DEPLOYMENT_CLAIM = CLAIM + "deployment_id"
VERSION_CLAIM = CLAIM + "version"
MESSAGE_TYPE_CLAIM = CLAIM + "message_type"
RESOURCE_LINK_CLAIM = CLAIM + "resource_link"
# Moodle's extension claim: {"user_username": the Moodle login name, ...}
MOODLE_EXT_CLAIM = "https://purl.imsglobal.org/spec/lti/claim/ext"
LIS = "http://purl.imsglobal.org/vocab/lis/v2/"
LTI11_ROLE = "urn:lti:role:ims/lis/"

USERNAME_MAX = 63
COURSE_MAX = 40
SUFFIX = 6

LOGIN_PATH = "/lti13/login"
LAUNCH_PATH = "/lti13/launch"


# ---- the mapping: claims -> username, context -> course, roles -> course role -------------------


def _ascii_lower(raw: str) -> str:
    return unicodedata.normalize("NFKD", raw).encode("ascii", "ignore").decode().lower()


def normalize_username(raw: str) -> str:
    """``raw`` as a hub username (``^[a-z0-9][a-z0-9._-]{0,62}$``), or "" when nothing is left:
    accents dropped, lowercase, other characters runs become '-'."""
    s = re.sub(r"[^a-z0-9._-]+", "-", _ascii_lower(raw))
    s = re.sub(r"[._-]{2,}", lambda m: m.group(0)[0], s)
    s = s.strip("._-")[:USERNAME_MAX].rstrip("._-")
    return s if USERNAME_RE.match(s) else ""


def username_candidates(claims: Mapping[str, Any]) -> list[str]:
    """Readable usernames for a launch, best first: ``preferred_username``, Moodle's login name,
    the local part of ``email``, ``name``, given + family name (each normalized)."""
    ext = claims.get(MOODLE_EXT_CLAIM)
    logins = [
        claims.get("preferred_username"),
        ext.get("user_username") if isinstance(ext, dict) else None,
    ]
    email = claims.get("email")
    names = [claims.get("name")]
    given, family = claims.get("given_name"), claims.get("family_name")
    if isinstance(given, str) or isinstance(family, str):
        names.append(" ".join(x for x in (given, family) if isinstance(x, str)))
    raw: list[Any] = [
        *(x.split("@", 1)[0] if isinstance(x, str) else x for x in logins),
        email.split("@", 1)[0] if isinstance(email, str) and "@" in email else None,
        *names,
    ]
    out: list[str] = []
    for value in raw:
        name = normalize_username(value) if isinstance(value, str) else ""
        if name and name not in out:
            out.append(name)
    return out


def stable_suffix(key: str, length: int = SUFFIX) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:length]


def with_suffix(base: str, key: str, max_len: int, length: int = SUFFIX) -> str:
    """``base-HASH``: a short suffix that is the same for the same ``key``, within ``max_len``."""
    return f"{base[: max_len - length - 1].rstrip('._-')}-{stable_suffix(key, length)}"


def pick_name(base: str, key: str, max_len: int, taken: Callable[[str], bool]) -> str:
    """``base`` when free, else ``base`` with the stable suffix of ``key`` (longer if need be)."""
    if base and not taken(base):
        return base
    for length in range(SUFFIX, 17, 2):
        name = with_suffix(base, key, max_len, length)
        if not taken(name):
            return name
    raise web.HTTPError(409, f"no free name for {base!r}")


def course_slug(label: Any, title: Any = None) -> str:
    """A course name from a context's label (else title): "ML 101" -> "ml-101"; "" if none."""
    for raw in (label, title):
        if not isinstance(raw, str):
            continue
        s = re.sub(r"[^a-z0-9]+", "-", _ascii_lower(raw)).strip("-")[:COURSE_MAX].rstrip("-")
        if s and COURSE_RE.match(s):
            return s
    return ""


def course_role(roles: Iterable[Any]) -> str | None:
    """The course role for an LTI roles claim: ``ta`` (Instructor#TeachingAssistant*, also when
    Instructor is sent beside it, as Canvas does), else ``teacher`` (Instructor and its other
    sub-roles), else ``student`` (Learner); None for anything else (Administrator, Mentor,
    institution and system roles). Full URIs, the LTI 1.1 URNs and short names are understood."""
    found: set[str] = set()
    for role in roles:
        if not isinstance(role, str):
            continue
        role = role.strip()
        if role.startswith(LIS + "membership"):
            tail = role[len(LIS + "membership") :]
        elif role.startswith(LTI11_ROLE):
            tail = role[len(LTI11_ROLE) :]
        elif re.fullmatch(r"[A-Za-z]+", role):
            tail = role
        else:
            continue
        parts = [p for p in re.split(r"[#/]", tail) if p]
        if not parts:
            continue
        principal, sub = parts[0], parts[-1]
        if principal == "TeachingAssistant" or (
            principal == "Instructor" and sub.startswith("TeachingAssistant")
        ):
            found.add("ta")
        elif principal == "Instructor":
            found.add("teacher")
        elif principal == "Learner":
            found.add("student")
    for role in ("ta", "teacher", "student"):
        if role in found:
            return role
    return None
