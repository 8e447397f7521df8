"""The teacher dashboard's page, without a hub: billing's record as the page shows it (or
"credit: not available" when billing is off or fails), the servers' states, and the template
rendered through an overlay of a stand-in for the hub's environment (everything escaped).

The page on a real hub, in Chromium, is tests/browser/test_course_dashboard.py (this module has
another name: pytest imports test modules by their base name, which must not repeat).
"""

from __future__ import annotations

import asyncio
import time
from html.parser import HTMLParser

from jinja2 import DictLoader, Environment

from gpulab.hub_config.courses import dashboard
from gpulab.hub_config.courses.dashboard import (
    BILLING_FAILED,
    BILLING_OFF,
    DASHBOARD_TEMPLATE,
    LIST_TEMPLATE,
    NO_VALUE,
    CourseDashboard,
    credit_view,
    page_context,
    server_view,
)
from gpulab.spawners.courses import Course

# JupyterHub's page.html, reduced to the blocks the dashboard fills.
PAGE = (
    "<html><head><title>{% block title %}{% endblock %}</title>"
    "{% block stylesheet %}{% endblock %}</head><body>"
    "{% block main %}{% endblock %}{% block script %}{% endblock %}</body></html>"
)


def money(display: str, micro: int = 0) -> dict:
    return {"micro": micro, "exact": str(micro / 1e6), "display": display}


# The shape of billing's GET /api/v1/courses/C (checked against billing itself below).
RECORD = {
    "pool_balance": money("EUR 412.50", 412_500_000),
    "cap": money("EUR 20.00", 20_000_000),
    "period": "week",
    "period_start": "2026-11-30",
    "period_end": "2026-12-07",
    "overflow": "refuse",
    "students": [
        {"user": "ana", "used": money("EUR 3.10"), "left": money("EUR 16.90")},
        {"user": "bo", "used": money("EUR 0.00"), "left": money("EUR 20.00")},
    ],
}

COURSE = Course(
    name="ml101",
    display_name="<b>Machine</b> learning & co",
    teachers=("tina",),
    tas=("tom",),
)
SERVERS = {
    "ana": {
        "state": "ready",
        "url": "/user/ana/",
        "mode": "RTX-4090 x1 (simulated)",
        "gpu_type": "rtx-4090",
        "cards": 1,
        "course": "ml101",
    },
    "bo": {"state": "stopped"},
    "cy": {"state": "spawn", "url": None, "mode": "", "gpu_type": "none", "cards": 0},
}


def render(context: dict, template: str = DASHBOARD_TEMPLATE) -> str:
    env = Environment(loader=DictLoader({"page.html": PAGE}), autoescape=False)
    return (
        dashboard.overlay(env)
        .get_template(template)
        .render(base_url="/hub/", **context, **dashboard.statics())
    )


