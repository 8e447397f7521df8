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
