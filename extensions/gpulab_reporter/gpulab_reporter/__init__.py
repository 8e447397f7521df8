"""gpulab usage reporter: tells gpulab's billing service which kernels are alive.

A jupyter_server extension. It listens to jupyter_server's kernel_actions events (start, restart,
shutdown) and sends a heartbeat listing the live kernels every ``GPULAB_REPORTER_HEARTBEAT``
seconds (default 10): the heartbeat is the source of truth, since a kernel that dies emits nothing.

Every event is first written to a spool directory in the user's home
(``~/.local/share/gpulab/spool``), then posted in batches with the server's own hub token
(``JUPYTERHUB_API_TOKEN``) to ``GPULAB_BILLING_URL``; a batch leaves the spool only once the
service acknowledged it. Failures are retried with exponential backoff (with jitter), so the
billing service being down for minutes loses nothing, and a server restart resends what is left.

Importing this package costs nothing: the work lives in ``gpulab_reporter.reporter``, imported when
the server loads the extension.
"""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpulab_reporter"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from gpulab_reporter.reporter import Reporter

    Reporter.attach(serverapp)
