"""Issue 22, the statement as a person reads it in the browser (billing's page, a hub's page).

Points of the issue this test covers (each fails on the code before the fix):

- "about 50 ledger rows of 'charge -0.00 session N' for one afternoon": the page lists one row
  per session (when, in human dates such as "2 Dec 13:35-14:02 (27 min)", with an en dash, what it ran on, its
  total, details on request), however many small charges billing posted for it; credits
  (a top-up) are rows of their own.
- "timestamps like 2026-12-02T13:35:52.769873Z": none in what the page shows.
- "a 'Server: default' column": no server jargon; a named server is named.
- "its navbar lacks the hub's Admin and Services entries": the page's navigation bar has the
  same entries as the hub's home page, for the admin (Admin, Services) and for a user.
- no console errors on the page.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from billing.client import Billing, user_token
from billing.scenario import app, heartbeat, kernel, server_start, server_stop
from harness import PASSWORD, REPO, SLOW, Hub, approved_user, browser_log_in, wait_for

SHOTS = REPO / "artifacts" / "screenshots"
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")
DASH = "\u2013"
HUMAN_SPAN = re.compile(
    rf"^\d{{1,2}} [A-Z][a-z]{{2}} \d\d:\d\d({DASH}\d\d:\d\d| {DASH} \d{{1,2}} [A-Z][a-z]{{2}} \d\d:\d\d)"
    r" \(\d+ (s|min)\)$"
)


@pytest.fixture(scope="module")
def sthub(module_hub_factory) -> Hub:
    h = module_hub_factory("statement-browser")
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    return h


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), animations="disabled", full_page=True)


def watch_errors(page) -> list[str]:
    seen: list[str] = []
    page.on("console", lambda m: m.type == "error" and seen.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: seen.append(f"pageerror: {e}"))
    page.on("response", lambda r: r.status >= 400 and seen.append(f"{r.status} {r.url}"))
    return seen


def afternoon(billing: Billing, user: str) -> float:
    """Two sessions an hour apart, reported as a reporter does (one post per heartbeat, so
    billing posts a small charge each time): a kernel on an A100 for 27 min on the default
    server, then 10 min without a GPU on the named server "big". Returns the first start."""
    t0 = time.time() - 3 * 3600
    posts: list[list[dict]] = [
        [server_start(user, t0), kernel("kernel_start", user, "k1", t0 + 5)],
        *([heartbeat(user, t0 + 5 + m * 60, ["k1"])] for m in range(1, 27)),
        [kernel("kernel_stop", user, "k1", t0 + 5 + 27 * 60), server_stop(user, t0 + 28 * 60)],
        [
            server_start(user, t0 + 3600, "none", 0, server="big"),
            kernel("kernel_start", user, "k2", t0 + 3600, server="big"),
            kernel("kernel_stop", user, "k2", t0 + 4200, server="big"),
            server_stop(user, t0 + 4200, server="big"),
        ],
    ]
    for events in posts:
        r = billing.post("api/v1/events", {"events": events})
        assert r.status_code == 200 and r.json()["accepted"] == len(events), r.text
    return t0


def nav_entries(page) -> list[str]:
    """The hub navigation bar's entries: where each leads, or a menu's name ("Services")."""
    links = page.locator("#thenavbar .navbar-nav.me-auto > li > a.nav-link")
    return [
        href if href and href != "#" else text.strip()
        for href, text in zip(
            [a.get_attribute("href") for a in links.all()], links.all_inner_texts(), strict=True
        )
    ]


def test_statement_groups_charges_per_session_with_human_dates_and_the_hubs_navbar(
    sthub: Hub, browser
) -> None:
    billing = Billing(sthub)
    user = approved_user(sthub, "stmt", PASSWORD)
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    errors = watch_errors(page)
    try:
        browser_log_in(page, sthub, user, PASSWORD, timeout=SLOW)
        afternoon(billing, user)
        billing.credit(user, "5.00", kind="topup")
        since = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
        period = {"from": since}
        # Billing posted many small charges: what the old page listed row by row.
        token = user_token(sthub, user)
        ledger = billing.get(f"api/v1/users/{user}/credits", token).json()
        charges = [e for e in ledger["entries"] if e["kind"] == "charge"]
        assert len(charges) >= 10, ledger
        api = billing.get(f"api/v1/users/{user}/usage", token, params=period).json()

        page.goto(f"{sthub.url}/services/billing/?from={since}", timeout=SLOW)
        table = page.locator("#servers")
        sessions = table.locator("tr.session")
        assert sessions.count() == 2
        # Newest first: the no-GPU session on "big", then the A100 one (the default server,
        # not named).
        big, a100 = sessions.nth(0), sessions.nth(1)
        for row in (big, a100):
            assert HUMAN_SPAN.match(row.locator("td.when").inner_text()), row.inner_text()
        assert a100.locator("td.when").inner_text().endswith("(28 min)")
        assert big.locator("td.when").inner_text().endswith("(10 min)")
        assert "A100-80G x1" in a100.inner_text() and "server" not in a100.inner_text()
        assert "No GPU" in big.inner_text() and "on server big" in big.inner_text()
        by_id = {s["session"]: s for s in api["servers"]}
        for row in (big, a100):
            s = by_id[int(row.get_attribute("data-session"))]
            assert (
                row.locator("td.amount").get_attribute("title") == f"exact: {s['amount']['exact']}"
            )
            assert s["amount"]["display"] in row.locator("td.amount").inner_text()
        # Credits, rows of their own: the trial credit of sign-up and the top-up.
        credits = table.locator("tr.credit")
        assert [credits.nth(i).get_attribute("data-kind") for i in range(credits.count())] == [
            "topup",
            "trial",
        ]
        assert "Top-up" in credits.nth(0).inner_text() and "+5.00" in credits.nth(0).inner_text()
        assert "Trial credit" in credits.nth(1).inner_text()
        # What the page shows: no ISO timestamps, no "default" server, no ledger of charges.
        shown = page.locator("#statement").inner_text()
        assert not ISO.search(shown), ISO.search(shown)
        assert "default" not in shown.lower()
        assert not re.search(r"\bcharge\b|\bsession \d+", shown, re.IGNORECASE), shown
        # The details of a session, on request.
        a100.locator("details summary").click()
        kernel_row = a100.locator("tr.kernel")
        kernel_row.wait_for(timeout=SLOW)
        assert HUMAN_SPAN.search(kernel_row.inner_text().split("python3 ")[1].split("\t")[0])
        assert not ISO.search(a100.inner_text())
        shot(page, "statement-user")

        # The user's navigation bar: the hub's own (no Admin for a user; Services).
        page.locator("#thenavbar a.dropdown-toggle", has_text="Services").click()
        page.locator("#thenavbar .dropdown-menu a", has_text="billing").wait_for(timeout=SLOW)
        ours = nav_entries(page)
        page.goto(f"{sthub.url}/hub/home", timeout=SLOW)
        assert ours == nav_entries(page) and "/hub/admin" not in ours and "Services" in ours
        assert errors == [], "\n".join(errors)
    except Exception:
        shot(page, "statement-failure")
        raise
    finally:
        context.close()

    # The admin's: Admin and Services, as on the hub's home page.
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    errors = watch_errors(page)
    try:
        password = (sthub.data_dir / "admin-password").read_text().strip()
        browser_log_in(page, sthub, "admin", password, timeout=SLOW)
        page.goto(f"{sthub.url}/hub/home", timeout=SLOW)
        hubs = nav_entries(page)
        page.goto(f"{sthub.url}/services/billing/?user={user}&from={since}", timeout=SLOW)
        page.locator("#servers tr.session").first.wait_for(timeout=SLOW)
        assert nav_entries(page) == hubs and "/hub/admin" in hubs and "Services" in hubs
        assert page.locator("#thenavbar a.nav-link", has_text="Admin").get_attribute("href") == (
            "/hub/admin"
        )
        shot(page, "statement-admin")
        assert errors == [], "\n".join(errors)
    except Exception:
        shot(page, "statement-admin-failure")
        raise
    finally:
        context.close()


def test_names_from_a_users_server_are_text_on_the_admins_page(sthub: Hub, browser) -> None:
    """A user's server reports its kernels' and apps' names and ids (the user controls all of
    it); the admin reads them on that user's statement. The new details (names, and ids in
    ``title`` attributes) must stay text: a guard, the old page escaped them as well."""
    billing = Billing(sthub)
    user = approved_user(sthub, "stmtx", PASSWORD)
    evil = '<img src=x onerror="window.pwned=1">\'"'
    t0 = time.time() - 3600
    run = 'x" onmouseover="window.pwned=2'
    events = [
        server_start(user, t0),
        kernel("kernel_start", user, "k-" + evil, t0 + 1),
        app("app_start", user, run, t0 + 2, name=evil),
        heartbeat(user, t0 + 60, ["k-" + evil], apps=[run]),
        kernel("kernel_stop", user, "k-" + evil, t0 + 120),
        app("app_stop", user, run, t0 + 120, name=evil),
        server_stop(user, t0 + 180),
    ]
    r = billing.post("api/v1/events", {"events": events})
    assert r.status_code == 200, r.text
    since = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    context = browser.new_context()
    page = context.new_page()
    try:
        password = (sthub.data_dir / "admin-password").read_text().strip()
        browser_log_in(page, sthub, "admin", password, timeout=SLOW)
        page.goto(f"{sthub.url}/services/billing/?user={user}&from={since}", timeout=SLOW)
        row = page.locator("#servers tr.session").first
        row.locator("details summary").click()
        app_row = row.locator("tr.app")
        app_row.hover()
        assert f"App: {evil}" in app_row.inner_text()
        assert app_row.locator("small").get_attribute("title") == run
        assert page.evaluate("window.pwned") is None
        assert page.locator("img[src=x]").count() == 0
    finally:
        context.close()
