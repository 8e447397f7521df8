"""Courses through a real hub's API, as an admin and a teacher would make them."""

from __future__ import annotations

import requests
from harness import Hub


def token_for(hub: Hub, name: str) -> str:
    """An API token of ``name`` (made by the admin), with all of ``name``'s rights."""
    r = hub.api("POST", f"/users/{name}/tokens", json={"expires_in": 3600, "note": "course test"})
    assert r.status_code == 201, r.text
    return r.json()["token"]


def make_course(
    hub: Hub, name: str, teachers: list[str], tas: list[str] = (), **limits: list[str]
) -> dict:
    for person in (*teachers, *tas):  # staff are chosen from existing users (never created)
        hub.create_user(person)
    body = {
        "name": name,
        "display_name": f"Course {name}",
        "teachers": teachers,
        "tas": list(tas),
        "limits": limits,
    }
    r = hub.api("POST", "/gpulab/courses", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def roster(hub: Hub, course: str, text: str, token: str) -> requests.Response:
    return hub.api(
        "POST",
        f"/gpulab/courses/{course}/roster",
        token=token,
        data=text.encode(),
        headers={"Content-Type": "text/csv"},
    )


def fund_course(hub: Hub, course: str, amount: str = "5.00", cap: str = "5.00") -> None:
    """Top up ``course``'s credit pool and set its per-student cap (billing's API, as the admin):
    a server course staff start is paid by the pool only (attack 02), so it needs one."""
    base = f"{hub.url}/services/billing/api/v1/courses/{course}"
    auth = {"Authorization": f"token {hub.token}"}
    body = {"amount": amount, "kind": "topup", "idempotency_key": f"fund-{course}"}
    r = requests.post(f"{base}/credits", headers=auth, json=body, timeout=30)
    assert r.status_code in (200, 201), r.text
    r = requests.put(base, headers=auth, json={"cap": cap}, timeout=30)
    assert r.status_code == 200, r.text


# An nbgrader assignment (square(x), tests worth 1 and 2 points) written into a teacher's
# course source folder from their kernel; COURSE and ASSIGNMENT are replaced by the caller.
NBGRADER_SOURCE = r"""
import os, nbformat
from nbformat.v4 import new_notebook, new_code_cell, new_markdown_cell

def meta(grade_id, **kw):
    m = {"grade_id": grade_id, "schema_version": 3, "grade": False, "solution": False,
         "locked": False, "task": False}
    m.update(kw)
    return {"nbgrader": m}

nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                            "language": "python"}})
nb.cells = [
    new_markdown_cell("Write `square(x)`.", metadata=meta("intro", locked=True)),
    new_code_cell("def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION",
                  metadata=meta("square", solution=True)),
    new_code_cell("assert square(2) == 4", metadata=meta("test_pos", grade=True, locked=True,
                                                          points=1)),
    new_code_cell("assert square(-3) == 9", metadata=meta("test_neg", grade=True, locked=True,
                                                           points=2)),
]
folder = os.path.expanduser("~/courses/COURSE/source/ASSIGNMENT")
os.makedirs(folder, exist_ok=True)
nbformat.write(nb, os.path.join(folder, "ASSIGNMENT.ipynb"))
print("written")
"""
