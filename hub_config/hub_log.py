"""The hub's log: a routine refusal is one line, not an error with a traceback.

A start refused for a reason the person who asked is told (no free card of that type, a balance
too low, a bad option: an HTTP error below 500) is the hub doing its job. JupyterHub logs it as a
fault all the same: ``[E] Error starting NAME's server: HTTP 409: ...`` from ``User.spawn``, and,
for the spawn form, ``Failed to spawn single-user server with form`` with a whole traceback. On
the ``make run`` terminal that read as if gpulab were broken, and it buried real errors.

:class:`RoutineRefusals`, a filter on JupyterHub's own logger (installed at hub start by the
authenticator, :func:`quiet_refusals`), turns the first into one line at INFO, ``Not starting
NAME's server (409): why``, and drops the second (the form shows the person why, and the access
log line has the status). Tornado then repeats the reason of an API request's refusal (``[W]
409 POST /hub/api/users/NAME/server (...): why``): a repeat of a reason just logged is dropped
too, so each refusal is one line besides the request's own access-log line. Errors of 500 and
above, and every other record, pass unchanged.
"""

from __future__ import annotations

import logging
import re
import time

from tornado import log as tornado_log
from tornado import web

# JupyterHub 6's ``User.spawn`` message for an HTTPError (jupyterhub/user.py), formatted already:
# "Error starting NAME's server: HTTP 409: Conflict (why)".
_SPAWN_ERROR = re.compile(
    r"^Error starting (?P<who>.+)'s server: HTTP (?P<status>4\d\d): [^(]*\((?P<why>.*)\)$", re.S
)


def _refusal(exc: BaseException | None) -> bool:
    return isinstance(exc, web.HTTPError) and exc.status_code < 500


# How long a refusal's reason counts as "just logged" (tornado logs it again at once).
REPEAT_WINDOW = 30.0


class RoutineRefusals(logging.Filter):
    """Rewrites JupyterHub's records of refused starts (see the module's docstring). One
    instance serves every logger it is installed on: it remembers the reasons it logged."""

    def __init__(self) -> None:
        super().__init__()
        self._logged: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING:
            return not self._repeat(record)
        if record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if _refusal(exc):
            # JupyterHub's form handler: the refusal is reported to the person and logged once
            # already (JupyterHub's own line, below); no traceback.
            return False
        if exc is None and not record.args and isinstance(record.msg, str):
            m = _SPAWN_ERROR.match(record.msg)
            if m:
                record.msg = "Not starting %s's server (%s): %s"
                record.args = (m["who"], m["status"], m["why"])
                record.levelno, record.levelname = logging.INFO, "INFO"
                now = time.monotonic()
                self._logged = {
                    why: t for why, t in self._logged.items() if now - t < REPEAT_WINDOW
                }
                self._logged[m["why"]] = now
                return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True

    def _repeat(self, record: logging.LogRecord) -> bool:
        """Tornado's ``"%d %s: " + log_message`` warning of a 4xx whose reason was just logged."""
        args = record.args
        if not (isinstance(args, tuple) and args and isinstance(args[0], int)):
            return False
        if not 400 <= args[0] < 500 or not self._logged:
            return False
        text = record.getMessage()
        now = time.monotonic()
        return any(
            text.endswith(f": {why}") and now - t < REPEAT_WINDOW for why, t in self._logged.items()
        )


def quiet_refusals(app_logger: logging.Logger) -> None:
    """Install one :class:`RoutineRefusals` (once) on the hub's logger ``app_logger``
    (``app.log``: handlers log there), on tornado's ``app_log``, which JupyterHub's ``User`` logs
    to, and on tornado's ``gen_log``, where tornado repeats a request's refusal (a logger's
    filters see only what is logged to that logger itself)."""
    loggers = (app_logger, tornado_log.app_log, tornado_log.gen_log)
    installed = [f for lg in loggers for f in lg.filters if isinstance(f, RoutineRefusals)]
    shared = installed[0] if installed else RoutineRefusals()
    for logger in loggers:
        if shared not in logger.filters:
            logger.addFilter(shared)
