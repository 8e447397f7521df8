"""Issue 22, a local ComfyUI enabled from the catalog: the operator's keys are checked, and a
refusal names the key and what is allowed.

- ``[apps.comfyui] local_checkout`` (the operator's checkout) must be an absolute path, and only
  means something to a ``local_command`` that says where it goes (``{checkout}``);
- a ``local_command`` on a TCP port (``{port}``) is refused on a multi-user node (a root hub, one
  account per user), naming the key: every account could reach it without the hub's login;
- until the operator sets ``local_checkout``, the app is not offered by the local spawner, and
  the operator's reason names the key to set.

These failed on the code before (no ``local_checkout`` key: any such catalog was refused as an
unknown field, and ComfyUI had no local command at all).
"""

from __future__ import annotations

import os
import subprocess
import tomllib

import pytest
from harness import VENV_BIN

from gpulab.catalog import CatalogError, load_catalog
from gpulab.catalog.models import DEFAULT_CATALOG
from gpulab.spawners.apps import checkout_problem, fill_placeholders

DEFAULT = DEFAULT_CATALOG.read_text()
LOCAL = '# local_checkout = "/opt/ComfyUI"'


def catalog_with(tmp_path, text: str):
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return load_catalog(path)


def test_the_shipped_comfyui_runs_a_checkout_on_a_unix_socket_once_enabled() -> None:
    app = load_catalog().apps["comfyui"]
    assert app.local_checkout is None and app.uses_checkout
    assert any("{unix_socket}" in a for a in app.local_command)
    assert not any("{port}" in a for a in app.local_command)
    # Not offered until the operator points the catalog at a checkout.
    assert "set local_checkout of [apps.comfyui]" in checkout_problem(app)


def test_a_checkout_on_this_node_enables_it_and_fills_the_command(tmp_path) -> None:
    checkout = tmp_path / "ComfyUI"
    checkout.mkdir()
    app = catalog_with(tmp_path, DEFAULT.replace(LOCAL, f'local_checkout = "{checkout}"')).apps[
        "comfyui"
    ]
    assert checkout_problem(app) == ""
    cmd = fill_placeholders(app.local_command, "/home/alice", app.local_checkout)
    assert cmd[cmd.index("--checkout") + 1] == str(checkout)
    assert cmd[cmd.index("--models") + 1] == "/home/alice/models"


def test_a_checkout_that_is_not_there_says_so(tmp_path) -> None:
    gone = tmp_path / "nothing-here"
    app = catalog_with(tmp_path, DEFAULT.replace(LOCAL, f'local_checkout = "{gone}"')).apps[
        "comfyui"
    ]
    assert checkout_problem(app) == f"its local_checkout {gone} is not a folder on this node"


@pytest.mark.parametrize("value", ["ComfyUI", "~/ComfyUI", "{home}/ComfyUI"])
def test_a_checkout_must_be_an_absolute_path(tmp_path, value: str) -> None:
    with pytest.raises(CatalogError) as e:
        catalog_with(tmp_path, DEFAULT.replace(LOCAL, f'local_checkout = "{value}"'))
    assert "apps.comfyui.local_checkout" in str(e.value)
    assert "absolute path" in str(e.value)


def test_a_checkout_needs_a_command_that_uses_it(tmp_path) -> None:
    data = tomllib.loads(DEFAULT)
    assert "{checkout}" in " ".join(data["apps"]["comfyui"]["local_command"])
    text = DEFAULT.replace('"--checkout", "{checkout}", ', "").replace(
        LOCAL, 'local_checkout = "/opt/ComfyUI"'
    )
    with pytest.raises(CatalogError) as e:
        catalog_with(tmp_path, text)
    assert "apps.comfyui" in str(e.value) and "{checkout}" in str(e.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="a multi-user node is a root hub")
def test_a_local_command_on_a_tcp_port_is_refused_on_a_multi_user_node(tmp_path) -> None:
    text = DEFAULT.replace(
        '"--unix-socket", "{unix_socket}", "--prefix"', '"--port", "{port}", "--prefix"'
    )
    assert text != DEFAULT
    with pytest.raises(CatalogError) as e:
        catalog_with(tmp_path, text)
    assert "apps.comfyui.local_command" in str(e.value)
    assert "{unix_socket}" in str(e.value)


def test_gpulab_models_tells_the_operator_what_is_not_offered_and_why(tmp_path) -> None:
    """Users only see that an app is not offered; ``gpulab models`` says why, in the operator's
    terms (before: no word on apps, and the users' tiles said "needs the Docker spawner")."""
    done = subprocess.run(
        [str(VENV_BIN / "gpulab"), "models", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert "the model store is empty" in done.stdout
    assert "NOT OFFERED" in lines["comfyui"] and "set local_checkout" in lines["comfyui"]
    assert "NOT OFFERED" in lines["tensorboard"] and "Docker spawner" in lines["tensorboard"]
    assert "offered" in lines["sd-webui"] and "NOT" not in lines["sd-webui"]
