"""The hub's log of refused starts (hub_config/hub_log.py) and the JupyterHub it is written for.

A start refused below 500 (a full GPU type, a low balance) is one INFO line; a real fault keeps
its level and traceback. The messages it recognises are JupyterHub 6.1.1's, and the shutdown
order ``gpulab up`` changes (cli/hub_app.py) is JupyterHub's: both are pinned here, so that an
upgrade that changes them fails this test instead of bringing the noise back unnoticed.
"""

from __future__ import annotations

import inspect
import logging

from jupyterhub import user as jupyterhub_user
from jupyterhub.app import JupyterHub
from jupyterhub.handlers import pages
from tornado import web
from tornado.log import app_log, gen_log

from gpulab.hub_config.cli.hub_app import GpulabHub
from gpulab.hub_config.hub_log import RoutineRefusals, quiet_refusals

WHY = 'No rtx-4090 available: 1 requested, 0 of 1 free. Free now: no-GPU mode (gpu: "none").'


def record(level: int, msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("JupyterHub", level, "user.py", 1069, msg, (), exc_info)


def refusal(status: int) -> web.HTTPError:
    return web.HTTPError(status, log_message=WHY.replace("%", "%%"))


def test_jupyterhubs_refusal_line_becomes_one_info_line() -> None:
    logging.getLogger("JupyterHub").setLevel(logging.INFO)
    r = record(logging.ERROR, f"Error starting ann's server: {refusal(409)}")
    assert RoutineRefusals().filter(r)
    assert (r.levelno, r.levelname) == (logging.INFO, "INFO")
    assert r.getMessage() == f"Not starting ann's server (409): {WHY}"


def test_faults_keep_their_level_and_traceback() -> None:
    r = record(logging.ERROR, f"Error starting ann's server: {refusal(500)}")
    assert RoutineRefusals().filter(r) and r.levelno == logging.ERROR
    crash = record(logging.ERROR, "Failed to spawn single-user server with form", KeyError("x"))
    assert RoutineRefusals().filter(crash) and crash.exc_info is not None
    five = record(logging.ERROR, "Failed to spawn single-user server with form", refusal(503))
    assert RoutineRefusals().filter(five)


def test_the_forms_traceback_of_a_refusal_is_dropped() -> None:
    r = record(logging.ERROR, "Failed to spawn single-user server with form", refusal(409))
    assert not RoutineRefusals().filter(r)


def test_tornados_repeat_of_a_reason_just_logged_is_dropped() -> None:
    logging.getLogger("JupyterHub").setLevel(logging.INFO)
    quiet = RoutineRefusals()
    assert quiet.filter(record(logging.ERROR, f"Error starting ann's server: {refusal(409)}"))
    # tornado.web's log_exception: "%d %s: " + log_message, (status, request summary).
    summary = "POST /hub/api/users/ann/server (127.0.0.1)"
    repeat = logging.LogRecord(
        "JupyterHub", logging.WARNING, "web.py", 2106, "%d %s: " + WHY, (409, summary), None
    )
    assert not quiet.filter(repeat)
    # Another reason (a refusal JupyterHub's User.spawn never saw) is kept.
    other = logging.LogRecord(
        "JupyterHub",
        logging.WARNING,
        "web.py",
        2106,
        "%d %s: app: no such app",
        (404, summary),
        None,
    )
    assert quiet.filter(other)


def test_one_filter_on_the_hubs_logger_and_tornados_app_and_general_logs() -> None:
    hub_log = logging.getLogger("test-hub-log")
    quiet_refusals(hub_log)
    quiet_refusals(hub_log)
    filters = [
        [f for f in logger.filters if isinstance(f, RoutineRefusals)]
        for logger in (hub_log, app_log, gen_log)
    ]
    assert all(len(f) == 1 for f in filters) and len({id(f[0]) for f in filters}) == 1


def test_the_jupyterhub_messages_and_order_it_is_written_for() -> None:
    # User.spawn logs an HTTPError with this line, to tornado's app_log ...
    source = inspect.getsource(jupyterhub_user.User.spawn)
    assert """self.log.error(f"Error starting {self.name}'s server: {e}")""" in source
    assert jupyterhub_user.User.log is app_log
    # ... the form's handler with this one and a traceback ...
    assert '"Failed to spawn single-user server with form", exc_info=True' in inspect.getsource(
        pages.SpawnHandler._post
    )
    # ... and JupyterHub's cleanup stops the managed services before the servers, which is why
    # GpulabHub stops the servers first.
    cleanup = inspect.getsource(JupyterHub.cleanup)
    assert cleanup.index("await service.stop()") < cleanup.index("user.stop(name)")
    for name in ("start", "cleanup"):
        assert inspect.iscoroutinefunction(getattr(JupyterHub, name))
        assert list(inspect.signature(getattr(JupyterHub, name)).parameters) == ["self"]
    assert GpulabHub.class_traits()["login_banner"].metadata.get("config") is True
