"""The extension's JSON API, under ``{base_url}gpulab/api/``, used by the JupyterLab frontend.

- ``GET  status``  this server: mode, price, cost so far, image, datasets, allocation id;
- ``GET  ping``    which server process answers (a random id; no log-in): the restart poll;
- ``GET  balance`` the user's balance from billing (``{"available": false, ...}`` if unreachable);
- ``GET  catalog`` / ``GET pool``: the hub's catalog and live GPU pool;
- ``POST switch``  ask the hub to restart this server with other options (GPU type, datasets);
- ``GET  gpus``    live utilization and memory of this server's GPUs (NVML), or why there is none;
- ``GET  spot``    spot servers: the spot price, the bid and a preemption warning with its deadline;
- ``GET  storage`` this user's home against its quota, as the hub measured it (the status bar).
- ``GET  gpu-usage`` this server's cards as the hub measures them (utilisation, memory, processes,
  idle time) and the hub's idle nudge with its prices (the GPU status item and panel).
- ``jobs``, ``jobs/ID``, ``jobs/ID/log``: the user's training jobs (the Jobs panel), see ``jobs``.

The browser never talks to the hub or billing itself: these handlers call them with this
server's own token (``JUPYTERHUB_API_TOKEN``), so no hub credential ever reaches the page.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from typing import Any
from urllib.parse import quote

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float, Integer, Unicode, default
from traitlets.config import Configurable

from jupyterlab_gpulab.billing import normalize_balance, unavailable
from jupyterlab_gpulab.server_info import ServerInfo
from jupyterlab_gpulab.spot import normalize_spot, not_spot
from jupyterlab_gpulab.spot import unavailable as spot_unavailable

# Keys of the hub's switch contract the frontend may send; the hub validates the values.
SWITCH_FIELDS = ("gpu", "gpus", "datasets", "image")


class GpulabSettings(Configurable):
    """Settings of the gpulab JupyterLab extension (``c.GpulabSettings.*``)."""

    billing_url = Unicode(
        config=True,
        help="""Base URL of gpulab's billing service, e.g. http://127.0.0.1:8000/services/billing/.
        Defaults to $GPULAB_BILLING_URL; when empty, the service is reached through the hub's
        proxy at the address this server was requested on ({origin}{base_url}services/billing/).""",
    )

    hub_timeout = Float(
        10.0,
        config=True,
        help="Seconds to wait for the hub or billing before answering 'unavailable'.",
    )

    low_balance_minutes = Integer(
        30,
        config=True,
        help="""Warn (a JupyterLab notification) when the balance lasts less than this many minutes
        at the current rate.""",
    )

    spot_refresh_seconds = Float(
        10.0,
        config=True,
        help="""Seconds between the page's reads of the spot price and preemption state of a spot
        server (the status bar's "spot CNY 0.42/h (max 0.60)").""",
    )

    spot_warning_refresh_seconds = Float(
        2.0,
        config=True,
        help="""Seconds between those reads while a preemption warning is on, so a cancellation
        (the price fell back under the bid) shows within that time.""",
    )

    @default("billing_url")
    def _default_billing_url(self) -> str:
        return os.environ.get("GPULAB_BILLING_URL", "")


