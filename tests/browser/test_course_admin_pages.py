"""Courses without curl, in headless Chromium on a real hub (issue 22, "courses without curl").

An admin creates two courses from the course list's form: a typo in the teacher's name is a
clear error on the form and makes no account; both courses are then listed for the admin (the
page said "You teach or assist no course" before). The teacher imports a roster through the
dashboard and its report says per row what happened (a new account; an invitation sent to an
existing user). The teacher books lab sessions from the dashboard's form: one for tomorrow
leaves "Free cards" alone; one about to begin takes its card off and the home page says for
whom and when; Cancel asks first, and a dismissed confirmation cancels nothing. The invited
user sees the invitation on their home page and accepts it there.

Points of the issue covered, each failing on the code before it: the create form (none),
the unknown teacher (an account was made), the admin's course list (empty), the roster report
(only "new: ..."), the booking form and Cancel (none), the held cards explained (nothing said),
the invitation on the home page (nowhere). Every page's console is checked for errors, and
each page's screenshot is saved in $GPULAB_SCREENSHOTS (else the test's temp folder).
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from harness import PASSWORD, SLOW, Hub, approved_user, browser_log_in

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")


@pytest.fixture(scope="module")
def ahub(module_hub_factory) -> Hub:
    # A booking holds its cards from 2 h before its servers start: a session an hour ahead is
    # "about to begin" (held now) while its students' servers are not started during the test.
    return module_hub_factory(
        "course-admin",
        simulate="RTX-4090:2",
        extra_args=["--BookingKeeper.hold_margin_seconds=7200"],
    )


class Pages:
    """Browser contexts in UTC, every console error and page error kept, screenshots saved."""

    def __init__(self, browser, hub: Hub, shots: Path) -> None:
        self.browser, self.hub, self.shots = browser, hub, shots
        self.contexts: list = []
        self.errors: list[str] = []

    def open(self, name: str, password: str):
        context = self.browser.new_context(
            viewport={"width": 1280, "height": 900}, timezone_id="UTC"
        )
        self.contexts.append(context)
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and self.errors.append(f"{name}: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(f"{name}: {e}"))
        browser_log_in(page, self.hub, name, password, timeout=SLOW)
        return page

    def expect_refused(self, name: str, status: int) -> None:
        """The one console line a refusal the test asked for leaves (the browser logs every
        4xx fetch), and no other error so far; forgotten afterwards."""
        wanted = f"{name}: Failed to load resource: the server responded with a status of {status}"
        assert [e.startswith(wanted) for e in self.errors] == [True], self.errors
        self.errors.clear()

    def shot(self, page, name: str) -> None:
        page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    def close(self) -> None:
        for c in self.contexts:
            c.close()


def local(t: datetime) -> str:
    """A time as a datetime-local input takes it (the contexts are in UTC)."""
    return t.strftime("%Y-%m-%dT%H:%M")


def test_courses_without_curl(ahub: Hub, browser, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    hub = ahub
    tag = uuid.uuid4().hex[:4]
    prof = approved_user(hub, "prof")
    known = approved_user(hub, "known")  # an existing user the roster will name
    bystander = approved_user(hub, "by")  # in no course: sees the free cards
    shots = Path(SHOTS) if SHOTS else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    pages = Pages(browser, hub, shots)
    admin_password = (hub.data_dir / "admin-password").read_text().strip()
    cs, nlp = f"cs{tag}", f"nlp{tag}"
    try:
        admin = pages.open("admin", admin_password)
        admin.goto(f"{hub.url}/hub/home")
        admin.click("#gpulab-admin-courses-link a, #gpulab-courses-link a")
        admin.wait_for_url(f"{hub.url}/hub/gpulab/courses", timeout=SLOW)
        expect(admin.locator("#gpulab-new-course-form")).to_be_visible()
        pages.shot(admin, "01-admin-course-list-empty")

        # A typo in the teacher's name: a clear error on the form, no account, no course.
        admin.fill("#gpulab-course-name", cs)
        admin.fill("#gpulab-course-title", f"CS 101 ({tag})")
        admin.fill("#gpulab-course-teacher", prof + "x")
        admin.click("#gpulab-create-course")
        error = admin.locator("#gpulab-new-course-error")
        expect(error).to_contain_text(f"Teacher: '{prof}x' is not a user of this hub", timeout=SLOW)
        expect(error).to_contain_text("Nothing was created.")
        expect(admin.locator("#gpulab-course-teacher")).to_have_class(
            "form-control form-control-sm is-invalid"
        )
        pages.shot(admin, "02-admin-create-unknown-teacher")
        assert hub.api("GET", f"/users/{prof}x").status_code == 404
        assert hub.api("GET", f"/groups/{cs}").status_code == 404
        pages.expect_refused("admin", 400)

        admin.fill("#gpulab-course-teacher", prof)
        admin.click("#gpulab-create-course")
        admin.wait_for_url(f"{hub.url}/hub/gpulab/courses/{cs}", timeout=SLOW)
        expect(admin.locator("h1")).to_contain_text(f"CS 101 ({tag}) {cs} · you are an admin")
        expect(admin.locator("#gpulab-booking-form")).to_be_visible()
        pages.shot(admin, "03a-admin-new-course-dashboard")
        assert hub.api("GET", f"/gpulab/courses/{cs}").json()["teachers"] == [prof]

        admin.goto(f"{hub.url}/hub/gpulab/courses")
        admin.fill("#gpulab-course-name", nlp)
        admin.fill("#gpulab-course-teacher", prof)
        admin.click("#gpulab-create-course")
        admin.wait_for_url(f"{hub.url}/hub/gpulab/courses/{nlp}", timeout=SLOW)
        admin.goto(f"{hub.url}/hub/gpulab/courses")
        for name in (cs, nlp):
            expect(admin.locator(f'[data-course="{name}"]')).to_contain_text("admin")
        expect(admin.locator("#gpulab-no-courses")).to_have_count(0)
        pages.shot(admin, "03-admin-course-list")

        # The teacher's roster: each row's result, in words.
        teacher = pages.open(prof, PASSWORD)
        dashboard = f"{hub.url}/hub/gpulab/courses/{cs}"
        teacher.goto(dashboard)
        fresh = f"stu{tag}"
        teacher.set_input_files(
            "#gpulab-roster-file",
            files=[
                {
                    "name": "roster.csv",
                    "mimeType": "text/csv",
                    "buffer": f"username,role\n{fresh},student\n{known},student\n".encode(),
                }
            ],
        )
        teacher.click("#gpulab-roster-upload")
        report = teacher.locator("#gpulab-roster-report")
        expect(report.locator(f'tr[data-username="{fresh}"]')).to_contain_text(
            "new account", timeout=SLOW
        )
        expect(report.locator(f'tr[data-username="{known}"]')).to_contain_text(
            "invitation sent (existing user; they accept on their home page)"
        )
        expect(teacher.locator("#gpulab-roster-ok")).to_contain_text("1 existing user was invited")

        # Bookings from the form: tomorrow holds nothing now; an hour ahead is held now.
        free_before = hub.free("rtx-4090")
        now = datetime.now(UTC).replace(second=0, microsecond=0)
        tomorrow, soon = now + timedelta(days=1), now + timedelta(hours=1)
        rows = teacher.locator("#gpulab-bookings tbody tr")
        for when, minutes, count in ((tomorrow, "60", 1), (soon, "30", 2)):
            teacher.select_option("#gpulab-booking-gpu", "rtx-4090")
            teacher.fill("#gpulab-booking-cards", "1")
            teacher.fill("#gpulab-booking-start", local(when))
            teacher.fill("#gpulab-booking-minutes", minutes)
            teacher.click("#gpulab-booking-submit")
            expect(teacher.locator("#gpulab-booking-ok")).to_contain_text("Booked 1", timeout=SLOW)
            expect(rows).to_have_count(count, timeout=SLOW)
            if when is tomorrow:
                assert hub.free("rtx-4090") == free_before
        assert hub.free("rtx-4090") == free_before - 1
        # A bad booking: the error names the form's field, nothing booked.
        teacher.fill("#gpulab-booking-cards", "5")
        teacher.fill("#gpulab-booking-start", local(now + timedelta(days=3)))
        teacher.click("#gpulab-booking-submit")
        expect(teacher.locator("#gpulab-booking-error")).to_contain_text("Cards:", timeout=SLOW)
        expect(teacher.locator("#gpulab-booking-error")).to_contain_text("Nothing was booked.")
        pages.expect_refused(prof, 409)
        expect(rows).to_have_count(2)
        pages.shot(teacher, "04-teacher-dashboard-roster-and-bookings")

        # Someone in no course: the held card is explained under "Free cards".
        other = pages.open(bystander, PASSWORD)
        other.goto(f"{hub.url}/hub/home")
        note = other.locator("#gpulab-held-now li")
        span = f"{soon:%H:%M}\u2013{soon + timedelta(minutes=30):%H:%M}"
        expect(note).to_have_text(
            f"1 rtx-4090 card held for CS 101 ({tag})'s lab {span}: not counted as free.",
            timeout=SLOW,
        )
        pages.shot(other, "05-home-held-cards")

        # Cancel asks first: dismissed, nothing happens; accepted, the booking is gone.
        soon_row = rows.nth(0)
        dialogs: list[str] = []
        teacher.once("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        soon_row.locator(".gpulab-booking-cancel").click()
        expect(rows).to_have_count(2)
        assert dialogs and "Cancel the lab session" in dialogs[0], dialogs
        teacher.once("dialog", lambda d: d.accept())
        soon_row.locator(".gpulab-booking-cancel").click()
        expect(rows).to_have_count(1, timeout=SLOW)
        assert hub.free("rtx-4090") == free_before
        other.reload()
        other.locator("#gpulab-pool tbody tr").first.wait_for(timeout=SLOW)
        expect(note).to_have_count(0)

        # The invited user: the invitation on their home page, accepted there.
        invited = pages.open(known, PASSWORD)
        invited.goto(f"{hub.url}/hub/home")
        item = invited.locator(f'#gpulab-invitation-list [data-course="{cs}"]')
        expect(item).to_contain_text(f"CS 101 ({tag})", timeout=SLOW)
        pages.shot(invited, "06-home-invitation")
        item.locator(".gpulab-invitation-accept").click()
        expect(invited.locator("#gpulab-invitations")).to_be_hidden(timeout=SLOW)
        course = hub.api("GET", f"/gpulab/courses/{cs}").json()
        assert known in course["students"] and course["invited"] == []
        pages.shot(invited, "07-home-after-accept")

        assert pages.errors == [], pages.errors
    finally:
        pages.close()
        for course in (cs, nlp):
            r = hub.api("GET", f"/gpulab/courses/{course}/bookings")
            for b in r.json().get("bookings", []) if r.ok else []:
                hub.api("DELETE", f"/gpulab/courses/{course}/bookings/{b['id']}")
