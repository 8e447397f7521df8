"""Apps and the model store: what a one-click launch runs, and the models handed to it.

An app is a web UI that a user server runs behind jupyter-server-proxy, under
``/user/NAME/APP/`` (APP is the app's slug), behind the hub's login. JupyterLab is an app too,
the default one, with no command of its own. Models are read-only folders, like datasets, mounted
at ``~/models/SLUG`` and handed to the apps that use them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .no_gpu import NO_GPU

# Placeholders a command may use. jupyter-server-proxy fills {port}, {unix_socket} and
# {base_url}; gpulab's spawners fill {home} and {models} (paths inside the user's server) and
# {checkout} (the app's ``local_checkout``) before handing it over. A command with {unix_socket}
# listens on a socket in a folder only the server's user can enter, instead of a loopback port
# that every account on the node can reach.
PLACEHOLDERS = ("port", "unix_socket", "base_url", "home", "models", "checkout")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")

DEFAULT_APP = "jupyterlab"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_command(value: list[str]) -> list[str]:
    for arg in value:
        for name in _PLACEHOLDER_RE.findall(arg):
            if name not in PLACEHOLDERS:
                raise ValueError(
                    f"unknown placeholder {{{name}}} in {arg!r}; allowed: "
                    + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                )
    return value


def _check_local_command(value: list[str]) -> list[str]:
    """Under a root hub the node is shared by one Unix account per user: an app that listens on
    a loopback TCP port could be driven by any of them, without logging in to the hub. Its local
    command must listen on ``{unix_socket}`` (a folder only its server's account can enter)."""
    if value and os.geteuid() == 0 and not any("{unix_socket}" in arg for arg in value):
        raise ValueError(
            "listens on a TCP port, which every local account on this node could reach without "
            "logging in (the hub runs as root, with one account per user); make it listen on "
            "{unix_socket} instead"
        )
    return value


def _check_checkout(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.startswith("/") or "{" in value or "\n" in value:
        raise ValueError(
            f"must be the absolute path of the app's checkout on this node (e.g. /opt/ComfyUI), "
            f"not {value!r}"
        )
    return value


def _check_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must start with '/', not {value!r}")
    return value


class App(_Model):
    slug: str
    display_name: str
    description: str
    image: str | None = Field(
        None,
        description="The catalog image that carries the app; empty: any image (JupyterLab).",
    )
    gpu_types: list[str] = Field(
        default_factory=list, description="GPU type slugs it runs on; empty: every type."
    )
    needs_gpu: bool = Field(True, description="False: it also runs in no-GPU mode.")
    min_vram_gb: int = Field(0, ge=0, description="VRAM one card must have for it.")
    command: list[str] = Field(
        default_factory=list,
        description="How its container image starts it (jupyter-server-proxy command); empty: "
        "the app is JupyterLab itself.",
    )
    local_command: list[str] = Field(
        default_factory=list,
        description="How the embedded local spawner (no images) starts it from the hub's own "
        "environment; empty: the app needs the Docker spawner.",
    )
    local_checkout: str | None = Field(
        None,
        description="An operator's checkout of the app on this node (an absolute path, e.g. "
        "/opt/ComfyUI), filled into {checkout} of local_command. A local_command that uses "
        "{checkout} is offered only once this is set: the operator enables the app by pointing "
        "the catalog at their checkout.",
    )
    ready_path: str = Field(
        "/",
        description="A real endpoint of the app, under its URL, that answers 200 only once it "
        "can serve (models loaded), not merely once its port is open.",
    )
    open_path: str = Field("/", description="Where the browser goes once it is ready.")
    timeout: int = Field(
        300, gt=0, description="Seconds jupyter-server-proxy waits for its port to open."
    )
    uses_models: bool = Field(False, description="Whether it reads the model store (~/models).")
    absolute_url: bool = Field(
        True,
        description="True: the app is handed the whole path (/user/NAME/APP/...), as its own "
        "base-path option expects; False: only what follows /user/NAME/APP/, for apps that use "
        "relative links alone and have no base-path option (code-server).",
    )

    _cmd = field_validator("command", "local_command")(_check_command)
    _checkout = field_validator("local_checkout")(_check_checkout)
    _local = field_validator("local_command")(_check_local_command)
    _paths = field_validator("ready_path", "open_path")(_check_path)

    @model_validator(mode="after")
    def _commands_together(self) -> App:
        if self.local_command and not self.command:
            raise ValueError("local_command needs command (how its image starts it) too")
        if self.local_checkout and not self.uses_checkout:
            raise ValueError(
                "local_checkout is set but local_command does not use {checkout}: "
                "say in local_command where the checkout goes"
            )
        return self

    @property
    def uses_checkout(self) -> bool:
        """Whether its local command runs an operator's checkout ({checkout})."""
        return any("{checkout}" in arg for arg in self.local_command)

    @property
    def is_server(self) -> bool:
        """Whether the app is the single-user server itself (JupyterLab), not a proxied UI."""
        return not self.command

    def url_path(self, server_url: str) -> str:
        """The app's URL under a server URL such as ``/user/alice/``."""
        base = server_url.rstrip("/") + "/"
        if self.is_server:
            return base + self.open_path.lstrip("/")
        return f"{base}{self.slug}{self.open_path}"

    def ready_url_path(self, server_url: str) -> str:
        base = server_url.rstrip("/") + "/"
        if self.is_server:
            return base + "api/status"
        return f"{base}{self.slug}{self.ready_path}"

    def runs_on(self, gpu_type: str, vram_gb: int) -> bool:
        """Whether a server of ``gpu_type`` (NO_GPU: none) with cards of ``vram_gb`` fits it."""
        if gpu_type == NO_GPU:
            return not self.needs_gpu
        if self.gpu_types and gpu_type not in self.gpu_types:
            return False
        return vram_gb >= self.min_vram_gb


class StoreModel(_Model):
    """One entry of the model store (named so as not to clash with pydantic's Model)."""

    slug: str
    display_name: str
    description: str
    size: str
    license: str
    kind: str = Field(
        "diffusers",
        description="'diffusers' (a save_pretrained folder) or 'checkpoint' (.safetensors files).",
    )
    source: str = Field(
        description="Absolute path on the node, or 'data:sub/dir' inside the hub's data dir."
    )

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in ("diffusers", "checkpoint"):
            raise ValueError(f"unknown kind {value!r}; allowed: diffusers, checkpoint")
        return value

    def resolve_source(self, data_dir: str | Path) -> Path:
        """The folder on this node that holds the model."""
        if self.source.startswith("data:"):
            return Path(data_dir) / self.source[len("data:") :]
        return Path(self.source)
