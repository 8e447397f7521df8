"""gpulab inside JupyterLab: a jupyter_server extension (JSON API under ``/gpulab/api/``) plus the
prebuilt labextension (status bar, no-GPU toggle, datasets and GPU panels).

Server start-up time is a product feature, so this module imports nothing heavy: the handlers
module is loaded when the server loads the extension, and NVML only when a GPU panel asks.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyterlab-gpulab"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "jupyterlab_gpulab"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from jupyterlab_gpulab.handlers import setup_handlers
    from jupyterlab_gpulab.proxy_paths import keep_encoded_slashes, no_arbitrary_ports

    setup_handlers(server_app)
    keep_encoded_slashes()
    no_arbitrary_ports(server_app.web_app)