class Upstream:
    """HTTP calls to the hub API and billing with this server's own token."""

    def __init__(self, settings: GpulabSettings, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.settings = settings
        self.token = env.get("JUPYTERHUB_API_TOKEN", "")
        self.api_url = env.get("JUPYTERHUB_API_URL", "").rstrip("/")
        self.base_url = env.get("JUPYTERHUB_BASE_URL", "/")

    async def call(
        self, url: str, method: str = "GET", body: Any = None
    ) -> tuple[int, Any, str | None]:
        """Return ``(status, json_or_None, error)``; status 0 means the service did not answer."""
        request = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {self.token}", "Accept": "application/json"},
            body=None if body is None else json.dumps(body),
            request_timeout=self.settings.hub_timeout,
            connect_timeout=self.settings.hub_timeout,
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except HTTPClientError as e:  # timeouts arrive here as code 599
            return 0, None, f"{e}"
        except OSError as e:
            return 0, None, f"not reachable ({e.strerror or e})"
        if response.code == 599:
            return 0, None, str(response.error)
        try:
            data = json.loads(response.body or b"null")
        except ValueError:
            data = None
        return response.code, data, None

    def hub(self, path: str) -> str:
        return f"{self.api_url}/{path.lstrip('/')}"

    def billing(self, path: str, origin: str) -> str:
        base = self.settings.billing_url or url_path_join(
            origin, self.base_url, "services/billing/"
        )
        return url_path_join(base, path)


class SwitchGuard:
    """Keep this server alive until a switch answer has reached the browser.

    The hub answers 202 and at once stops this very server, so the stop signal can arrive while
    the handler is still relaying that 202: the browser would see a dropped connection instead
    of "accepted". While a switch request is in flight, the stop signal is deferred (at most
    ``grace`` seconds) until the answer is written; otherwise it is handled as before.
    """

    def __init__(self, grace: float = 2.0) -> None:
        self.grace = grace
        self.in_flight = 0
        self._idle: asyncio.Event | None = None
        self._redeliveries: set[asyncio.Task] = set()

    def enter(self) -> None:
        if self._idle is None:
            self._idle = asyncio.Event()  # made here: needs the running loop
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    def install(self, server_app: Any) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            original = signal.getsignal(signum)
            # A Python handler, or the default action (servers forked by gpulab's fork server
            # die on SIGINT by default); an ignored signal stays ignored.
            if original is None or original == signal.SIG_IGN:
                continue
            try:
                signal.signal(signum, self._wrap(server_app, original))
            except ValueError:  # not the main thread (embedded servers in tests)
                return

    def _wrap(self, server_app: Any, original: Any) -> Any:
        def handler(signum: int, frame: Any) -> None:
            if self.in_flight:
                loop = server_app.io_loop.asyncio_loop
                loop.call_soon_threadsafe(self._start_redelivery, signum, original)
            elif callable(original):
                original(signum, frame)
            else:
                signal.signal(signum, original)
                os.kill(os.getpid(), signum)

        return handler

    def _start_redelivery(self, signum: int, original: Any) -> None:
        # Held until it has run: a task only the event loop refers to may be collected first.
        task = asyncio.ensure_future(self._redeliver(signum, original))
        self._redeliveries.add(task)
        task.add_done_callback(self._redeliveries.discard)

    async def _redeliver(self, signum: int, original: Any) -> None:
        if self.in_flight and self._idle is not None:
            try:
                await asyncio.wait_for(self._idle.wait(), self.grace)
            except TimeoutError:
                pass
        await asyncio.sleep(0.05)  # let the last bytes leave the socket
        # Hand the signal back to the server's own handler, in a real signal context (the
        # default SIGINT handler raises KeyboardInterrupt, which must not happen in a task).
        signal.signal(signum, original)
        os.kill(os.getpid(), signum)


class _Handler(APIHandler):
    @property
    def info(self) -> ServerInfo:
        return self.settings["gpulab_info"]

    @property
    def upstream(self) -> Upstream:
        return self.settings["gpulab_upstream"]

    @property
    def gpulab_settings(self) -> GpulabSettings:
        return self.settings["gpulab_settings"]

    def finish_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))

    def hub_message(self, status: int, data: Any, error: str | None, what: str) -> str:
        if error:
            return f"The hub did not answer ({what}): {error}"
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return data["message"]
        return f"The hub answered HTTP {status} ({what})"


class StatusHandler(_Handler):
    @web.authenticated
    def get(self) -> None:
        out = self.info.to_json()
        out["low_balance_minutes"] = self.gpulab_settings.low_balance_minutes
        out["spot_refresh_seconds"] = self.gpulab_settings.spot_refresh_seconds
        out["spot_warning_refresh_seconds"] = self.gpulab_settings.spot_warning_refresh_seconds
        out["server_id"] = self.settings["gpulab_server_id"]
        self.finish_json(out)


class PingHandler(JupyterHandler):
    """Which server process answers here: what the page polls while its server restarts.

    Open without log-in, on purpose: the restarted server does not accept the page's old
    cookie yet (a new OAuth log-in happens on the page's next navigation, and JupyterHub only
    sets the new XSRF cookie on navigations), so an authenticated poll could never succeed
    from ``fetch``. It reveals only a random id drawn when this server process started.
    """

    @allow_unauthenticated
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"gpulab": True, "server_id": self.settings["gpulab_server_id"]}))


class BalanceHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        user = self.info.user
        if not user:
            self.finish_json(unavailable("this server was not started by JupyterHub"))
            return
        origin = f"{self.request.protocol}://{self.request.host}"
        url = self.upstream.billing(f"api/v1/users/{quote(user, safe='')}/balance", origin)
        status, data, error = await self.upstream.call(url)
        if error:
            self.finish_json(unavailable(f"billing service not reachable: {error}"))
        elif status == 404 or (300 <= status < 400):
            self.finish_json(unavailable("billing service not running"))
        elif status != 200:
            self.finish_json(unavailable(f"billing service answered HTTP {status}"))
        else:
            self.finish_json(normalize_balance(data, self.info.currency))


class _HubProxy(_Handler):
    hub_path = ""

    @web.authenticated
    async def get(self) -> None:
        status, data, error = await self.upstream.call(self.upstream.hub(self.hub_path))
        if status == 200 and data is not None:
            self.finish_json(data)
        else:
            message = self.hub_message(status, data, error, f"GET {self.hub_path}")
            self.finish_json({"message": message}, status=502 if error else (status or 502))


class CatalogHandler(_HubProxy):
    hub_path = "gpulab/catalog"


class PoolHandler(_HubProxy):
    hub_path = "gpulab/pool"


class NoticesHandler(_Handler):
    """What the platform did to this user's servers by itself (an idle GPU given back), from
    the hub, for JupyterLab to show once."""

    @web.authenticated
    async def get(self) -> None:
        path = f"gpulab/users/{quote(self.info.user)}/notices"
        status, data, error = await self.upstream.call(self.upstream.hub(path))
        if status == 200 and data is not None:
            self.finish_json(data)
        else:
            self.finish_json(
                {"notices": [], "message": self.hub_message(status, data, error, path)}
            )


class StorageHandler(_Handler):
    """This user's home against its quota, as the hub measured it (the status bar's "Home 12.3 /
    50 GB"), fetched with this server's token, which may read its own user's figure only. Never an
    error status for the page: a hub that cannot say answers ``{"available": false, message}``."""

    @web.authenticated
    async def get(self) -> None:
        if not self.info.user:
            self.finish_json({"available": False, "message": "not started by JupyterHub"})
            return
        path = f"users/{quote(self.info.user, safe='')}/storage"
        status, data, error = await self.upstream.call(self.upstream.hub(path))
        if status == 200 and isinstance(data, dict):
            self.finish_json(data)
        else:
            message = self.hub_message(status, data, error, "storage")
            self.finish_json({"available": False, "message": message})


class GpuUsageHandler(_Handler):
    """This server's cards as the hub measures them (``GET /hub/api/gpulab/users/NAME/gpu``),
    fetched with this server's token (which may read its own user's figures only): the hub's
    reading, never this server's own. Never an error status for the page: a hub that cannot say
    answers ``{"available": false, message}``."""

    @web.authenticated
    async def get(self) -> None:
        info = self.info
        if not info.user:
            self.finish_json({"available": False, "message": "not started by JupyterHub"})
            return
        path = (
            f"gpulab/users/{quote(info.user, safe='')}/gpu"
            f"?server={quote(info.server_name, safe='')}"
        )
        status, data, error = await self.upstream.call(self.upstream.hub(path))
        if status == 200 and isinstance(data, dict):
            self.finish_json(data)
        else:
            message = self.hub_message(status, data, error, "GPU usage")
            self.finish_json({"available": False, "message": message})


class SwitchHandler(_Handler):
    @property
    def guard(self) -> SwitchGuard:
        return self.settings["gpulab_switch_guard"]

    async def prepare(self) -> None:
        self.guard.enter()
        self._guarded = True
        await super().prepare()

    def on_finish(self) -> None:
        if getattr(self, "_guarded", False):
            self._guarded = False
            self.guard.leave()
        super().on_finish()

    @web.authenticated
    async def post(self) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            self.finish_json({"message": "the request body must be a JSON object"}, 400)
            return
        if not isinstance(body, dict) or not body:
            self.finish_json(
                {"message": f"send a JSON object with some of: {', '.join(SWITCH_FIELDS)}"}, 400
            )
            return
        unknown = sorted(set(body) - set(SWITCH_FIELDS))
        if unknown:
            self.finish_json(
                {"message": f"{unknown[0]}: unknown field; allowed: {', '.join(SWITCH_FIELDS)}"},
                400,
            )
            return
        if not self.info.user:
            self.finish_json({"message": "this server was not started by JupyterHub"}, 409)
            return
        path = f"gpulab/users/{quote(self.info.user, safe='')}/switch"
        t0 = time.monotonic()
        status, data, error = await self.upstream.call(self.upstream.hub(path), "POST", body)
        self.log.info(
            "gpulab switch %s -> hub %s in %.2fs", body, status or error, time.monotonic() - t0
        )
        if status in (200, 201, 202):
            options = data.get("options") if isinstance(data, dict) else None
            self.finish_json(
                {"options": options, "allocation_id": self.info.allocation_id}, status=202
            )
        elif status == 404 and not (isinstance(data, dict) and data.get("message")):
            self.finish_json(
                {"message": "this hub cannot restart servers in another mode (no switch API)"},
                501,
            )
        else:
            answer = {"message": self.hub_message(status, data, error, "switch")}
            if isinstance(data, dict) and isinstance(data.get("human"), str):
                answer["human"] = data["human"]  # the hub's plain sentence, for the dialog
            self.finish_json(answer, status=502 if error else status)


