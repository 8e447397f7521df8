"""The teacher dashboard in headless Chromium, on a real hub.

An admin creates a course with a teacher and a TA (people who signed up and were approved); the
teacher finds the dashboard from the home page, uploads a roster CSV through it (a bad one: the
error names the line and nothing changes; a good one: the students appear), sees a student's
server (started through the API) running, stops it and restarts it from the page; the TA opens the
student's JupyterLab from the dashboard; a TA of another course is turned away.

The hub is an operator's ``jupyterhub -f`` config calling ``configure(c)`` and setting
``c.CourseDashboard.money_hook`` (as billing will) to an async hook that reads
``DATA_DIR/money-COURSE.json``, or answers None (billing off) while there is no such file.

The dashboard's screenshot is kept in $GPULAB_SCREENSHOTS (else in the test's temp folder).
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from course_helpers import fund_course
from harness import (
    PASSWORD,
    SLOW,
    ConfigFileHub,
    Hub,
    WebSession,
    approved_user,
    browser_log_in,
)

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")

CONFIG = """\
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpulab.hub_config.config import configure

configure(c)


async def course_money(course):
    path = Path(os.environ["GPULAB_DATA_DIR"]) / f"money-{course}.json"
    return json.loads(path.read_text()) if path.exists() else None


c.CourseDashboard.money_hook = course_money
"""


@pytest.fixture(scope="module")
def chub(tmp_path_factory, chp_installed):
    site = tmp_path_factory.mktemp("course-dashboard")
    config = site / "jupyterhub_config.py"
    config.write_text(CONFIG)
    hub = ConfigFileHub(site / "data", config, env={"GPULAB_SIMULATE_GPUS": "RTX-4090:1"})
    hub.extra_env["GPULAB_ADMIN_TOKEN"] = hub.token
    try:
        yield hub.start()
    finally:
        hub.stop()


def money(display: str, micro: int) -> dict:
    return {"micro": micro, "exact": f"{micro / 1e6:.6f}", "display": display}


def make_course(hub: Hub, name: str, teachers: list[str], tas: list[str]) -> None:
    for person in (*teachers, *tas):  # a course's staff are existing users
        hub.create_user(person)
    body = {"name": name, "display_name": f"Deep learning ({name})", "teachers": teachers}
    r = hub.api("POST", "/gpulab/courses", json={**body, "tas": tas})
    assert r.status_code == 201, r.text


def upload_roster(page, text: str) -> None:
    page.set_input_files(
        "#gpulab-roster-file",
        files=[{"name": "roster.csv", "mimeType": "text/csv", "buffer": text.encode()}],
    )
    page.click("#gpulab-roster-upload")


def logged_in(browser, hub: Hub, name: str):
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)
    return context, page


def test_teacher_dashboard(chub: Hub, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    tag = uuid.uuid4().hex[:5]
    teacher, ta, other_ta = (approved_user(chub, p) for p in ("tch", "ta", "ota"))
    ml, cv = f"ml{tag}", f"cv{tag}"
    make_course(chub, ml, [teacher], [ta])
    make_course(chub, cv, [], [other_ta])
    fund_course(chub, ml)  # the teacher's restarts are paid by the course's pool only
    s1, s2 = f"s1{tag}", f"s2{tag}"
    dashboard = f"{chub.url}/hub/gpulab/courses/{ml}"

    contexts = []
    try:
        context, page = logged_in(browser, chub, teacher)
        contexts.append(context)
        # The home page links the courses one staffs; the list links the dashboard.
        page.goto(f"{chub.url}/hub/home")
        page.click("#gpulab-courses-link a")
        page.wait_for_url(f"{chub.url}/hub/gpulab/courses", timeout=SLOW)
        assert page.locator(f'[data-course="{cv}"]').count() == 0
        page.click(f'[data-course="{ml}"]')
        page.wait_for_url(dashboard, timeout=SLOW)
        assert page.locator("#gpulab-credit-off").inner_text() == (
            "credit: not available (billing off)"
        )
        expect(page.locator("#gpulab-no-bookings")).to_have_text("No bookings.")
        assert teacher in page.locator("#gpulab-teachers").inner_text()
        assert ta in page.locator("#gpulab-tas").inner_text()
        rows = page.locator("#gpulab-students tr[data-student]")
        expect(rows).to_have_count(0)

        # A roster with a bad row: the error with its line and field, nothing changed.
        upload_roster(page, f"username,role\n{s1},student\nNot Valid!,student\n")
        error = page.locator("#gpulab-roster-error")
        expect(error).to_be_visible(timeout=SLOW)
        assert "Nothing changed" in error.inner_text()
        assert "roster line 3: username" in error.inner_text()
        assert "Not Valid!" in error.inner_text()
        assert chub.api("GET", f"/users/{s1}").status_code == 404
        expect(rows).to_have_count(0)
        assert page.locator("#gpulab-student-count").inner_text() == "0"

        # A good one: the students appear (roster and server table), the error goes.
        upload_roster(page, f"username,role\n{s1},student\n{s2},student\n")
        expect(page.locator("#gpulab-roster-ok")).to_contain_text("Imported 2 rows", timeout=SLOW)
        expect(error).to_be_hidden()
        expect(rows).to_have_count(2, timeout=SLOW)
        assert page.locator("#gpulab-student-count").inner_text() == "2"
        row = page.locator(f'tr[data-student="{s1}"]')
        state = row.locator(".gpulab-state")
        expect(state).to_have_text("stopped")

        # The student's server, started through the API, shows as running under the course.
        chub.spawn_ready(s1, {"gpu": "none"})
        expect(state).to_have_text("running", timeout=SLOW)
        expect(row.locator(".gpulab-server-course")).to_have_text(ml)
        expect(row.locator(".gpulab-open")).to_be_visible()

        # Billing answers (the hook's file): the pool, the period, each student's credit.
        record = {
            "pool_balance": money("EUR 412.50", 412_500_000),
            "cap": money("EUR 20.00", 20_000_000),
            "period": "week",
            "period_start": "2026-11-30",
            "period_end": "2026-12-07",
            "overflow": "refuse",
            "students": [
                {
                    "user": s1,
                    "used": money("EUR 3.10", 3_100_000),
                    "left": money("EUR 16.90", 16_900_000),
                },
                {"user": s2, "used": money("EUR 0.00", 0), "left": money("EUR 20.00", 20_000_000)},
            ],
        }
        (chub.data_dir / f"money-{ml}.json").write_text(json.dumps(record))
        page.reload()
        expect(page.locator("#gpulab-pool-balance")).to_have_text("EUR 412.50")
        assert page.locator("#gpulab-credit-off").count() == 0
        assert "week" in page.locator("#gpulab-period").inner_text()
        expect(row.locator(".gpulab-used")).to_have_text("EUR 3.10")
        expect(row.locator(".gpulab-left")).to_have_text("EUR 16.90")
        expect(state).to_have_text("running", timeout=SLOW)

        # Stop, then Restart, from the page.
        row.locator(".gpulab-stop").click()
        expect(state).to_have_text("stopped", timeout=SLOW)
        assert chub.server(s1) is None
        row.locator(".gpulab-restart").click()
        expect(state).to_have_text("running", timeout=SLOW)
        expect(row.locator(".gpulab-row-message")).to_have_text("", timeout=SLOW)
        server = chub.server(s1)
        assert server["ready"] and server["user_options"]["course"] == ml
        assert server["user_options"]["gpu"] == "none"

        # Restart of a running server: stopped, then started again in the same mode.
        chub.spawn_ready(s2, {"gpu": "rtx-4090"})
        row2 = page.locator(f'tr[data-student="{s2}"]')
        expect(row2.locator(".gpulab-gpu")).to_have_text("rtx-4090 \u00d7 1", timeout=SLOW)
        first_start = chub.server(s2)["started"]
        row2.locator(".gpulab-restart").click()
        expect(row2.locator(".gpulab-row-message")).to_have_text("", timeout=SLOW)
        expect(row2.locator(".gpulab-state")).to_have_text("running")
        again = chub.server(s2)
        assert again["started"] != first_start
        assert again["user_options"]["gpu"] == "rtx-4090"
        assert again["user_options"]["course"] == ml
        chub.stop_server(s2)

        # The course's lab-session bookings (the bookings API is its own module): listed.
        r = chub.api("POST", f"/users/{teacher}/tokens", json={"expires_in": 600})
        teacher_token = r.json()["token"]
        start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
        booking = {"gpu_type": "rtx-4090", "cards": 1, "start": start.isoformat(), "minutes": 60}
        r = chub.api("POST", f"/gpulab/courses/{ml}/bookings", token=teacher_token, json=booking)
        page.reload()
        if r.status_code == 404:  # a hub without the bookings API
            expect(page.locator("#gpulab-no-bookings")).to_have_text("No bookings.")
        else:
            assert r.status_code == 201, r.text
            booked = page.locator("#gpulab-bookings tbody tr")
            expect(booked).to_have_count(1, timeout=SLOW)
            expect(booked.locator(".gpulab-booking-gpu")).to_have_text("rtx-4090")
            expect(booked.locator(".gpulab-booking-state")).to_have_text("scheduled")
            expect(page.locator("#gpulab-no-bookings")).to_be_hidden()
        expect(state).to_have_text("running", timeout=SLOW)
        expect(row.locator(".gpulab-used")).to_have_text("EUR 3.10")
        shots = Path(SHOTS) if SHOTS else tmp_path
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "course-dashboard.png"), full_page=True)
        print(f"dashboard screenshot: {shots / 'course-dashboard.png'}")

        # The TA reads the dashboard (no roster upload) and opens the student's JupyterLab.
        ta_context, ta_page = logged_in(browser, chub, ta)
        contexts.append(ta_context)
        ta_page.goto(dashboard)
        assert ta_page.locator("#gpulab-roster-form").count() == 0
        ta_row = ta_page.locator(f'tr[data-student="{s1}"]')
        expect(ta_row.locator(".gpulab-state")).to_have_text("running", timeout=SLOW)
        with ta_context.expect_page() as opened:
            ta_row.locator(".gpulab-open").click()
        lab = opened.value
        lab.wait_for_load_state()
        # JupyterHub asks a person before handing their identity to someone else's server.
        if "/hub/api/oauth2/authorize" in lab.url:
            lab.click("button:has-text('Authorize')")
        lab.wait_for_url(chub.user_url(s1, "lab**"), timeout=SLOW)
        lab.locator(".jp-LabShell, #jp-main-dock-panel").first.wait_for(timeout=SLOW)

        # Someone who staffs no course: no link home, no course listed, no dashboard.
        nobody = approved_user(chub, "nob")
        web = WebSession(chub)
        assert web.login(nobody, PASSWORD)
        home = web.get("/hub/home")
        assert home.ok and "gpulab-courses-link" not in home.text
        listed = web.get("/hub/gpulab/courses")
        assert listed.ok and "You teach or assist no course." in listed.text
        assert web.get(f"/hub/gpulab/courses/{ml}").status_code in (403, 404)

        # A TA of another course: not this dashboard.
        other_context, other_page = logged_in(browser, chub, other_ta)
        contexts.append(other_context)
        response = other_page.goto(dashboard)
        assert response.status in (403, 404)
        assert other_page.locator("#gpulab-students").count() == 0
    finally:
        for c in contexts:
            c.close()
        for name in (s1, s2):
            if chub.api("GET", f"/users/{name}").ok and chub.server(name) is not None:
                chub.stop_server(name)
