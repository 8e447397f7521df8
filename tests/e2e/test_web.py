"""What a person sees in the browser: sign-up, approval, log-in, the spawn form, the pool API."""

from __future__ import annotations

import re
import uuid

from harness import Hub, WebSession, admin_web, approve


def test_admin_password_is_random_and_private(hub: Hub) -> None:
    path = hub.data_dir / "admin-password"
    password = path.read_text().strip()
    assert len(password) >= 16
    assert path.stat().st_mode & 0o077 == 0
    assert not WebSession(hub).login("admin", "admin")
    assert not WebSession(hub).login("admin", "password")
    assert admin_web(hub)


def test_sign_up_needs_admin_approval_then_logs_in(hub: Hub) -> None:
    name, password = f"student{uuid.uuid4().hex[:6]}", "correct-horse-battery"
    web = WebSession(hub)
    r = web.signup(name, password)
    assert r.ok and "sent to the admin" in r.text, r.text[-3000:]
    assert not web.login(name, password)

    approve(hub, name)
    assert WebSession(hub).login(name, password)


def test_spawn_form_shows_the_live_pool_and_starts_what_was_chosen(hub: Hub) -> None:
    name, password = f"renter{uuid.uuid4().hex[:6]}", "correct-horse-battery"
    WebSession(hub).signup(name, password)
    approve(hub, name)
    web = WebSession(hub)
    assert web.login(name, password)

    page = web.get(f"/hub/spawn/{name}").text
    text = re.sub(r"<[^>]+>", " ", page)
    text = re.sub(r"\s+", " ", text)
    assert (
        "A100-80G simulated 80 GB VRAM · CNY 2.10/h per card · spot from 0.90 2/2 free"
        in text.replace("&middot;", "·")
    )
    assert "RTX 4090 simulated 24 GB VRAM" in text
    assert "No GPU CNY 0.09/h · write and debug code on the same disk" in text.replace(
        "&middot;", "·"
    )
    assert "scikit-learn toy datasets" in text and "BSD-3-Clause" in text

    try:
        r = web.post(
            f"/hub/spawn/{name}",
            [
                ("gpu", "a100-80g"),
                ("gpus", "1"),
                ("image", "base"),
                ("datasets", "sklearn-toy"),
                ("pricing", "on-demand"),
                ("max_price", ""),
            ],
        )
        assert r.ok, r.text
        # Straight from the form into JupyterLab: no progress page in between.
        hops = [h.url for h in r.history]
        assert not any("/spawn-pending/" in u for u in hops), hops
        assert r.url.endswith(f"/user/{name}/lab") and "JupyterLab" in r.text, r.url
        server = hub.wait_ready(name)
        assert server["user_options"]["gpu"] == "a100-80g"
        assert server["user_options"]["datasets"] == ["sklearn-toy"]
        # The browser lands in JupyterLab.
        lab = web.get(f"/hub/spawn/{name}")
        assert lab.url.endswith(f"/user/{name}/lab") and "JupyterLab" in lab.text
        # The form's live refresh (same-origin fetch with the XSRF header) sees the card taken.
        xsrf = web.http.cookies.get("_xsrf", path="/hub/")
        pool = web.get("/hub/api/gpulab/pool", headers={"X-XSRFToken": xsrf}).json()
        a100 = next(t for t in pool["gpu_types"] if t["slug"] == "a100-80g")
        assert (a100["free"], a100["total"]) == (1, 2)
        with hub.kernel(name) as k:
            uuid_ = server["state"]["allocation"]["uuids"][0]
            assert (
                k.execute("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() == uuid_
            )
    finally:
        if hub.server(name):
            hub.stop_server(name)


def test_pool_api_scopes(hub: Hub, user: str) -> None:
    hub.spawn_ready(user, {"gpu": "rtx-4090"})
    other = hub.create_user()
    token = hub.api("POST", f"/users/{other}/tokens", json={"expires_in": 600}).json()["token"]
    as_user = hub.api("GET", "/gpulab/pool", token=token)
    assert as_user.status_code == 200
    held = [g for g in as_user.json()["gpus"] if g["held"]]
    assert held and all("holder" not in g and g["yours"] is False for g in held)
    as_admin = [g for g in hub.pool()["gpus"] if g["held"]]
    assert f"{user}/" in {g["holder"] for g in as_admin}
    catalog = hub.api("GET", "/gpulab/catalog", token=token).json()
    assert catalog["no_gpu"]["price_per_hour"] == "0.09"
    anonymous = hub.api("GET", "/gpulab/pool", token="not-a-token")
    assert anonymous.status_code == 403