class SpotHandler(_Handler):
    """The hub's spot status of this server, fetched with this server's token.

    Never an error status for the page: an on-demand server answers ``{"spot": false}``, a hub
    that does not answer (or has no spot market) ``{"spot": true, "available": false, reason}``.
    """

    @web.authenticated
    async def get(self) -> None:
        info = self.info
        if info.pricing != "spot":
            self.finish_json(not_spot(info.pricing))
            return
        if not info.user:
            self.finish_json(spot_unavailable("this server was not started by JupyterHub"))
            return
        path = (
            f"gpulab/spot/status/{quote(info.user, safe='')}"
            f"?server={quote(info.server_name, safe='')}"
        )
        status, data, error = await self.upstream.call(self.upstream.hub(path))
        if error:
            self.finish_json(spot_unavailable(f"the hub did not answer: {error}"))
        elif status == 404:
            self.finish_json(spot_unavailable("this hub has no spot market"))
        elif status != 200:
            message = self.hub_message(status, data, None, "spot status")
            self.finish_json(spot_unavailable(message))
        else:
            self.finish_json(normalize_spot(data, info.currency))


class GpusHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        info = self.info
        base = {"mode": info.mode, "gpu_type": info.gpu_type, "gpu_count": info.gpu_count}
        if info.gpu_type == "none" or not info.visible_devices:
            self.finish_json({**base, "state": "none", "devices": []})
        elif info.simulated:
            devices = [{"id": d, "name": f"{info.mode} (simulated)"} for d in info.visible_devices]
            self.finish_json({**base, "state": "simulated", "devices": devices})
        else:
            from jupyterlab_gpulab.gpus import read_devices

            reading = await asyncio.to_thread(read_devices, info.visible_devices)
            state = "nvml" if reading["nvml"] else "error"
            self.finish_json({**base, **reading, "state": state})


def setup_handlers(server_app: Any) -> None:
    # The Jobs panel's handlers build on this module's: imported here, not at the top.
    from jupyterlab_gpulab.jobs import JobHandler, JobLogHandler, JobsHandler

    web_app = server_app.web_app
    settings = GpulabSettings(parent=server_app)
    web_app.settings["gpulab_settings"] = settings
    web_app.settings["gpulab_info"] = ServerInfo.from_env()
    web_app.settings["gpulab_server_id"] = uuid.uuid4().hex
    web_app.settings["gpulab_upstream"] = Upstream(settings)
    guard = SwitchGuard()
    guard.install(server_app)
    web_app.settings["gpulab_switch_guard"] = guard
    base = url_path_join(web_app.settings["base_url"], "gpulab", "api")
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "status"), StatusHandler),
            (url_path_join(base, "ping"), PingHandler),
            (url_path_join(base, "balance"), BalanceHandler),
            (url_path_join(base, "catalog"), CatalogHandler),
            (url_path_join(base, "pool"), PoolHandler),
            (url_path_join(base, "switch"), SwitchHandler),
            (url_path_join(base, "gpus"), GpusHandler),
            (url_path_join(base, "spot"), SpotHandler),
            (url_path_join(base, "notices"), NoticesHandler),
            (url_path_join(base, "storage"), StorageHandler),
            (url_path_join(base, "gpu-usage"), GpuUsageHandler),
            # The Jobs panel (``jobs``): a job id is a whole number from 1.
            (url_path_join(base, "jobs"), JobsHandler),
            (url_path_join(base, "jobs/([1-9][0-9]{0,17})"), JobHandler),
            (url_path_join(base, "jobs/([1-9][0-9]{0,17})/log"), JobLogHandler),
        ],
    )
