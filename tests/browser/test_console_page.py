"""The operator's console in headless Chromium, on a real hub with real servers (issue 24).

Points of issue 24 covered (each failed on the old hub: there was no console page and no link to
it, so every locator below timed out):

- "An admin console in the hub (JupyterHub's look, ``admin`` scope): cards by node with who holds
  each, since when, at what price, and whether it is busy; utilisation over time per type;
  revenue per day and per user, top spenders, credits and refunds with who gave them and why;
  queues and preemptions; the slowest recent spawns with their steps";
- "Every number on it is the same number as in the metrics and the statement": the holders and
  prices are the hub API's, the money rows billing's admin revenue API's;
- "the console is checked in Chromium": the admin reaches it from the navbar, a plain user is
  refused (403, no link), the page logs no errors, and when billing does not answer the money
  section says so while the rest of the page still works.

Screenshots go to $GPULAB_SCREENSHOTS (else the test's temp folder).
"""

from __future__ import annotations

import os
import signal
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from billing.client import Billing
from console_helpers import RTX, clean_up, running_with_a_queue, spin
from harness import (
    FAST_BILLING_ENV,
    PASSWORD,
    SLOW,
    Hub,
    approved_user,
    browser_log_in,
    wait_for,
)

SHOTS = os.environ.get("GPULAB_SCREENSHOTS")
NOTE = "goodwill: the class's start was slow <b>not bold</b>"


@pytest.fixture(scope="module")
def conhub(module_hub_factory) -> Hub:
    hub = module_hub_factory(
        "console-page",
        simulate="RTX-4090:2,A100-80G:1",
        env=FAST_BILLING_ENV,
        extra_args=["--CardSampler.interval=1", "--SpotMarket.tick_interval=0.5"],
    )
    wait_for(Billing(hub).up, 60, 0.2, "the billing service")
    return hub


class Pages:
    """Browser contexts with every console error and page error kept per person."""

    def __init__(self, browser, hub: Hub, shots: Path) -> None:
        self.browser, self.hub, self.shots = browser, hub, shots
        self.contexts: list = []
        self.errors: dict[str, list[str]] = {}

    def open(self, name: str, password: str):
        context = self.browser.new_context(viewport={"width": 1400, "height": 1000})
        self.contexts.append(context)
        page = context.new_page()
        errors = self.errors.setdefault(name, [])
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        browser_log_in(page, self.hub, name, password, timeout=SLOW)
        return page

    def shot(self, page, name: str) -> None:
        page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True, animations="disabled")

    def close(self) -> None:
        for c in self.contexts:
            c.close()


@pytest.fixture
def pages(browser, conhub: Hub, tmp_path: Path):
    shots = Path(SHOTS) if SHOTS else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    p = Pages(browser, conhub, shots)
    yield p
    p.close()


def revenue_now(billing: Billing) -> dict:
    """Billing's admin revenue answer (the console's money) without its clock."""
    r = billing.get("api/admin/revenue", params={"days": 30})
    assert r.status_code == 200, r.text
    return {k: v for k, v in r.json().items() if k != "to"}


def shown(money: dict) -> str:
    """How the console writes billing's money: the statements' display, or the exact figure
    when a non-zero sum rounds to 0.00."""
    tiny = money["micro"] != 0 and Decimal(money["display"]) == 0
    return money["exact"] if tiny else money["display"]


def admin_password(hub: Hub) -> str:
    return (hub.data_dir / "admin-password").read_text().strip()


