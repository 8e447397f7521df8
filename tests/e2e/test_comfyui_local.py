"""Issue 22, a local ComfyUI: an operator enables the catalog's ``comfyui`` app for the embedded
local spawner by pointing ``[apps.comfyui] local_checkout`` at their ComfyUI checkout, and a user
launches it from the hub like any app, behind the hub's login.

ComfyUI itself cannot be installed here (no network; the package index has no ComfyUI server), so
the checkout is ``tests/comfyui_standin``: a small aiohttp server that behaves like ComfyUI's where
it matters (TCP-only ``--listen``/``--port`` through aiohttp's ``TCPSite``, its ``/`` page and
static frontend with the root-relative progress favicon, ``/system_stats``, a websocket with binary
frames, ``%2F`` user-data saves). See its docstring.

Points covered (each failed on the code before: the catalog had no way to run ComfyUI locally, so
the launch was refused with "needs the Docker spawner"):

- the launch starts the checkout as the user's own account and the app answers through the hub's
  proxy: page, websocket (text and binary frames), a ``%2F`` save into the user's home;
- nothing of it listens on TCP (other accounts on the node cannot reach it): it serves the
  jupyter-server-proxy Unix socket, in a folder only the user's account can enter;
- the frontend's ``/assets/images/favicon_progress_16x16/frame_N.png`` (asked for at the site
  root, a 404 behind the hub) is made relative to the page, and the frames load through the proxy.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import requests
import websocket
from apps_helpers import Console
from billing.client import user_token
from harness import FAST_BILLING_ENV, REPO, Hub, wait_for

STANDIN = REPO / "tests" / "comfyui_standin"


@pytest.fixture(scope="module")
def chub(module_hub_factory, tmp_path_factory) -> Hub:
    folder = tmp_path_factory.mktemp("comfy-catalog")
    text = (REPO / "catalog" / "catalog.toml").read_text()
    marker = '# local_checkout = "/opt/ComfyUI"'
    assert marker in text
    catalog = folder / "catalog.toml"
    catalog.write_text(text.replace(marker, f'local_checkout = "{STANDIN}"'))
    return module_hub_factory(
        "comfy-local", simulate="RTX-4090:1", catalog=catalog, env=FAST_BILLING_ENV
    )


def listening_tcp_inodes() -> set[str]:
    """Socket inodes of every TCP socket in LISTEN state on this node."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A":
                found.add(cols[9])
    return found


def socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:[") : -1])
    return out


def test_operator_enabled_comfyui_runs_on_a_unix_socket_behind_the_hub(chub: Hub) -> None:
    user = chub.create_user()
    token = user_token(chub, user)
    auth = {"Authorization": f"token {token}"}
    r = chub.api("POST", f"/gpulab/users/{user}/apps/comfyui/launch", token, json={})
    assert r.status_code == 202, r.text
    info = r.json()
    assert info["url"] == chub.user_url(user, "comfyui/")

    # Ready as the hub sees it (the app's own /system_stats through the proxy).
    def ready():
        s = chub.api("GET", f"/gpulab/users/{user}/launch", token).json()
        assert not s["failed"], s["failed"]
        return (s.get("app_probe") or {}).get("status") == 200

    wait_for(ready, 180, 0.5, "ComfyUI to answer ready")
    page = requests.get(info["url"], headers=auth, timeout=30)
    assert page.status_code == 200 and "ComfyUI stand-in" in page.text

    # It runs as the user's own account, from the operator's checkout, with its files at home.
    home = chub.data_dir / "users" / user
    ran = json.loads((home / "comfyui" / "output" / "standin-ran.json").read_text())
    assert ran["uid"] != 0
    assert ran["argv"]["user_directory"] == str(home / "comfyui" / "user")

    # Nothing of it listens on TCP: its only listening socket is jupyter-server-proxy's Unix
    # socket, in a folder only the user's account can enter.
    assert not socket_inodes(ran["pid"]) & listening_tcp_inodes()
    cmdline = Path(f"/proc/{ran['pid']}/cmdline").read_bytes().split(b"\0")
    # The path as the server sees it: its /tmp is its own (issue 23), reached from here through
    # the app's /proc root.
    inside = cmdline[cmdline.index(b"--unix-socket") + 1].decode()
    sock = Path(f"/proc/{ran['pid']}/root") / inside.lstrip("/")
    folder = sock.parent.stat()
    assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == ran["uid"]
    assert stat.S_IMODE(sock.stat().st_mode) & 0o077 == 0

    # The websocket, through the hub's proxy: a JSON status, then a binary preview frame.
    ws = websocket.create_connection(
        info["url"].replace("http://", "ws://") + "ws",
        header=[f"Authorization: token {token}"],
        timeout=30,
    )
    try:
        assert json.loads(ws.recv())["type"] == "status"
        opcode, frame = ws.recv_data()
        assert opcode == websocket.ABNF.OPCODE_BINARY and frame[4:12] == b"\x89PNG\r\n\x1a\n"
    finally:
        ws.close()

    # A workflow save with %2F reaches the app still encoded, and lands in the user's home.
    r = requests.post(
        info["url"] + "api/userdata/workflows%2Fmine.json",
        json={"nodes": [1]},
        headers=auth,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    saved = home / "comfyui" / "user" / "default" / "workflows" / "mine.json"
    assert json.loads(saved.read_text()) == {"nodes": [1]}

    # The progress favicon: named from the site root by the frontend, served relative to the
    # page instead, and its frames load through the proxy.
    answer = requests.get(info["url"] + "assets/app.js", headers=auth, timeout=30)
    assert answer.headers["Content-Type"].startswith("text/javascript")  # a module runs only so
    script = answer.text
    assert "'./assets/images/favicon_progress_16x16/frame_9.png'" in script
    assert "`./assets/images/favicon_progress_16x16/frame_" in script
    assert "'/assets/images" not in script and "`/assets/images" not in script
    frame = requests.get(
        info["url"] + "assets/images/favicon_progress_16x16/frame_3.png", headers=auth, timeout=30
    )
    assert frame.status_code == 200 and frame.content.startswith(b"\x89PNG")
    chub.stop_server(user)


def test_comfyui_page_in_a_browser_loads_its_favicon_frames_without_errors(chub: Hub, browser):
    """The issue's symptom as a person sees it: ComfyUI's frontend asked for
    ``/assets/images/favicon_progress_16x16/frame_N.png`` at the site root (404 behind the hub);
    the page now loads, its websocket delivers binary frames, and the console stays clean."""
    from harness import PASSWORD, SLOW, approved_user, browser_log_in

    name = approved_user(chub, "cf")
    context = browser.new_context(viewport={"width": 1024, "height": 600})
    page = context.new_page()
    console = Console(page)
    try:
        browser_log_in(page, chub, name, PASSWORD, timeout=SLOW)
        token = user_token(chub, name)
        r = chub.api("POST", f"/gpulab/users/{name}/apps/comfyui/launch", token, json={})
        assert r.status_code == 202, r.text
        url = r.json()["url"]
        wait_for(
            lambda: (
                (
                    chub.api("GET", f"/gpulab/users/{name}/launch", token).json().get("app_probe")
                    or {}
                ).get("status")
                == 200
            ),
            180,
            0.5,
            "ComfyUI to answer ready",
        )
        frames = []
        page.on(
            "response",
            lambda resp: "favicon_progress_16x16" in resp.url and frames.append(resp),
        )
        page.goto(url)
        page.locator("#ws", has_text="binary frames 1").wait_for(timeout=SLOW)
        page.wait_for_load_state("networkidle")
        if os.environ.get("GPULAB_SCREENSHOTS"):
            page.screenshot(path=os.path.join(os.environ["GPULAB_SCREENSHOTS"], "comfyui.png"))
        assert frames, "the page asked for no favicon frame"
        prefix = chub.user_url(name, "comfyui/assets/images/favicon_progress_16x16/")
        assert all(f.url.startswith(prefix) and f.status == 200 for f in frames), [
            (f.url, f.status) for f in frames
        ]
        assert console.seen == [], console.seen
    finally:
        context.close()
        if chub.server(name) is not None:
            chub.stop_server(name)
