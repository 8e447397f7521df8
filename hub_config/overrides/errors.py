"""Refusals with two texts: the API's words for API clients, plain words for people.

A refusal (bad spawn options, no free card, the spot market's answer) used to be one string
written for the REST API: ``no-GPU mode (gpu: "none")``, ``Invalid launch option max_price``,
``"wait": true in the API``, and the spawn form and the home page showed that string to people.
Now the exceptions that refuse carry a second text, ``human`` (``OptionsError``, ``SpawnError``,
``NoCapacity``, ``MarketAnswer``), and the hub's answers carry both:

- JSON (gpulab's APIs and JupyterHub's ``POST /hub/api/users/NAME/server``): ``message`` keeps
  naming the API's fields, ``human`` is the plain sentence a page shows (absent when the message
  is plain already), and ``field`` / ``confirm`` say which field was refused and which one
  accepts it anyway (a max price above ten times on-demand: ``confirm_max_price``);
- the spawn form (a page for people): the plain sentence (:func:`for_people`), and for a value
  that needs confirming, a checkbox in the form that confirms it on the next Start
  (:func:`confirm_field`).
"""

from __future__ import annotations

import json
from typing import Any

from tornado import web

# The machine-readable extras a refusal may carry into its JSON answer.
DETAIL_KEYS = ("field", "confirm")


def human_text(exc: Any) -> str:
    """The plain sentence an exception carries, or ""."""
    human = getattr(exc, "human", "") or ""
    return human if isinstance(human, str) else ""


def _details(exc: Any) -> dict[str, Any]:
    details = getattr(exc, "details", None)
    if callable(details):  # OptionsError.details()
        details = details()
    return details if isinstance(details, dict) else {}


def error_extras(exc: Any) -> dict[str, Any]:
    """What a JSON error answer adds to JupyterHub's ``status`` and ``message`` for ``exc``."""
    out: dict[str, Any] = {}
    human = human_text(exc)
    if human:
        out["human"] = human
    out.update({k: v for k, v in _details(exc).items() if k in DETAIL_KEYS and v})
    return out


class PlainErrors:
    """Mixin for a JupyterHub API handler: its JSON errors carry :func:`error_extras`."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        extras = error_extras(exc_info[1]) if exc_info else {}
        if not extras:
            super().write_error(status_code, **kwargs)  # type: ignore[misc]
            return
        write = self.write  # type: ignore[attr-defined]

        def merged(chunk: Any) -> None:
            data = json.loads(chunk) if isinstance(chunk, str | bytes) else dict(chunk)
            write(json.dumps({**data, **extras}))

        self.write = merged  # type: ignore[method-assign]
        try:
            super().write_error(status_code, **kwargs)  # type: ignore[misc]
        finally:
            del self.write


def http_error(status: int, message: str, exc: Any = None, **details: Any) -> web.HTTPError:
    """A tornado HTTPError with ``message`` for API clients that keeps ``exc``'s plain text and
    details (and those given) for pages."""
    error = web.HTTPError(status, log_message=message.replace("%", "%%"))
    error.human = human_text(exc)  # type: ignore[attr-defined]
    error.details = {**_details(exc), **details}  # type: ignore[attr-defined]
    return error


def for_people(error: web.HTTPError) -> web.HTTPError:
    """The same refusal as a page for people shows it: JupyterHub's spawn page prints the
    exception's ``jupyterhub_message`` (escaped; its ``jupyterhub_html_message`` never reaches
    the template in JupyterHub 6.1: the handler passes it under another name), so here that is
    the plain sentence. A value that only needs confirming is offered by the form itself
    (:func:`confirm_field`)."""
    human = human_text(error)
    if not human:
        return error
    out = web.HTTPError(error.status_code, log_message=error.log_message)
    out.args = error.args
    out.jupyterhub_message = human  # type: ignore[attr-defined]
    out.human = human  # type: ignore[attr-defined]
    out.details = _details(error)  # type: ignore[attr-defined]
    return out


def confirm_field(error: Any) -> str | None:
    """The field that accepts ``error``'s refused value when set (``confirm_max_price``), or
    None when nothing can confirm it."""
    confirm = _details(error).get("confirm")
    return confirm if isinstance(confirm, str) and confirm else None