class Text(HTMLParser):
    """The page's visible text (scripts and styles left out), and its elements by id."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.ids: dict[str, list[str]] = {}
        self._skip = 0
        self._open: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "template"):
            self._skip += 1
        ident = dict(attrs).get("id")
        if ident:
            self.ids[ident] = []
        self._open.append(ident or "")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "template"):
            self._skip -= 1
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        if self._skip:
            return
        self.parts.append(data)
        for ident in self._open:
            if ident:
                self.ids[ident].append(data)

    def text(self, ident: str | None = None) -> str:
        parts = self.parts if ident is None else self.ids[ident]
        return " ".join(" ".join(parts).split())


def parse(html: str) -> Text:
    t = Text()
    t.feed(html)
    return t


def context(credit: dict, can_manage: bool = True, viewer: str = "tina") -> dict:
    return page_context(
        course=COURSE,
        students=["ana", "bo", "cy"],
        servers=SERVERS,
        credit=credit,
        viewer=viewer,
        can_manage=can_manage,
    )


def test_billing_off_shows_credit_not_available() -> None:
    page = parse(render(context(credit_view(None))))
    assert page.text("gpulab-credit-off") == "credit: not available (billing off)"
    assert "gpulab-pool-balance" not in page.ids
    # Every student still has a row, with no credit figures.
    assert "ana" in page.text("gpulab-students") and "—" in page.text("gpulab-students")


def test_billing_record_is_shown_per_student_and_for_the_pool() -> None:
    view = credit_view(RECORD)
    assert view["balance"] == "EUR 412.50" and view["cap"] == "EUR 20.00"
    assert view["students"]["ana"] == {"used": "EUR 3.10", "left": "EUR 16.90"}
    html = render(context(view))
    page = parse(html)
    assert page.text("gpulab-pool-balance") == "EUR 412.50"
    assert page.text("gpulab-cap") == "EUR 20.00"
    assert page.text("gpulab-period") == "week (2026-11-30 \u2013 2026-12-07)"
    assert page.text("gpulab-overflow") == "beyond the cap, students' servers are refused"
    table = page.text("gpulab-students")
    assert "ana running RTX-4090 x1 (simulated) rtx-4090 \u00d7 1 ml101 EUR 3.10 EUR 16.90" in table
    assert "bo stopped" in table and "EUR 20.00" in table
    # A student billing does not know yet: no figures, not an error.
    assert "cy starting" in table
    assert "credit: not available" not in page.text()


def test_no_cap_and_missing_fields() -> None:
    view = credit_view({"pool_balance": {"micro": 5, "exact": "0.000005"}, "cap": None})
    assert view["balance"] == "0.000005" and view["cap"] == "no cap"
    assert view["students"] == {} and view["period"] == ""


def test_servers_states_and_open_link() -> None:
    assert server_view({"state": "ready", "url": "/user/ana/"})["label"] == "running"
    assert server_view({"state": "spawn"})["label"] == "starting"
    assert server_view({"state": "stop"})["label"] == "stopping"
    stopped = server_view({"state": "stopped"})
    assert stopped["label"] == "stopped" and stopped["gpu"] == "—" and stopped["url"] == ""
    html = render(context(credit_view(None)))
    # Open only where the server is up; Stop disabled where it is stopped.
    assert 'href="/user/ana/"' in html
    row_bo = html.split('data-student="bo"')[1].split("</tr>")[0]
    assert "gpulab-open d-none" in row_bo and "disabled>Stop" in row_bo


def test_everything_is_escaped_and_the_upload_is_for_teachers_only() -> None:
    html = render(context(credit_view(RECORD)))
    assert "<b>Machine</b>" not in html
    assert "&lt;b&gt;Machine&lt;/b&gt; learning &amp; co" in html
    assert 'id="gpulab-roster-form"' in html
    assert 'data-course="ml101"' in html
    # The script and styles are the shipped files, inlined as they are.
    assert "api/gpulab/courses/" in html and "#gpulab-students" in html
    ta_page = render(context(credit_view(RECORD), can_manage=False, viewer="tom"))
    assert 'id="gpulab-roster-form"' not in ta_page
    assert "you are a TA" in parse(ta_page).text()


def test_the_course_list_links_each_course() -> None:
    courses = [{"name": "ml101", "title": "<i>ML</i>", "role": "ta", "students": 1}]
    html = render({"courses": courses}, LIST_TEMPLATE)
    assert 'href="/hub/gpulab/courses/ml101"' in html
    assert "&lt;i&gt;ML&lt;/i&gt;" in html and "1 student" in html
    assert "You teach or assist no course." in render({"courses": []}, LIST_TEMPLATE)


def test_money_hook_sync_async_failing_and_off() -> None:
    async def from_billing(course: str) -> dict:
        return {**RECORD, "course": course}

    def broken(course: str) -> dict:
        raise RuntimeError("billing down")

    def check(hook, expect_reason: str, expect_record: bool) -> None:
        record, reason = asyncio.run(CourseDashboard(money_hook=hook).money("ml101"))
        assert reason == expect_reason
        assert (record is not None) == expect_record

    async def hanging(course: str) -> dict:
        await asyncio.sleep(30)
        return RECORD

    record, reason = asyncio.run(
        CourseDashboard(money_hook=hanging, money_timeout=0.05).money("ml101")
    )
    assert record is None and reason == BILLING_FAILED

    check(None, BILLING_OFF, False)
    check(lambda course: None, BILLING_OFF, False)
    check(lambda course: RECORD, "", True)
    check(from_billing, "", True)
    check(broken, BILLING_FAILED, False)
    check(lambda course: ["not", "a", "dict"], BILLING_FAILED, False)
    assert credit_view(None, BILLING_FAILED)["reason"] == "not available (billing did not answer)"


def test_the_page_reads_billings_own_answer(tmp_path) -> None:
    """The record from billing's real course report (a store with a course, a pool, a cap and a
    student's usage), not a hand-made one: the page shows its figures."""
    from billing.courses import course_start, feed
    from billing.scenario import heartbeat, kernel

    from gpulab.billing_service import courses, ledger, statements
    from gpulab.billing_service.db import make_engine, upgrade
    from gpulab.billing_service.models import MICRO

    engine = make_engine(f"sqlite:///{tmp_path / 'billing.sqlite'}")
    upgrade(engine)
    with engine.begin() as conn:
        settings = courses.parse_settings({"cap": "2.00"}, courses.Settings())
        courses.put_settings(conn, "ml101", settings, 0, "teacher")
        ledger.credit(conn, ledger.pool("ml101"), "topup", 50 * MICRO, "k1", 0, actor="admin")
    now = time.time()
    feed(
        engine,
        [
            course_start("ana", now - 600, "ml101"),
            kernel("kernel_start", "ana", "k", now - 600),
            heartbeat("ana", now - 1, ["k"]),
        ],
    )
    with engine.connect() as conn:
        record = statements.course_info(conn, "ml101", time.time_ns() // 1000, "CNY")
    engine.dispose()
    view = credit_view(record)
    assert view["available"] and view["cap"].endswith("2.00") and view["period"] == "week"
    used = view["students"]["ana"]
    assert used["used"] not in ("", NO_VALUE) and used["left"] not in ("", NO_VALUE)
    assert view["balance"] not in ("", NO_VALUE)
    assert view["overflow"] == "beyond the cap, students pay from their own balance"
