"""Whether a launched app answers yet, asked by the hub on the server's internal address.

Users' servers live on origins of their own (:mod:`.origin`), so the hub's home page may not
fetch an app's readiness URL itself (another origin: its Content-Security-Policy allows the hub
alone, and the answer would be opaque). The launch status (``GET /hub/api/gpulab/users/NAME/
launch``) asks here instead: the hub requests the app's readiness URL and its ``gpulab/status``
on the server's internal address with the server's own token (its ``access:servers`` scope
covers exactly that server), never following redirects. What comes back only tells the owner's
own page when to open the app; nothing of money or access rests on it.

:class:`LaunchWatch` makes "ready" mean that the app can do its job. A launch is watched by the
hub itself (the browser may be gone): once the server is up, the app's readiness URL must answer
200 within the app's ``timeout``. An app that says it cannot (the WebUI's 409 with no model, a
``failed`` stage, a 404 or a 5xx of its proxy), whose server died, or that never answers in time
ends the launch: the hub stops the server (its cards go back), keeps the reason for the launch
page, and has billing credit the session's whole charge (reason ``launch-failed``), so that a
launch that could not work costs nothing. The verdict errs only towards "not ready": what a
user's app says can end its own launch, never start a charge.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Float, Int
from traitlets.config import SingletonConfigurable

from gpulab.hub_config.billing.observer import ActivityObserver

log = logging.getLogger("gpulab.launch")

# Answers larger than this are not a status; the request gives up after PROBE_TIMEOUT seconds.
MAX_BODY = 64 * 1024
PROBE_TIMEOUT = 5.0


async def _get(url: str, token: str) -> tuple[int, bytes]:
    body = bytearray()

    def keep(chunk: bytes) -> None:  # at most MAX_BODY bytes of whatever the server sends
        body.extend(chunk[: max(0, MAX_BODY - len(body))])

    try:
        r = await AsyncHTTPClient().fetch(
            url,
            headers={"Authorization": f"token {token}"},
            follow_redirects=False,
            request_timeout=PROBE_TIMEOUT,
            raise_error=False,
            streaming_callback=keep,
        )
    except (HTTPClientError, OSError, ValueError):
        return 0, b""
    return r.code, bytes(body)


async def probe_app(spawner: Any, app: Any) -> dict[str, Any]:
    """``{"status": HTTP status of the readiness URL (0: no answer), "stage", "error"}``.

    ``stage``/``error`` come from the app's ``gpulab/status`` when it has one.
    """
    server = getattr(spawner, "server", None)
    token = getattr(spawner, "api_token", "") or ""
    if server is None or not token:
        return {"status": 0, "stage": "", "error": ""}
    host = server.host  # the server's internal address, e.g. http://127.0.0.1:PORT
    status, ready_body = await _get(host + app.ready_url_path(server.base_url), token)
    out: dict[str, Any] = {"status": status, "stage": "", "error": ""}
    if status >= 400 and status not in NOT_YET:
        out["error"] = _detail(ready_body)
    if status and status != 502 and not app.is_server:
        code, body = await _get(host + app.url_path(server.base_url) + "gpulab/status", token)
        if code == 200:
            try:
                data = json.loads(body)
            except ValueError:
                data = {}
            if isinstance(data, dict):
                out["stage"] = str(data.get("stage") or "")[:100]
                out["error"] = str(data.get("error") or "")[:500]
    return out


# Answers that mean "not up yet": nothing listens yet (0), the proxy cannot reach it yet (502,
# 504) or the app says it is loading (503).
NOT_YET = (0, 502, 503, 504)


def _detail(body: bytes) -> str:
    """The reason an error answer gives (A1111's and Tornado's ``detail``/``message``)."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    return str(data.get("detail") or data.get("message") or "")[:500]


def verdict(probe: dict[str, Any]) -> tuple[str, str]:
    """``("ready", "")``, ``("wait", "")`` or ``("failed", why)`` for one probe's answer."""
    status = probe.get("status", 0)
    if probe.get("stage") == "failed":
        return "failed", probe.get("error") or "the app failed to start"
    if status == 200:
        return "ready", ""
    if status in NOT_YET:
        return "wait", ""
    if status == 404:
        return "failed", "the app is not set up in this server"
    return "failed", probe.get("error") or f"the app answered {status}"


Stop = Callable[[str], Awaitable[Any]]
Compensate = Callable[..., Awaitable[Any]]


