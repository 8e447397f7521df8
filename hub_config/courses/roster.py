"""The roster CSV a teacher uploads: ``username,role`` per line, checked whole before use.

A header line (``username,role``) is optional; ``role`` is ``student`` (the default when the
column is empty or missing), ``ta`` or ``teacher``. Every row is checked first and the first bad
one is reported with its line number and field, so a roster with one bad row changes nothing.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from dataclasses import dataclass

from gpulab.hub_config.courses.groups import ROLES, CourseError

MAX_ROWS = 5000
# Readable, portable names: they become Unix accounts, container names and paths.
USERNAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ROLE_ALIASES = {"student": "student", "learner": "student", "ta": "ta", "teacher": "teacher"}


@dataclass(frozen=True)
class RosterRow:
    line: int
    username: str
    role: str


def parse_roster(
    text: str, normalize: Callable[[str], str], valid: Callable[[str], bool]
) -> list[RosterRow]:
    """Rows of a roster CSV; raise :class:`CourseError` (400) naming the line and field."""
    rows: list[RosterRow] = []
    seen: dict[str, int] = {}
    reader = csv.reader(io.StringIO(text))
    for number, cells in enumerate(reader, start=1):
        cells = [c.strip() for c in cells]
        if not any(cells):
            continue
        if number == 1 and cells[0].lower() in ("username", "user", "name"):
            continue
        if len(cells) > 2:
            raise CourseError(
                400, f"roster line {number}", f"expected 2 columns: username,role; got {len(cells)}"
            )
        raw_name = cells[0]
        name = normalize(raw_name)
        if not USERNAME_RE.match(name) or not valid(name):
            raise CourseError(
                400,
                f"roster line {number}: username",
                f"{raw_name!r} is not a valid username (up to 63 lowercase letters, digits, '.', "
                "'_' or '-', starting with a letter or digit)",
            )
        role_cell = (cells[1] if len(cells) > 1 else "").lower() or "student"
        role = ROLE_ALIASES.get(role_cell)
        if role is None:
            raise CourseError(
                400,
                f"roster line {number}: role",
                f"unknown role {cells[1]!r}; allowed: {', '.join(ROLES)}",
            )
        if name in seen:
            raise CourseError(
                400,
                f"roster line {number}: username",
                f"{name!r} is listed twice (lines {seen[name]} and {number})",
            )
        seen[name] = number
        rows.append(RosterRow(number, name, role))
        if len(rows) > MAX_ROWS:
            raise CourseError(400, "roster", f"at most {MAX_ROWS} rows per upload")
    if not rows:
        raise CourseError(400, "roster", "no rows; expected lines of username,role")
    return rows
