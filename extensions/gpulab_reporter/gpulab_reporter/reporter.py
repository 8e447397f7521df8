"""The reporter itself: spool, heartbeat loop (kernels and apps), sender loop with backoff."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpulab_reporter.apps import AppTracker

KERNEL_ACTIONS = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"
KINDS = {"start": "kernel_start", "restart": "kernel_restart", "shutdown": "kernel_stop"}


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class Spool:
    """Events waiting for delivery: one JSON file per write, named so they sort by time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self.rejected = path / "rejected"

    def put(self, events: list[dict[str, Any]]) -> None:
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        tmp = self.path / f".{name}.tmp"
        with open(tmp, "w") as f:
            json.dump(events, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(self.path / name)

    def take(self, limit: int) -> tuple[list[Path], list[dict[str, Any]]]:
        files, events = [], []
        for p in sorted(self.path.glob("*.json")):
            try:
                batch = json.loads(p.read_text())
            except (OSError, ValueError):
                self._reject(p)
                continue
            if events and len(events) + len(batch) > limit:
                break
            files.append(p)
            events.extend(batch)
        return files, events

    def done(self, files: list[Path]) -> None:
        for p in files:
            p.unlink(missing_ok=True)

    def _reject(self, p: Path) -> None:
        self.rejected.mkdir(exist_ok=True)
        p.rename(self.rejected / p.name)

    def reject(self, files: list[Path]) -> None:
        for p in files:
            self._reject(p)


class Reporter:
    def __init__(self, serverapp) -> None:
        self.app = serverapp
        self.log = serverapp.log
        self.url = os.environ.get("GPULAB_BILLING_URL", "").rstrip("/") + "/api/v1/events"
        self.token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.user = os.environ.get("JUPYTERHUB_USER", "")
        self.server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self.heartbeat = _float_env("GPULAB_REPORTER_HEARTBEAT", 10.0)
        self.max_backoff = _float_env("GPULAB_REPORTER_MAX_BACKOFF", 60.0)
        self.batch_limit = 1000
        spool = os.environ.get("GPULAB_REPORTER_SPOOL") or os.path.join(
            os.path.expanduser("~"), ".local", "share", "gpulab", "spool"
        )
        self.spool = Spool(Path(spool) / (self.server or "default"))
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.apps = AppTracker(serverapp.web_app)
        # run id -> time of the last heartbeat that listed the run
        self.app_seen: dict[str, float] = {}

    @classmethod
    def attach(cls, serverapp) -> Reporter | None:
        if not os.environ.get("GPULAB_BILLING_URL") or not os.environ.get("JUPYTERHUB_API_TOKEN"):
            serverapp.log.info("gpulab_reporter: no GPULAB_BILLING_URL/hub token; not reporting")
            return None
        reporter = cls(serverapp)
        serverapp.event_logger.add_listener(schema_id=KERNEL_ACTIONS, listener=reporter.on_action)
        loop = asyncio.get_event_loop()
        reporter.tasks = [
            loop.create_task(reporter.heartbeat_loop()),
            loop.create_task(reporter.send_loop()),
        ]
        serverapp.log.info(
            "gpulab_reporter: reporting to %s every %.1fs", reporter.url, reporter.heartbeat
        )
        return reporter

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": str(uuid.uuid4()),
            "kind": kind,
            "user": self.user,
            "server": self.server,
            "t": time.time(),
            **fields,
        }

    async def on_action(self, logger, schema_id: str, data: dict[str, Any]) -> None:
        kind = KINDS.get(data.get("action", ""))
        if kind is None or data.get("status") != "success" or not data.get("kernel_id"):
            return
        ev = self.event(kind, kernel=data["kernel_id"], name=data.get("kernel_name", ""))
        self.spool.put([ev])
        self.wake.set()

    async def live_kernels(self) -> list[str]:
        km = self.app.kernel_manager
        alive = []
        for kid in list(km.list_kernel_ids()):
            try:
                kernel = km.get_kernel(kid)
                if await kernel.is_alive():
                    alive.append(kid)
            except Exception:  # a kernel removed while we looked
                continue
        return alive

    def app_events(self, now: float) -> tuple[list[dict[str, Any]], list[str]]:
        """app_start/app_stop events since the last scan, and the run ids alive now.

        Nothing announces an app's exit, so (as for a kernel that dies) a stopped run is reported
        as last seen at the last heartbeat that listed it: the bill may miss up to one interval of
        it, never add time it did not run. A run starts at its process's start time.
        """
        started, stopped, live = self.apps.scan(now)
        events = [
            self.event("app_start", app=run.run_id, name=run.name, t=run.started) for run in started
        ]
        for run in stopped:
            last = self.app_seen.pop(run.run_id, run.started)
            events.append(self.event("app_stop", app=run.run_id, name=run.name, t=last))
        ids = [run.run_id for run in live]
        for run_id in ids:
            self.app_seen[run_id] = now
        return events, ids

    async def beat(self) -> None:
        """Spool one heartbeat: the kernels and apps alive now."""
        kernels = await self.live_kernels()
        # A kernel shut down while is_alive was awaited has its stop spooled already: listing it
        # at a later time would bill it past its stop. The manager drops a kernel before its
        # shutdown event, and nothing below yields, so the heartbeat's time is when it looked.
        registered = set(self.app.kernel_manager.list_kernel_ids())
        kernels = [k for k in kernels if k in registered]
        now = time.time()
        try:
            events, apps = self.app_events(now)
        except Exception:  # never let app discovery stop the kernels' heartbeat
            self.log.exception("gpulab_reporter: looking for jupyter-server-proxy apps failed")
            events, apps = [], []
        beat = self.event("heartbeat", kernels=kernels, t=now)
        if apps:  # only when there are any: a billing service that predates apps agrees
            beat["apps"] = apps
        self.spool.put([*events, beat])
        self.wake.set()

    async def heartbeat_loop(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception:
                self.log.exception("gpulab_reporter: heartbeat failed")
            await asyncio.sleep(self.heartbeat)

    async def send_loop(self) -> None:
        client = AsyncHTTPClient()
        backoff = 0.0
        while True:
            if backoff:
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            else:
                await self.wake.wait()
            self.wake.clear()
            files, events = self.spool.take(self.batch_limit)
            if not events:
                self.spool.done(files)  # empty files, if any
                backoff = 0.0
                continue
            req = HTTPRequest(
                self.url,
                method="POST",
                headers={
                    "Authorization": f"token {self.token}",
                    "Content-Type": "application/json",
                },
                body=json.dumps({"events": events}),
                request_timeout=30,
            )
            try:
                resp = await client.fetch(req)
            except HTTPClientError as e:
                if e.code in (400, 403, 413):
                    # The service will never take these: keep them aside for an operator.
                    self.log.error(
                        "gpulab_reporter: billing refused a batch (%s): %s",
                        e.code,
                        e.response.body[:500] if e.response else e,
                    )
                    self.spool.reject(files)
                    backoff = 0.0
                    self.wake.set()
                    continue
                backoff = min(max(2 * backoff, 1.0), self.max_backoff)
                continue
            except Exception as e:
                self.log.warning("gpulab_reporter: billing unreachable (%s); retrying", e)
                backoff = min(max(2 * backoff, 1.0), self.max_backoff)
                continue
            self._log_rejected(resp.body)
            self.spool.done(files)
            backoff = 0.0
            self.wake.set()  # more may be waiting

    def _log_rejected(self, body: bytes | None) -> None:
        """Billing takes a batch but may reject single events (outside this server's session,
        e.g. left in the spool by an earlier run): say which, since they are dropped."""
        try:
            rejected = json.loads(body or b"{}").get("rejected") or []
        except (ValueError, AttributeError):
            return
        for r in rejected[:10]:
            self.log.warning("gpulab_reporter: billing rejected an event: %s", r.get("message"))
        if len(rejected) > 10:
            self.log.warning("gpulab_reporter: ... and %i more", len(rejected) - 10)
