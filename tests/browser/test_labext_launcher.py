"""The launcher appears as soon as JupyterLab's layout is restored, once, and only when wanted.

gpulab's early-launcher plugin opens the launcher without waiting for JupyterLab's first
workspace save; these tests check in real headless Chromium that a person still gets exactly one
launcher on a plain /lab page, and none when the URL opens a notebook.
"""

from __future__ import annotations

import pytest
from harness import PASSWORD, SLOW, Hub, WebSession, approved_user, browser_log_in

NOTEBOOK_CARD = '.jp-LauncherCard[data-category="Notebook"]'


@pytest.fixture
def lab_user(hub: Hub):
    name = approved_user(hub, "lab", PASSWORD)
    assert WebSession(hub).login(name, PASSWORD)  # creates the hub user
    hub.spawn_ready(name, {"gpu": "none"})
    yield name
    if hub.server(name) is not None:
        hub.stop_server(name)


def launcher_tabs(page) -> int:
    return page.locator(".lm-TabBar-tab", has_text="Launcher").count()


def test_plain_lab_page_gets_one_launcher_after_the_workspace_settles(
    hub: Hub, lab_user: str, browser
) -> None:
    page = browser.new_context().new_page()
    browser_log_in(page, hub, lab_user, PASSWORD, timeout=SLOW)
    # JupyterLab's own launcher path runs after its first workspace save (a PUT) and a file
    # browser refresh (a contents GET); wait for both so a second launcher had its chance.
    seen: list[str] = []
    page.on("response", lambda r: seen.append(f"{r.request.method} {r.url}"))
    page.goto(hub.user_url(lab_user, "lab"))
    page.wait_for_selector(NOTEBOOK_CARD, timeout=SLOW)

    def settled() -> bool:
        puts = [i for i, s in enumerate(seen) if s.startswith("PUT") and "/workspaces/" in s]
        return bool(puts) and any(
            s.startswith("GET") and "/api/contents" in s for s in seen[puts[0] :]
        )

    for _ in range(SLOW // 100):
        if settled():
            break
        page.wait_for_timeout(100)
    assert settled(), seen
    page.wait_for_timeout(1000)
    assert launcher_tabs(page) == 1
    # The launcher works: a click opens a notebook in the user's home.
    page.click(NOTEBOOK_CARD)
    page.wait_for_selector(".jp-NotebookPanel", timeout=SLOW)
    page.context.close()


def test_a_notebook_url_opens_the_notebook_without_a_launcher(
    hub: Hub, lab_user: str, browser
) -> None:
    web = WebSession(hub)
    assert web.login(lab_user, PASSWORD)
    token = hub.api(
        "POST",
        f"/users/{lab_user}/tokens",
        json={"scopes": [f"access:servers!user={lab_user}"], "expires_in": 600},
    ).json()["token"]
    notebook = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    r = web.http.put(
        hub.user_url(lab_user, "api/contents/opened.ipynb"),
        json={"type": "notebook", "content": notebook},
        headers={"Authorization": f"token {token}"},
    )
    assert r.status_code in (200, 201), r.text

    page = browser.new_context().new_page()
    browser_log_in(page, hub, lab_user, PASSWORD, timeout=SLOW)
    page.goto(hub.user_url(lab_user, "lab/tree/opened.ipynb"))
    page.wait_for_selector(".jp-NotebookPanel", timeout=SLOW)
    page.wait_for_timeout(1000)
    assert launcher_tabs(page) == 0
    assert page.locator(".lm-TabBar-tab", has_text="opened.ipynb").count() == 1
    page.context.close()
