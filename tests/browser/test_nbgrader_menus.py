"""nbgrader's menus only for people in a course (issue 22: "nbgrader menus show for every user,
course or not"), in headless Chromium on a real hub.

nbgrader's JupyterLab extension and server extensions are installed for every server; a server
of a user in no course now starts with them off (hub_config/courses/assignments.py puts
``no_nbgrader/`` first on its JUPYTER_CONFIG_PATH). A user in no course sees no Nbgrader menu and
no nbgrader API answers in their server; a course's student sees the menu, as before. Fails on
the code before it: the non-course user's lab had the menu.
"""

from __future__ import annotations

import uuid

import requests
from course_helpers import make_course, roster, token_for
from harness import SLOW, Hub

MENU = ".lm-MenuBar-content > .lm-MenuBar-item"


def menus(browser, hub: Hub, name: str) -> tuple[list[str], list[str]]:
    """The lab's top menu titles for ``name`` (their own token, sent as a header) and the
    errors its console showed."""
    token = token_for(hub, name)
    context = browser.new_context(extra_http_headers={"Authorization": f"token {token}"})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(hub.user_url(name, "lab"), timeout=SLOW)
        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.wait_for(timeout=SLOW)
        page.locator(MENU).first.wait_for(timeout=SLOW)
        return [t.strip() for t in page.locator(MENU).all_inner_texts()], errors
    finally:
        context.close()


def test_nbgrader_menus_only_in_a_course(hub: Hub, browser) -> None:
    tag = uuid.uuid4().hex[:5]
    outsider, student = hub.create_user(f"nc{tag}"), f"ns{tag}"
    course = f"ngm{tag}"
    make_course(hub, course, [f"nt{tag}"])
    assert roster(hub, course, f"{student},student\n", hub.token).status_code == 200
    try:
        for name in (outsider, student):
            hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
        seen, errors = menus(browser, hub, outsider)
        assert "Nbgrader" not in seen, seen
        assert "File" in seen and not errors, (seen, errors)
        # Nor do nbgrader's server extensions answer in that server.
        r = requests.get(
            hub.user_url(outsider, "assignments"),
            headers={"Authorization": f"token {token_for(hub, outsider)}"},
            timeout=30,
        )
        assert r.status_code == 404, r.status_code
        seen, errors = menus(browser, hub, student)
        assert "Nbgrader" in seen, seen
    finally:
        for name in (outsider, student):
            if hub.server(name) is not None:
                hub.stop_server(name)
