"""Training jobs on the statement: job-seconds, one line per job.

A job's attempt runs as named servers of its owner (``job-<id>`` for one node, ``job-<id>-<rank>``
for each node of a gang; see the hub's jobs). Billing meters them as any server, from what the hub
observes, and bills each session per second at its own price; this module only groups those
sessions for the reader: one line per job across its ranks and attempts ("Job 17 · A100 80GB x2 ·
3,600 s · CNY 4.20"), with the jobs' subtotal. Billing imports nothing of the hub, so the server
name's rule is restated here (the hub's ``spawners/jobs/model.py: parse_server_name``).

Job-seconds are the billed seconds of the job's servers added up (a 2-node job billed 1,800 s on
each node is 3,600 job-seconds), the same seconds the sessions' amounts were rated on.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from gpulab.billing_service.rating import format_money

# job-17 (one node) or job-17-1 (rank 1 of a gang); ids from 1, no leading zeros.
JOB_SERVER = re.compile(r"job-([1-9][0-9]{0,17})(?:-(0|[1-9][0-9]{0,3}))?")
SEP = " \u00b7 "  # the middle dot between the parts of a line


def job_of(server: str | None) -> tuple[int, int | None] | None:
    """``(job id, rank)`` of a job's server name (rank None for a 1-node job), else None."""
    m = JOB_SERVER.fullmatch(server or "")
    if m is None:
        return None
    return int(m.group(1)), None if m.group(2) is None else int(m.group(2))


def seconds_text(seconds: float) -> str:
    """``3,600 s``: whole seconds with thousands separated."""
    return f"{max(0, round(seconds)):,} s"


def job_label(job: dict[str, Any], currency: str) -> str:
    """``Job 17 · A100 80GB x2 · 3,600 s · CNY 4.20`` (with ``· 2 nodes`` for a gang)."""
    parts = [f"Job {job['job']}", job["mode"]]
    if job["nodes"] > 1:
        parts.append(f"{job['nodes']} nodes")
    parts += [seconds_text(job["job_seconds"]), f"{currency} {job['amount']['display']}"]
    return SEP.join(parts)


def summary(servers: list[dict[str, Any]], currency: str, money) -> dict[str, Any]:
    """The statement's ``jobs``: one entry per job among ``servers`` (the statement's sessions,
    ``statements.usage``), its sessions grouped across ranks and attempts, and the subtotal.

    Each job: ``job`` (id), ``label``, ``mode`` (per node), ``pricing``, ``nodes`` (ranks seen),
    ``attempts`` (the most sessions of any one of its servers), ``servers``, ``sessions`` (each
    with its ``rank``, ``attempt``, times, billed seconds and amount),
    ``started`` (the first session's start), ``stopped`` (the last stop; None while one runs),
    ``running``, ``job_seconds``, ``amount`` and ``compensation`` (credits for its lost work).
    ``money(micro)`` is the statement's money field."""
    by_job: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in servers:
        parsed = job_of(s.get("server"))
        if parsed is not None:
            by_job[parsed[0]].append(s)
    jobs = []
    for job_id in sorted(by_job, key=lambda j: (min(s["started"] for s in by_job[j]), j)):
        rows = by_job[job_id]
        per_server: dict[str, int] = defaultdict(int)
        parts = []
        for s in sorted(rows, key=lambda s: (s["started"], s["session"])):
            per_server[s["server"]] += 1  # its servers' n-th sessions are the n-th attempt
            parts.append(
                {
                    "session": s["session"],
                    "server": s["server"],
                    "rank": job_of(s["server"])[1],
                    "attempt": per_server[s["server"]],
                    "started": s["started"],
                    "stopped": s["stopped"],
                    "billed_seconds": s["billed_seconds"],
                    "amount": s["amount"],
                }
            )
        running = any(s["stopped"] is None for s in rows)
        amount = sum(s["amount"]["micro"] for s in rows)
        credited = sum(c["amount"]["micro"] for s in rows for c in s.get("compensations", []))
        job = {
            "job": job_id,
            "mode": rows[0]["mode"],
            "gpu_type": rows[0]["gpu_type"],
            "gpus": rows[0]["gpus"],
            "pricing": rows[0]["pricing"],
            "nodes": len(per_server),
            "attempts": max(per_server.values()),
            "servers": sorted(per_server),
            "sessions": parts,
            "started": min(s["started"] for s in rows),
            "stopped": None if running else max(s["stopped"] for s in rows),
            "running": running,
            "job_seconds": sum(s["billed_seconds"] for s in rows),
            "amount": money(amount),
            "compensation": money(credited),
        }
        job["label"] = job_label(job, currency)
        jobs.append(job)
    seconds = sum(j["job_seconds"] for j in jobs)
    total = sum(j["amount"]["micro"] for j in jobs)
    return {
        "jobs": jobs,
        "total": {
            "jobs": len(jobs),
            "job_seconds": seconds,
            "amount": money(total),
            "label": f"Jobs{SEP}{seconds_text(seconds)}{SEP}{currency} {format_money(total)}",
        },
    }


def fold(rows: list[dict[str, Any]], jobs: dict[str, Any], when) -> list[dict[str, Any]]:
    """The statement page's rows with each job's session rows folded into one ``job`` row (its
    sessions kept in ``parts``, oldest first); ``when(started, stopped)`` writes its span."""
    by_session = {r["session"]["session"]: r for r in rows if r["kind"] == "session"}
    out = [r for r in rows if r["kind"] != "session" or job_of(r["session"]["server"]) is None]
    for job in jobs["jobs"]:
        parts = [
            {**p, "row": by_session[p["session"]]}
            for p in job["sessions"]
            if p["session"] in by_session
        ]
        out.append(
            {
                "kind": "job",
                "sort": min(p["row"]["sort"] for p in parts),
                "when": when(job["started"], job["stopped"]),
                "running": job["running"],
                "job": job,
                "parts": parts,
            }
        )
    return out
