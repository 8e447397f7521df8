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
