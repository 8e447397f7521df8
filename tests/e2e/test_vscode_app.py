"""VS Code in the browser (issue 25: "VS Code in the browser as an app in the catalog ... opening
the home, its terminal in the server's environment"): the catalog's `vscode` app is code-server
(built by `make install` from its npm package), launched through the hub's app API on a real root
hub, opened in Chromium through the user's origin.

Attack encoded: VS Code is a terminal as its user, so nobody but its owner may reach it: it opens
no TCP port on the node (where every account could drive it without the hub's login), and the
proxy path wants the owner's log-in."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import requests
from apps_helpers import Console
from conftest import require
from harness import (
    PASSWORD,
    VENV_BIN,
    Hub,
    WebSession,
    approved_user,
    browser_log_in,
    pids_whose_argv,
    wait_for,
    write_in_home,
)
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from gpulab.spawners.node import sockets

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="local servers as users need root")


@pytest.fixture(autouse=True)
def code_server_installed() -> None:
    """`make install` builds it; under CI (GPULAB_REQUIRE_ALL=1) a missing one fails."""
    require(
        shutil.which("code-server", path=str(VENV_BIN)) is not None,
        "code-server (make install: images/code-server/install.sh)",
    )


SHOTS = Path(os.environ.get("GPULAB_SCREENSHOTS") or "/tmp/gpulab-shots")


def code_server_pids(hub: Hub, user: str) -> list[int]:
    """The code-server processes (its main node process) serving ``user``'s home."""
    home = str(hub.data_dir / "users" / user)
    return pids_whose_argv(lambda argv: any("code-server" in a for a in argv) and home in argv)


def open_terminal(page, attempts: int = 3) -> None:
    """Open a terminal in VS Code's workbench: its menu first, then the command palette (on a
    loaded machine a menu click can land before the menu is ready, and nothing opens)."""
    for attempt in range(attempts):
        if attempt == 0:
            page.locator(".menubar-menu-button").first.click()
            page.get_by_role("menuitem", name="Terminal").click()
            page.get_by_role("menuitem", name="New Terminal").first.click()
        else:
            page.keyboard.press("Escape")
            page.keyboard.press("F1")
            page.keyboard.type("Terminal: Create New Terminal")
            page.keyboard.press("Enter")
        try:
            page.wait_for_selector(".xterm", timeout=60_000)
            return
        except PlaywrightTimeout:
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / f"vscode-no-terminal-{attempt}.png"))
    raise AssertionError(f"no terminal opened in VS Code after {attempts} attempts")


def launch(hub: Hub, user: str, token: str) -> dict:
    r = hub.api("POST", f"/gpulab/users/{user}/apps/vscode/launch", token, json={"gpu": "none"})
    assert r.status_code == 202, r.text
    return r.json()


def own_token(hub: Hub, user: str) -> str:
    r = hub.api("POST", f"/users/{user}/tokens", json={"note": "vscode test"})
    assert r.status_code in (200, 201), r.text
    return r.json()["token"]


@pytest.fixture
def person(hub: Hub):
    name = approved_user(hub, "code")
    assert WebSession(hub).login(name, PASSWORD)
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


def test_vs_code_opens_the_home_and_its_terminal_runs_in_the_server(
    hub: Hub, person: str, browser
) -> None:
    """Issue 25 (VS Code in the browser): the owner launches VS Code from the catalog, Chromium
    shows the workbench with their home's files, and a terminal opened in it runs as their
    account with the server's environment (GPULAB_*, JUPYTERHUB_USER)."""
    token = own_token(hub, person)
    info = launch(hub, person, token)
    assert info["url"] == hub.user_url(person, "vscode/")
    hub.wait_ready(person, 120)
    with hub.kernel(person) as k:
        home = Path(k.execute("import os; print(os.getcwd())").strip())
    write_in_home(home, "hello-from-home.txt", "hi\n")

    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    console = Console(page)
    try:
        browser_log_in(page, hub, person, PASSWORD)
        page.goto(info["url"])
        page.wait_for_selector(".monaco-workbench", timeout=120_000)
        page.get_by_text("hello-from-home.txt").first.wait_for(timeout=60_000)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "vscode-workbench.png"))

        # A terminal, from the command palette, writes what it sees into the home.
        page.get_by_text("hello-from-home.txt").first.click()
        open_terminal(page)
        page.locator(".xterm").first.click()
        page.keyboard.type(
            'echo "$(id -un) $JUPYTERHUB_USER ${GPULAB_ALLOCATION_ID:+alloc}" > from-terminal.txt\n'
        )
        out = home / "from-terminal.txt"
        wait_for(out.exists, 60, what="the terminal to write into the home")
        wait_for(lambda: out.read_text().strip(), 10, what="the terminal's line")
        page.screenshot(path=str(SHOTS / "vscode-terminal.png"))
    finally:
        context.close()
    account, user, alloc = out.read_text().split()
    assert account.startswith("jupyter-") and user == person and alloc == "alloc"
    assert out.stat().st_uid == home.stat().st_uid
    # vsda (Microsoft's signing module) is not in open-source builds: every code-server asks
    # for it once and carries on without it.
    errors = [e for e in console.seen if "/vsda" not in e and "vsda.js" not in e]
    assert not errors, errors


def test_vs_code_listens_on_no_port_and_wants_the_owners_login(hub: Hub, person: str) -> None:
    """Issue 25 attack: code-server with `--auth none` would give any account on the node a
    shell as the user if it listened on TCP. It listens only on jupyter-server-proxy's Unix
    socket, and its URL answers nobody but the owner (an anonymous visitor and another user's
    token get no workbench)."""
    token = own_token(hub, person)
    info = launch(hub, person, token)
    hub.wait_ready(person, 120)
    wait_for(
        lambda: (
            requests.get(
                info["ready_url"], headers={"Authorization": f"token {token}"}, timeout=60
            ).status_code
            == 200
        ),
        120,
        what="code-server to answer",
    )
    pids = code_server_pids(hub, person)
    assert pids, "no code-server process found"
    held = sockets.socket_inodes(pids)
    assert not [item for item in sockets.listeners() if item.inode in held]

    anon = requests.get(info["url"], timeout=30, allow_redirects=False)
    assert anon.status_code in (302, 303) and "monaco" not in anon.text
    other = hub.create_user()
    theirs = own_token(hub, other)
    r = requests.get(
        info["url"], headers={"Authorization": f"token {theirs}"}, timeout=30, allow_redirects=False
    )
    assert r.status_code in (403, 404) and "monaco" not in r.text
