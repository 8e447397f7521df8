"""Apps in containers: the hub hands a Docker server its apps and the read-only model store, and
jupyter-server-proxy in the container serves the app through the hub's public URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from billing.client import user_token
from docker_helpers import start_docker_hub
from harness import Hub

# A tiny web app, as an image would carry one: it answers every path with what it saw and what
# ~/models holds. (No braces: jupyter-server-proxy fills {placeholders} in commands.)
APP = (
    "import http.server, json, os, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        models = os.path.expanduser('~/models')\n"
    "        body = json.dumps(dict(path=self.path, models=sorted(os.listdir(models)),\n"
    "            writable=os.access(os.path.join(models, 'tiny'), os.W_OK))).encode()\n"
    "        self.send_response(200)\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
)


@pytest.fixture(scope="module")
def app_catalog(catalog: Path, tmp_path_factory) -> Path:
    store = Path(tmp_path_factory.mktemp("store"))
    (store / "tiny").mkdir()
    (store / "tiny" / "model_index.json").write_text("{}")
    store.chmod(0o755)
    path = catalog.with_name("apps-catalog.toml")
    path.write_text(
        catalog.read_text()
        + '\n[apps.echo]\ndisplay_name = "Echo"\ndescription = "Says what it got"\n'
        'image = "base"\nneeds_gpu = false\n'
        f"command = {json.dumps(['python', '-c', APP, '{port}'])}\n"
        'ready_path = "/ready"\n'
        '\n[models.tiny]\ndisplay_name = "Tiny"\ndescription = "A folder"\n'
        f'size = "1 KB"\nlicense = "none"\nsource = "{store / "tiny"}"\n'
    )
    return path


@pytest.fixture(scope="module")
def ahub(module_hub_factory, docker, app_catalog: Path) -> Hub:
    return start_docker_hub(module_hub_factory, docker, "docker-apps", app_catalog)


def test_a_container_serves_its_app_and_the_model_store_read_only(ahub: Hub) -> None:
    user = ahub.create_user()
    token = user_token(ahub, user)
    r = ahub.api("POST", f"/gpulab/users/{user}/apps/echo/launch", token, json={})
    assert r.status_code == 202, r.text
    info = r.json()
    assert info["gpu"] == "none" and info["url"] == ahub.user_url(user, "echo/")
    ahub.wait_ready(user)
    try:
        got = requests.get(
            info["url"] + "a%2Fb/c",
            headers={"Authorization": f"token {token}"},
            timeout=120,
        )
        assert got.status_code == 200, got.text[:300]
        # The whole path, with the encoded slash kept, and the store's model, not writable.
        assert got.json() == {
            "path": f"/user/{user}/echo/a%2Fb/c",
            "models": ["tiny"],
            "writable": False,
        }
    finally:
        ahub.stop_server(user)


def test_an_app_whose_image_is_missing_is_refused_and_starts_nothing(ahub: Hub) -> None:
    user = ahub.create_user()
    before = ahub.pool()["gpu_types"]
    r = ahub.api("POST", f"/gpulab/users/{user}/apps/sd-webui/launch", json={})
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    # A user is told plainly what this hub offers (why not is the operator's: their tiles, the
    # log, `gpulab models`), never the node's image jargon.
    assert "not offered on this hub" in message and "Echo" in message, message
    assert "image" not in message.lower() and "node" not in message.lower(), message
    assert ahub.server(user) is None and ahub.pool()["gpu_types"] == before
