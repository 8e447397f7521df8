"""Ingestion: store each event once, widen kernel spans, re-rate the server sessions they touch.

Apps (web apps run by jupyter-server-proxy) are metered exactly like kernels: each run of an app
has a span in the same table, keyed ``app:RUN`` (``schemas.APP_PREFIX``), so a server's billed
time is the union of its kernels' *and* apps' spans, and a live app keeps the server busy for the
idle culler just as a live kernel does.

Everything derived here is a function of the *set* of accepted events, never of their order:

- a kernel span is [earliest report, latest report] of that kernel (start, restart, heartbeat,
  stop): min/max are commutative and idempotent, and a late or forged "stop" can only extend a
  span, never erase time already reported;
- a span belongs to the latest session of its server that started at or before the span (its
  first report; the hub's observed span: its latest sample, see ``_placed_at``);
- a session ends at the first ``server_stop`` at or after its start, or at the next session's start;
- a session's billed time is the union of its spans clipped to the session; its amount is rated
  from that total (see ``rating``; seconds inside the paid reservation the session runs on, see
  ``reservations``, at 0), and the ledger gets the difference to what was charged before.

A server killed with SIGKILL sends nothing more, so its kernels' spans end at their last heartbeat.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, select, tuple_, update

from gpulab.billing_service import courses, ledger, reservations
from gpulab.billing_service.bounds import Limits, Rejection, check
from gpulab.billing_service.models import Event, KernelSpan, ServerSession
from gpulab.billing_service.rating import (
    PriceBook,
    course_of,
    merge,
    rate_charge,
    reservation_of,
)
from gpulab.billing_service.schemas import (
    APP_PREFIX,
    OBSERVED_PREFIX,
    ActivityEvent,
    AppEvent,
    Heartbeat,
    KernelEvent,
    ServerStart,
    ServerStop,
)
from gpulab.billing_service.sql import insert_ignore, upsert_span_extend

NEVER = 2**62


@dataclass
class IngestResult:
    accepted: int
    duplicates: int
    rejected: list[Rejection] = field(default_factory=list)
    # How many of the accepted events were of each kind (billing's metrics).
    kinds: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        out: dict = {"accepted": self.accepted, "duplicates": self.duplicates}
        if self.rejected:
            out["rejected"] = [r.to_json() for r in self.rejected]
        return out


def ingest(
    engine: Engine,
    events: list,
    prices: PriceBook,
    trial_micro: int,
    now_us: int,
    limits: Limits | None = None,
) -> IngestResult:
    """Apply a validated batch in one transaction: all of it is stored, or none of it.

    With ``limits`` (a reporter's batch, see ``bounds``), events out of bounds are rejected one by
    one and the rest is applied; without (the hub, admins, the service itself) all are trusted.
    """
    unique: dict[str, tuple[int, object]] = {}
    for index, ev in enumerate(events):
        unique.setdefault(ev.id, (index, ev))
    rejected: list[Rejection] = []
    floors: dict[str, int] = {}
    with engine.begin() as conn:
        candidates = [ev for _, ev in unique.values()]
        if limits is not None:
            ids = sorted(unique)
            stored: set[str] = set()
            for i in range(0, len(ids), 500):
                stored.update(
                    conn.execute(
                        select(Event.event_id).where(Event.event_id.in_(ids[i : i + 500]))
                    ).scalars()
                )
            fresh = [(index, ev) for index, ev in unique.values() if ev.id not in stored]
            checked = check(conn, fresh, limits, now_us)
            candidates, rejected, floors = checked.accepted, checked.rejected, checked.floors
        new: list = []
        if candidates:
            rows = [
                {
                    "event_id": ev.id,
                    "user": ev.user,
                    "server": ev.server,
                    "kind": ev.kind,
                    "t_us": ev.t_us,
                    "kernel_id": getattr(ev, "unit", None),
                    "body": ev.model_dump_json(),
                    "received_us": now_us,
                }
                for ev in candidates
            ]
            stmt = insert_ignore(conn, Event, ["event_id"]).returning(Event.event_id)
            new_ids = set(conn.execute(stmt, rows).scalars().all())
            new = [ev for ev in candidates if ev.id in new_ids]
        if new:
            _apply(conn, new, prices, trial_micro, now_us, floors)
    return IngestResult(
        accepted=len(new),
        duplicates=len(events) - len(new) - len(rejected),
        rejected=rejected,
        kinds=dict(Counter(ev.kind for ev in new)),
    )


@dataclass
class _Seen:
    """What one batch says, gathered before anything is written (see ``_gather``)."""

    resession: set[tuple[str, str]] = field(default_factory=set)  # servers started or stopped
    spans: dict[tuple[str, str, str], list] = field(default_factory=dict)  # [first, last, name]
    heartbeat: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    busy: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def see(self, user: str, server: str, kernel: str, t: int, name: str = "") -> None:
        """A kernel or app seen alive at ``t``: widen its span, and its server was busy then."""
        cur = self.spans.get((user, server, kernel))
        if cur is None:
            self.spans[(user, server, kernel)] = [t, t, name]
        else:
            cur[0] = min(cur[0], t)
            cur[1] = max(cur[1], t)
            cur[2] = cur[2] or name
        self.busy.setdefault((user, server), []).append(t)


def _apply(
    conn: Connection,
    new: list,
    prices: PriceBook,
    trial_micro: int,
    now_us: int,
    floors: dict[str, int],
) -> None:
    """Apply the batch's new events, in order: accounts, sessions, spans, liveness, rating."""
    for user in sorted({ev.user for ev in new}):
        ledger.ensure(conn, ledger.user(user), now_us, trial_micro=trial_micro)
    seen = _gather(conn, new, floors)
    if seen.spans:
        _store_spans(conn, seen.spans)
    pairs = seen.resession | {(u, s) for u, s, _ in seen.spans} | set(seen.heartbeat)
    sessions = _sessions_of(conn, pairs)
    affected: set[int] = set()
    for pair in sorted(seen.resession):
        affected |= _restop(conn, pair, sessions.get(pair, []))
    affected |= _assign_spans(conn, pairs, sessions, seen)
    # Liveness marks for the idle culler and the burn rate.
    for pair, times in seen.heartbeat.items():
        _mark(conn, sessions.get(pair, []), times, ServerSession.last_heartbeat_us)
    for pair, times in seen.busy.items():
        _mark(conn, sessions.get(pair, []), times, ServerSession.last_busy_us)
    if affected:
        _lock_for_rating(conn, affected, now_us)
    for sid in sorted(affected):
        rate_session(conn, sid, prices, now_us)


def _gather(conn: Connection, new: list, floors: dict[str, int]) -> _Seen:
    """Record the sessions the hub started, and gather the spans, heartbeats and busy times the
    batch reports (nothing else is written here)."""
    seen = _Seen()

    def t_of(ev) -> int:
        # A reporter's event from within the clock-skew allowance before its session's start
        # counts from the start, so its kernel can never land in the session before (bounds).
        return max(ev.t_us, floors.get(ev.id, ev.t_us))

    for ev in new:
        if isinstance(ev, ServerStart):
            _record_start(conn, ev)
            seen.resession.add((ev.user, ev.server))
        elif isinstance(ev, ServerStop):
            seen.resession.add((ev.user, ev.server))
        elif isinstance(ev, ActivityEvent):
            seen.see(ev.user, ev.server, ev.unit, t_of(ev), "observed activity")
            span = seen.spans[(ev.user, ev.server, ev.unit)]
            span[0] = min(span[0], ev.first_us)
        elif isinstance(ev, KernelEvent | AppEvent):
            seen.see(ev.user, ev.server, ev.unit, t_of(ev), ev.name)
        elif isinstance(ev, Heartbeat):
            t = t_of(ev)
            seen.heartbeat.setdefault((ev.user, ev.server), []).append(t)
            for kernel in ev.kernels:
                seen.see(ev.user, ev.server, kernel, t)
            for app in ev.apps:
                seen.see(ev.user, ev.server, APP_PREFIX + app, t)
    return seen


def _record_start(conn: Connection, ev: ServerStart) -> None:
    """A session, once per hub ``server_start`` (its id), with the mode, course and tag."""
    conn.execute(
        insert_ignore(conn, ServerSession, ["start_event"]).values(
            start_event=ev.id,
            user=ev.user,
            server=ev.server,
            gpu_type=ev.gpu,
            gpus=ev.gpus,
            pricing=ev.pricing,
            options=json.dumps(ev.options),
            course=course_of(ev.options),
            reservation=reservation_of(ev.options),
            started_us=ev.t_us,
            billed_us=0,
            charged_micro=0,
        )
    )


def _store_spans(conn: Connection, spans: dict[tuple[str, str, str], list]) -> None:
    upsert_span_extend(
        conn,
        KernelSpan,
        [
            {
                "user": u,
                "server": s,
                "kernel_id": k,
                "name": v[2],
                "first_us": v[0],
                "last_us": v[1],
            }
            for (u, s, k), v in sorted(spans.items())
        ],
    )


def _assign_spans(
    conn: Connection,
    pairs: set[tuple[str, str]],
    sessions: dict[tuple[str, str], list[tuple[int, int]]],
    seen: _Seen,
) -> set[int]:
    """Assign spans to sessions: all spans of a server whose sessions changed, else the touched
    ones. Returns the sessions whose spans changed (to re-rate)."""
    affected: set[int] = set()
    touched: dict[tuple[str, str], set[str]] = defaultdict(set)
    for u, s, k in seen.spans:
        touched[(u, s)].add(k)
    for pair in sorted(pairs):
        sess = sessions.get(pair, [])
        q = select(
            KernelSpan.kernel_id, KernelSpan.first_us, KernelSpan.last_us, KernelSpan.session_id
        ).where(KernelSpan.user == pair[0], KernelSpan.server == pair[1])
        if pair not in seen.resession:
            if not touched.get(pair):
                continue
            q = q.where(KernelSpan.kernel_id.in_(sorted(touched[pair])))
        for kernel_id, first_us, last_us, old in conn.execute(q).all():
            sid = _session_at(sess, _placed_at(kernel_id, first_us, last_us))
            if sid is not None:
                affected.add(sid)
            if sid != old:
                if old is not None:
                    affected.add(old)
                conn.execute(
                    update(KernelSpan)
                    .where(
                        KernelSpan.user == pair[0],
                        KernelSpan.server == pair[1],
                        KernelSpan.kernel_id == kernel_id,
                    )
                    .values(session_id=sid)
                )
    return affected


def _placed_at(kernel_id: str, first_us: int, last_us: int) -> int:
    """The time that decides which session of its server a span belongs to.

    A reporter's kernel or app span: its first report (a reporter lives in one session). The
    hub's observed span: its latest sample. The observer samples a server only while it is up,
    so that sample lies in the span's own session, whereas its first second is the start time
    of the server's first process as the kernel's process table reads it (boot time in whole
    seconds plus ticks), which can read a little before the hub's clock said the session
    started: a job runner starts its command at once, so its span placed by its first second
    went to the session before (a re-run of the same ``job-ID``, clipped to that stopped
    session: billed 0) or to none (a first attempt: billed nowhere). Clipped to its own
    session, at most that skew is left out."""
    return last_us if kernel_id.startswith(OBSERVED_PREFIX) else first_us


def _lock_for_rating(conn: Connection, affected: set[int], now_us: int) -> None:
    """Lock what re-rating these sessions touches, in the one order every writer keeps: the
    sessions (by id), then their courses' pools (``ledger.lock``), then accounts as posted.
    Concurrent batches then queue instead of deadlocking."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            select(ServerSession.id)
            .where(ServerSession.id.in_(sorted(affected)))
            .order_by(ServerSession.id)
            .with_for_update()
        ).all()
    # Course sessions split their charge with their course's pool: the pools are opened and
    # locked while the batch decides who pays.
    names = set(
        conn.execute(
            select(ServerSession.course).where(
                ServerSession.id.in_(sorted(affected)), ServerSession.course.is_not(None)
            )
        ).scalars()
    )
    pools = [ledger.pool(name) for name in sorted(names)]
    for pool in pools:
        ledger.ensure(conn, pool, now_us)
    ledger.lock(conn, pools)


def _sessions_of(conn: Connection, pairs: set) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(user, server) -> [(started_us, id)] sorted by start."""
    out: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    if not pairs:
        return out
    rows = conn.execute(
        select(
            ServerSession.user, ServerSession.server, ServerSession.started_us, ServerSession.id
        ).where(tuple_(ServerSession.user, ServerSession.server).in_(sorted(pairs)))
    ).all()
    for u, s, started, sid in rows:
        out[(u, s)].append((started, sid))
    for v in out.values():
        v.sort()
    return out


def _session_at(sessions: list[tuple[int, int]], t_us: int) -> int | None:
    found = None
    for started, sid in sessions:
        if started <= t_us:
            found = sid
        else:
            break
    return found


def _restop(conn: Connection, pair: tuple[str, str], sessions: list[tuple[int, int]]) -> set[int]:
    """Re-derive every session end of one server from its stop events and the next start."""
    stops = sorted(
        conn.execute(
            select(Event.t_us).where(
                Event.user == pair[0], Event.server == pair[1], Event.kind == "server_stop"
            )
        ).scalars()
    )
    changed: set[int] = set()
    for i, (started, sid) in enumerate(sessions):
        end = NEVER
        if i + 1 < len(sessions):
            end = sessions[i + 1][0]
        first_stop = next((t for t in stops if t >= started), None)
        if first_stop is not None:
            end = min(end, first_stop)
        stopped = None if end == NEVER else end
        current = conn.execute(
            select(ServerSession.stopped_us).where(ServerSession.id == sid)
        ).scalar()
        if current != stopped:
            conn.execute(
                update(ServerSession).where(ServerSession.id == sid).values(stopped_us=stopped)
            )
        changed.add(sid)
    return changed


def _mark(conn: Connection, sessions: list[tuple[int, int]], times: list[int], column) -> None:
    latest: dict[int, int] = {}
    for t in times:
        sid = _session_at(sessions, t)
        if sid is not None:
            latest[sid] = max(latest.get(sid, t), t)
    for sid, t in latest.items():
        conn.execute(
            update(ServerSession)
            .where(ServerSession.id == sid)
            .where((column.is_(None)) | (column < t))
            .values({column: t})
        )


def session_intervals(conn: Connection, sess) -> list[tuple[int, int]]:
    """A session's spans clipped to the session, as (start, end) pairs (not merged)."""
    lo, hi = sess.started_us, sess.stopped_us if sess.stopped_us is not None else NEVER
    out = []
    for first, last in conn.execute(
        select(KernelSpan.first_us, KernelSpan.last_us).where(KernelSpan.session_id == sess.id)
    ).all():
        a, b = max(first, lo), min(last, hi)
        if b > a:
            out.append((a, b))
    return out


def rate_session(conn: Connection, sid: int, prices: PriceBook, now_us: int) -> None:
    """Re-rate one session from its spans and post the difference to the ledger: rated once
    (``rating.rate_charge``, cut by its course's periods for a course session), then the
    difference split between the course's pool and the student (``courses.settle``) or posted
    to the user."""
    q = select(ServerSession).where(ServerSession.id == sid)
    if conn.dialect.name == "postgresql":
        q = q.with_for_update()
    sess = conn.execute(q).one()
    merged = merge(session_intervals(conn, sess))
    # Seconds inside the paid reservation the session runs on are rated at 0 (``reservations``).
    prepaid = reservations.prepaid_window(conn, sess) if sess.reservation else None
    rules = courses.settings(conn, sess.course) if sess.course is not None else None
    charge = rate_charge(prices, sess, merged, prepaid, rules.cut if rules else None)
    delta = charge.amount_micro - sess.charged_micro
    personal = delta
    if rules is not None:
        personal = courses.settle(conn, sess, rules, charge, now_us)
    if personal:
        ledger.post(
            conn,
            ledger.user(sess.user),
            "charge",
            -personal,
            now_us,
            session_id=sid,
            note=f"session {sid}",
        )
    if delta or charge.billed_us != sess.billed_us:
        conn.execute(
            update(ServerSession)
            .where(ServerSession.id == sid)
            .values(billed_us=charge.billed_us, charged_micro=charge.amount_micro)
        )
