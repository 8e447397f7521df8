"""The statement as CSV (``/services/billing/statement.csv``, served by ``api.pages``), for users
and admins alike.

One ``server`` row per session (its pricing, the price per card-hour it was rated at (the average
for spot), its bid, capped seconds, billed seconds and amount), then a ``rate`` row per run of
billed time at one price (each spot price in force; a price above the bid is charged at the bid
and the row gives the ``price_in_force`` it replaced), a ``kernel`` row per kernel, an ``app`` row
per app run and a ``compensation`` row per credit for lost work (its amount negative: it lowers
what the session cost). Prices are per card-hour (per hour in no-GPU mode). A ``server`` row
names the session's ``course`` (empty outside courses) and who paid its amount:
``paid_by_course`` (the course's pool) and ``paid_by_personal`` (the user's own balance).

Hybrid billing (``reservations``): a ``reservation`` row per prepaid reservation of the user's own
(its id in ``reservation``, the cards and type in ``mode``, pricing ``prepaid``, its window in
``started``/``stopped``, the monthly price per card-hour and the amount charged when it was made);
a session that ran on a reservation names it in its ``server`` row with its ``prepaid_seconds``
(charged 0), and its time inside the reservation is a ``rate`` row at price 0 naming it. A tag
billing did not believe is named in ``note`` (the session was rated normally).

Training jobs (``jobs``): a job's sessions are its servers ``job-ID`` / ``job-ID-RANK``; each such
``server`` row names its ``job``, and a ``job`` row per job adds them up over its ranks and
attempts (its servers, the first start and last stop, the job-seconds in ``billed_seconds`` and
``job_seconds``, the amount, and the statement's line in ``note``: "Job 17 · A100 80GB x2 ·
3,600 s · CNY 4.20"); one ``jobs_total`` row is their subtotal (already part of the sessions'
amounts: a sum of every amount counts jobs twice, a sum of ``server`` rows does not).

Storage (``storage``): a ``storage`` row per UTC day with storage charged: the day in
``started``/``stopped``, the seconds metered, the amount, and the GB-days above the free size
and the price per GB-day in ``note``.

Spreadsheet formulas: kernel and app ids, server names and notes come from users, so any cell
that a spreadsheet would read as a formula (starting with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return) is prefixed with ``'``, which spreadsheets show as text. Cells that are plain
decimal numbers (amounts, seconds, prices, and negative ones among them) are left as they are, so
numeric columns stay numbers: a number is never a formula.
"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

# What a spreadsheet may take for the start of a formula (OWASP "CSV injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?\Z")


def safe_cell(value: Any) -> str:
    """A CSV cell that no spreadsheet evaluates: text that could start a formula gets a leading
    apostrophe; plain decimal numbers (also negative ones) stay numbers."""
    if value is None:
        return ""
    text = str(value)
    if text.startswith(FORMULA_START) and not NUMBER.match(text):
        return "'" + text
    return text


COLUMNS = (
    "session",
    "server",
    "mode",
    "pricing",
    "row",
    "started",
    "stopped",
    "kernel_id",
    "kernel_seconds",
    "app_id",
    "app_seconds",
    "price_per_card_hour",
    "billed_seconds",
)
# After the amount, so that readers of the older layout find every column where it was.
EXTRA = (
    "bid_per_card_hour",
    "price_in_force",
    "capped_seconds",
    "note",
    "course",
    "paid_by_course",
    "paid_by_personal",
    "reservation",
    "prepaid_seconds",
    "job",
    "job_seconds",
)


def statement_rows(usage: dict[str, Any]) -> list[dict[str, Any]]:
    """The CSV's rows (unescaped) from a usage statement (``statements.usage``)."""
    amount = f"amount_{usage['currency']}"
    rows: list[dict[str, Any]] = []
    jobs = usage.get("jobs") or {"jobs": []}
    job_ids = {p["session"]: j["job"] for j in jobs["jobs"] for p in j["sessions"]}
    for s in usage["servers"]:
        base = {
            "session": s["session"],
            "server": s["server"],
            "mode": s["mode"],
            "pricing": s["pricing"],
        }
        spot = s.get("spot", {})
        per_card = spot.get("average_price_per_card_hour")
        if per_card is None:
            per_card = s["rates"][0]["price_per_card_hour"] if s["rates"] else ""
        tag = s.get("reservation")
        applied = tag is not None and tag["applied"]
        rows.append(
            {
                **base,
                "row": "server",
                "started": s["started"],
                "stopped": s["stopped"],
                "price_per_card_hour": per_card,
                "billed_seconds": s["billed_seconds"],
                amount: s["amount"]["exact"],
                "bid_per_card_hour": spot.get("bid_per_card_hour"),
                "capped_seconds": spot.get("capped_seconds", ""),
                "course": s.get("course") or "",
                "paid_by_course": s["paid_by"]["course"]["exact"] if "paid_by" in s else "",
                "paid_by_personal": s["paid_by"]["personal"]["exact"] if "paid_by" in s else "",
                "reservation": tag["id"] if applied else "",
                "prepaid_seconds": s.get("prepaid_seconds", 0) if applied else "",
                "note": f"reservation tag ignored: {tag['reason']}" if tag and not applied else "",
                "job": job_ids.get(s["session"], ""),
            }
        )
        for r in s["rates"]:
            rows.append(
                {
                    **base,
                    "row": "rate",
                    "started": r["from"],
                    "stopped": r["to"],
                    "price_per_card_hour": r["price_per_card_hour"],
                    "billed_seconds": r["billed_seconds"],
                    "price_in_force": r.get("price_in_force", ""),
                    "capped_seconds": r["billed_seconds"] if r.get("capped") else "",
                    "reservation": (r.get("reservation") or "") if r.get("prepaid") else "",
                    "prepaid_seconds": r["billed_seconds"] if r.get("prepaid") else "",
                }
            )
        for k in s["kernels"]:
            rows.append(
                {
                    **base,
                    "row": "kernel",
                    "started": k["first_seen"],
                    "stopped": k["last_seen"],
                    "kernel_id": k["kernel_id"],
                    "kernel_seconds": k["kernel_seconds"],
                }
            )
        for a in s["apps"]:
            rows.append(
                {
                    **base,
                    "row": "app",
                    "started": a["first_seen"],
                    "stopped": a["last_seen"],
                    "app_id": a["app_id"],
                    "app_seconds": a["app_seconds"],
                }
            )
        for c in s.get("compensations", []):
            rows.append(
                {
                    **base,
                    "row": "compensation",
                    "started": c["created"],
                    amount: f"-{c['amount']['exact']}" if c["amount"]["micro"] else "0",
                    "note": c["note"],
                }
            )
    for r in usage.get("reservations", []):
        rows.append(
            {
                "mode": f"{r['gpu_type']} x{r['cards']}",
                "pricing": "prepaid",
                "row": "reservation",
                "started": r["from"],
                "stopped": r["to"],
                "price_per_card_hour": r["price_per_card_hour"],
                amount: r["amount"]["exact"],
                "note": f"reservation {r['id']} for {r['account']}, charged {r['charged_at']}",
                "reservation": r["id"],
            }
        )
    for j in jobs["jobs"]:
        rows.append(
            {
                "server": ", ".join(j["servers"]),
                "mode": j["mode"],
                "pricing": j["pricing"],
                "row": "job",
                "started": j["started"],
                "stopped": j["stopped"],
                "billed_seconds": j["job_seconds"],
                amount: j["amount"]["exact"],
                "note": f"{j['label']}; {j['attempts']} attempt(s)",
                "job": j["job"],
                "job_seconds": j["job_seconds"],
            }
        )
    if jobs["jobs"]:
        total = jobs["total"]
        rows.append(
            {
                "mode": "jobs",
                "row": "jobs_total",
                "billed_seconds": total["job_seconds"],
                amount: total["amount"]["exact"],
                "note": f"{total['label']} ({total['jobs']} jobs; part of the sessions' total)",
                "job_seconds": total["job_seconds"],
            }
        )
    st = usage.get("storage") or {}
    for d in st.get("days", []):
        rows.append(
            {
                "mode": "storage",
                "pricing": "per GB-day",
                "row": "storage",
                "started": d["from"],
                "stopped": d["to"],
                "billed_seconds": d["seconds"],
                amount: d["amount"]["exact"],
                "note": f"Storage above {st['free_gb']} GB free: {d['gb_days']} GB-days at "
                f"{st['price_per_gb_day']}/GB-day",
            }
        )
    return rows


def render(usage: dict[str, Any]) -> str:
    """The statement as CSV text, every cell neutralised (``safe_cell``)."""
    buf = io.StringIO()
    header = [*COLUMNS, f"amount_{usage['currency']}", *EXTRA]
    w = csv.DictWriter(buf, header, restval="")
    w.writeheader()
    for row in statement_rows(usage):
        w.writerow({k: safe_cell(v) for k, v in row.items()})
    return buf.getvalue()
