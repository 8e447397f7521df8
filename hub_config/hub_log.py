"""The hub's log: a routine refusal is one line, not an error with a traceback.

A start refused for a reason the person who asked is told (no free card of that type, a balance
too low, a bad option: an HTTP error below 500) is the hub doing its job. JupyterHub logs it as a
fault all the same: ``[E] Error starting NAME's server: HTTP 409: ...`` from ``User.spawn``, and,
for the spawn form, ``Failed to spawn single-user server with form`` with a whole traceback. On
the ``make run`` terminal that read as if gpulab were broken, and it buried real errors.

:class:`RoutineRefusals`, a filter on JupyterHub's own logger (installed at hub start by the
authenticator, :func:`quiet_refusals`), turns the first into one line at INFO, ``Not starting
NAME's server (409): why``, and drops the second (the form shows the person why, and the access
log line has the status). Errors of 500 and above, and every other record, pass unchanged.
"""

from __future__ import annotations

import logging
import re

from tornado import log as tornado_log
from tornado import web

# JupyterHub 6's ``User.spawn`` message for an HTTPError (jupyterhub/user.py), formatted already:
# "Error starting NAME's server: HTTP 409: Conflict (why)".
_SPAWN_ERROR = re.compile(
    r"^Error starting (?P<who>.+)'s server: HTTP (?P<status>4\d\d): [^(]*\((?P<why>.*)\)$", re.S
)


def _refusal(exc: BaseException | None) -> bool:
    return isinstance(exc, web.HTTPError) and exc.status_code < 500


class RoutineRefusals(logging.Filter):
    """Rewrites JupyterHub's records of refused starts (see the module's docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
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
                return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def quiet_refusals(app_logger: logging.Logger) -> None:
    """Install :class:`RoutineRefusals` (once) on the hub's logger ``app_logger`` (``app.log``:
    handlers log there) and on tornado's ``app_log``, which JupyterHub's ``User`` logs to (a
    logger's filters see only what is logged to that logger itself)."""
    for logger in (app_logger, tornado_log.app_log):
        if not any(isinstance(f, RoutineRefusals) for f in logger.filters):
            logger.addFilter(RoutineRefusals())