class LaunchWatch(SingletonConfigurable):
    """Watches each app launch until the app is ready, or ends it as a clear error that bills
    nothing (see the module's docstring)."""

    interval = Float(
        0.5,
        config=True,
        help="""Seconds between the hub's questions to a launching app (its readiness URL).""",
    )

    grace = Float(
        30.0,
        config=True,
        help="""Seconds a launched app gets beyond its catalog `timeout` (how long
        jupyter-server-proxy waits for it to listen) to answer ready; then the launch is ended
        as failed, its server stopped and its charge credited back.""",
    )

    credits_per_day = Int(
        3,
        config=True,
        help="""How many failed launches a user is credited back in any 24 hours. A user controls
        everything in their server, its app's readiness answer included: without a bound, a
        launch made to fail on purpose would give up to the app's timeout of free GPU time, again
        and again. Beyond this the launch still ends (server stopped, reason shown) but its time
        is charged as usual. 0: never credit.""",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._failures: dict[str, str] = {}
        self._credited: dict[str, list[float]] = {}
        self._tasks: dict[str, asyncio.Task] = {}  # launches still watched, by user
        self._ending: set[asyncio.Task] = set()  # failed launches being stopped and credited

    def failure(self, user: str) -> str:
        """Why ``user``'s last launch was ended ("" when it was not)."""
        return self._failures.get(user, "")

    def start(
        self,
        user: str,
        spawner: Any,
        app: Any,
        spawn: asyncio.Future,
        stop: Stop,
        compensate: Compensate | None,
    ) -> None:
        """Watch ``user``'s launch of ``app``, started by ``spawn`` (JupyterHub's
        spawn_single_user); a new launch forgets the last one's failure."""
        self._failures.pop(user, None)
        old = self._tasks.pop(user, None)
        if old is not None:
            old.cancel()
        task = asyncio.ensure_future(self._watch(user, spawner, app, spawn, stop, compensate))
        self._tasks[user] = task
        task.add_done_callback(lambda t: self._tasks.get(user) is t and self._tasks.pop(user))

    async def _watch(
        self,
        user: str,
        spawner: Any,
        app: Any,
        spawn: asyncio.Future,
        stop: Stop,
        compensate: Compensate | None,
    ) -> None:
        try:
            why = await self._until_ready(spawner, app, spawn)
        except Exception:
            log.exception("Watching %s's launch of %s failed", user, app.slug)
            return
        # The watch is over: a new launch must not cancel what follows (the stop, the credit).
        if self._tasks.get(user) is asyncio.current_task():
            task = self._tasks.pop(user)
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
        if not why:
            return
        started = spawner.orm_spawner.started
        # A moment inside this session (its server still runs): billing credits the session in
        # force then, not a later launch's.
        now = time.time()
        recent = [t for t in self._credited.get(user, []) if now - t < 24 * 3600]
        credit = compensate is not None and len(recent) < self.credits_per_day
        if credit:
            recent.append(now)
        self._credited[user] = recent
        if credit or compensate is None:
            charged = (
                "this launch is not charged (unless notebooks ran on the server meanwhile)"
                if credit
                else "no charge was made"
            )
        else:
            charged = (
                f"this launch is charged as usual ({len(recent)} launches that could not start "
                "were already not charged in the last 24 hours)"
            )
        message = (
            f"{app.display_name} could not start: {why}. Your server was stopped and {charged}."
        )
        self._failures[user] = message
        log.warning("Ending %s's launch of %s: %s", user, app.slug, why)
        try:
            await stop(user)
            await self._stopped(spawner)
            if credit and compensate is not None:
                await self._observed_to_the_end(getattr(spawner, "owner", f"{user}/"))
                stamp = started.timestamp() if started is not None else time.time()
                await compensate(
                    user=user,
                    server=spawner.name or "",
                    at=now,
                    reason="launch-failed",
                    checkpoint="not-run",
                    key=f"launch-failed-{user}-{spawner.name or ''}-{stamp:.6f}",
                )
        except Exception:
            log.exception("Ending %s's failed launch of %s", user, app.slug)

    async def _until_ready(self, spawner: Any, app: Any, spawn: asyncio.Future) -> str:
        """ "" once the app is ready (or the launch is no longer this watch's business), else
        why it cannot be."""
        # The server's own start: a refused or failed spawn is JupyterHub's to report.
        while not spawner.ready:
            if spawn.done() and not spawner.active and not spawner.pending:
                return ""
            await asyncio.sleep(self.interval)
        if app.is_server:
            return ""
        started = spawner.orm_spawner.started
        deadline = time.monotonic() + app.timeout + self.grace
        while True:
            if spawner.orm_spawner.started != started or spawner.pending == "stop":
                return ""  # stopped (or relaunched) by someone else meanwhile
            if not spawner.active or await spawner.poll() is not None:
                return "its server stopped"
            state, why = verdict(await probe_app(spawner, app))
            if state == "ready":
                return ""
            if state == "failed":
                return why
            if time.monotonic() > deadline:
                return f"it did not become ready within {app.timeout + self.grace:.0f} s"
            await asyncio.sleep(self.interval)

    async def _while(self, condition: Callable[[], bool], seconds: float) -> None:
        """Wait while ``condition()`` holds, at most ``seconds``."""
        for _ in range(max(1, round(seconds / self.interval))):
            if not condition():
                return
            await asyncio.sleep(self.interval)

    async def _observed_to_the_end(self, owner: str) -> None:
        """Until the activity observer has reported the stopped server's last span: the credit
        is computed when posted, so it must come after the last charge."""
        if not ActivityObserver.initialized():
            return
        observer = ActivityObserver.instance()
        await self._while(lambda: owner in observer.trackers, 4 * observer.interval + 10)
        # The round that dropped it reports its closing span before the next round begins.
        await asyncio.sleep(observer.interval * 1.2)

    async def _stopped(self, spawner: Any) -> None:
        await self._while(lambda: bool(spawner.active or spawner.pending), 60)