def test_the_admin_console_shows_holders_chart_queue_and_money(conhub: Hub, pages) -> None:
    from playwright.sync_api import expect

    hub = conhub
    billing = Billing(hub)
    alice, bob, carol, _ = running_with_a_queue(hub)
    users = (alice, bob, carol)
    try:
        # Money: a credit with a note, and charges once the servers have run a while.
        r = billing.post(
            f"api/v1/users/{alice}/credits",
            {
                "amount": "1.50",
                "kind": "adjustment",
                "idempotency_key": uuid.uuid4().hex,
                "note": NOTE,
            },
        )
        assert r.status_code in (200, 201), r.text

        def charged():
            got = billing.get("api/admin/revenue", params={"days": 30})
            assert got.status_code == 200, got.text
            rev = got.json()
            spent = {u["user"] for u in rev["by_user"] if u["total"]["micro"] > 0}
            return rev if {alice, bob} <= spent else None

        wait_for(charged, 120, 1, "billing to charge both servers")
        holders = {g["uuid"]: g.get("holder") for g in hub.pool()["gpus"]}
        od_price = next(t for t in hub.pool()["gpu_types"] if t["slug"] == RTX)["on_demand_price"]

        with hub.kernel(alice) as k:
            spin(k)
            page = pages.open("admin", admin_password(hub))
            page.goto(f"{hub.url}/hub/home")
            page.click("#gpulab-nav-console")
            page.wait_for_url(f"{hub.url}/hub/gpulab/console", timeout=SLOW)

            # Cards by node: each holder, its price, alice's busy and bob's idle.
            for uid, holder in holders.items():
                row = page.locator(f'tr[data-uuid="{uid}"]')
                expect(row).to_have_attribute("data-state", "held" if holder else "free")
                holder_cell = row.locator(".gpulab-console-holder")
                expect(holder_cell).to_have_text(holder.rstrip("/") if holder else "—")
                expect(row).to_contain_text("simulated")
            alice_row = page.locator("tr[data-uuid]", has_text=alice)
            expect(alice_row).to_contain_text(f"CNY {od_price}")
            expect(alice_row).to_contain_text("on-demand")
            expect(alice_row.locator('[data-activity="busy"]')).to_be_visible(timeout=SLOW)
            bob_row = page.locator("tr[data-uuid]", has_text=bob)
            expect(bob_row.locator('[data-activity="idle"]')).to_contain_text("idle")
            expect(page.locator("#gpulab-console-summary")).to_contain_text("3 cards: 1 free")
            expect(page.locator("#gpulab-console-summary")).to_contain_text("simulated pool")

            # The chart: one line per GPU type, drawn from the sampler's history.
            line = page.locator(f'.gpulab-console-util-chart polyline[data-type="{RTX}"]')
            expect(line).to_have_count(1)

            def drawn() -> bool:
                if int(line.get_attribute("data-points") or 0) >= 1:
                    return True
                page.reload()  # the sampler's first minute was not in yet
                line.wait_for(state="attached", timeout=SLOW)
                return False

            wait_for(drawn, 90, 2, "the sampler's utilisation in the chart")
            expect(page.locator(f'[data-legend="{RTX}"]')).to_contain_text("% now")

            # The queue: carol's bid, why it waits.
            queued = page.locator(f'#gpulab-console-queues tr[data-user="{carol}"]')
            expect(queued).to_contain_text("CNY 0.50")
            expect(queued).to_contain_text("CNY 0.40")
            expect(queued).to_contain_text("free card")

            # The slowest spawns, with their steps.
            spawn = page.locator(f'#gpulab-console-spawns tr[data-user="{alice}"]')
            expect(spawn).to_contain_text("success")
            spawn.locator("summary").click()
            expect(spawn.locator("li").first).to_be_visible()

            expect(page.locator("#gpulab-console-money")).to_be_visible(timeout=SLOW)
            pages.shot(page, "console-admin")

        # Money, once the servers stopped (their charges final): billing's own figures, the
        # same as its admin API's, and the credit with who gave it and why (as text).
        for name in (alice, bob):
            hub.stop_server(name)

        def same_money() -> dict | None:
            """Billing's figures when the page, loaded after them, shows the same (a stop's
            last charges land after the stop: until then the two may differ)."""
            revenue = revenue_now(billing)
            page.reload()
            status = page.locator("#gpulab-console-money-status")
            expect(status).to_contain_text("CNY", timeout=SLOW)
            return revenue if f"CNY {shown(revenue['total'])}" in status.inner_text() else None

        revenue = wait_for(same_money, 90, 2, "the console's money equal to billing's")
        for name in (alice, bob):
            row = next(u for u in revenue["by_user"] if u["user"] == name)
            assert row["total"]["micro"] > 0, row
            for table in ("users", "top"):
                cell = page.locator(f'#gpulab-console-{table} tr[data-user="{name}"]')
                expect(cell).to_contain_text(f"CNY {shown(row['total'])}")
        today = revenue["days"][-1]
        expect(
            page.locator(f'#gpulab-console-days tr[data-date="{today["date"]}"]')
        ).to_contain_text(f"CNY {shown(today['total'])}")
        expect(
            page.locator(f'#gpulab-console-revenue-chart rect[data-date="{today["date"]}"]')
        ).to_be_attached()
        expect(page.locator("#gpulab-console-money-status")).to_contain_text(
            f"CNY {shown(revenue['total'])}"
        )
        credit = page.locator(f'#gpulab-console-credits tr[data-account="user:{alice}"]')
        expect(credit).to_contain_text(NOTE)  # the markup shown as text, not run
        expect(credit).to_contain_text("gpulab-admin")
        expect(credit).to_contain_text("CNY 1.50")
        pages.shot(page, "console-admin-money")
        assert not pages.errors["admin"], pages.errors["admin"]

        # A plain user: refused, and no link to it.
        person = approved_user(hub, "plain")
        mine = pages.open(person, PASSWORD)
        mine.goto(f"{hub.url}/hub/home")
        expect(mine.locator("#gpulab-nav-console")).to_have_count(0)
        answer = mine.goto(f"{hub.url}/hub/gpulab/console")
        assert answer.status == 403
        expect(mine.locator("#gpulab-console-nodes")).to_have_count(0)
        pages.shot(mine, "console-plain-user-refused")
        assert not [e for e in pages.errors[person] if "status of 403" not in e]
    finally:
        clean_up(hub, users)


def test_the_console_says_when_billing_does_not_answer(conhub: Hub, pages) -> None:
    from playwright.sync_api import expect

    hub = conhub
    billing = Billing(hub)
    name = hub.create_user()
    hub.spawn_ready(name, {"gpu": RTX}, timeout=120)
    page = pages.open("admin", admin_password(hub))
    pid = billing.pid
    os.kill(pid, signal.SIGSTOP)  # billing stops answering (its process is still there)
    try:
        page.goto(f"{hub.url}/hub/gpulab/console")
        status = page.locator("#gpulab-console-money-status")
        expect(status).to_contain_text("Billing is not answering", timeout=SLOW)
        expect(page.locator("#gpulab-console-money")).to_be_hidden()
        # The hub's own sections still work.
        expect(page.locator("tr[data-uuid]", has_text=name)).to_have_attribute("data-state", "held")
        expect(page.locator(".gpulab-console-util-chart")).to_have_count(1)
        pages.shot(page, "console-billing-down")
    finally:
        os.kill(pid, signal.SIGCONT)
        hub.stop_server(name)
    assert not [e for e in pages.errors["admin"] if e.startswith("page error")]
