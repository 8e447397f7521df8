"""gpulab's diffusers Stable Diffusion WebUI (extensions/gpulab_sd_webui), as its clients see it:
the real ``gpulab-sd-webui`` process, serving a tiny real diffusers pipeline built by its own
``--make-tiny-model``, under a sub-path as jupyter-server-proxy forwards it."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import websocket
from harness import VENV_BIN, free_port, wait_for
from PIL import Image

CLI = str(VENV_BIN / "gpulab-sd-webui")
SUBPATH = "/user/alice/sd-webui"
# Importing torch and diffusers on a busy 2-core CI machine can take a while.
START_DEADLINE = 120
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == PNG_MAGIC, png[:16]
    assert png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


@dataclass
class WebUI:
    proc: subprocess.Popen
    port: int
    data_dir: Path
    subpath: str
    log: Path
    # Status codes of the readiness endpoint seen while waiting (None: connection refused).
    readiness: list[int | None] = field(default_factory=list)
    loading_bodies: list[dict] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.subpath}"

    @property
    def ws_base(self) -> str:
        return f"ws://127.0.0.1:{self.port}{self.subpath}"

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.base + path, timeout=60, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        return requests.post(self.base + path, timeout=60, **kw)

    def options_status(self) -> int | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"gpulab-sd-webui exited:\n{self.log.read_text()}")
        try:
            r = self.get("/sdapi/v1/options")
        except requests.ConnectionError:
            return None
        if r.status_code == 503:
            self.loading_bodies.append(r.json())
        return r.status_code

    def wait_ready(self) -> None:
        def ready() -> bool:
            self.readiness.append(self.options_status())
            return self.readiness[-1] == 200

        wait_for(ready, timeout=START_DEADLINE, interval=0.05, what="sd-webui readiness")

    def wait_http(self) -> None:
        """Until the server answers at all (the model may still be loading)."""
        wait_for(
            lambda: self.options_status() is not None,
            timeout=START_DEADLINE,
            interval=0.05,
            what="sd-webui's HTTP server",
        )

    def stop(self) -> float:
        """SIGTERM; how long the process took to exit."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return time.monotonic() - start


def start_webui(
    tmp: Path,
    models: list[Path],
    subpath: str | None = SUBPATH,
    env: dict | None = None,
    served_at: str = SUBPATH,
) -> WebUI:
    """Start ``gpulab-sd-webui`` (``--subpath`` unless None) serving under ``served_at``."""
    port = free_port()
    data_dir = tmp / "home" / "sd-webui"
    log = tmp / "sd-webui.log"
    cmd = [CLI, "--port", str(port), "--data-dir", str(data_dir)]
    if subpath is not None:
        cmd += ["--subpath", subpath]
    for m in models:
        cmd += ["--models", str(m)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return WebUI(proc, port, data_dir, served_at, log)


@pytest.fixture(scope="module")
def model_store(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("models")
    r = subprocess.run(
        [CLI, "--make-tiny-model", str(store / "tiny-sd")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote a tiny Stable Diffusion pipeline" in r.stdout
    return store


@pytest.fixture(scope="module")
def webui(tmp_path_factory, model_store) -> Iterator[WebUI]:
    ui = start_webui(tmp_path_factory.mktemp("webui"), [model_store])
    try:
        ui.wait_ready()
        yield ui
    finally:
        ui.stop()
        assert ui.proc.poll() is not None


# ---- the tiny model --------------------------------------------------------------------------


def test_tiny_model_is_a_world_readable_diffusers_pipeline(model_store) -> None:
    model = model_store / "tiny-sd"
    index = json.loads((model / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    for part in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert (model / part).is_dir(), part
    total = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert 5e6 < total < 10e6
    # Every user's account reads the model store.
    for p in [model, *model.rglob("*")]:
        assert p.stat().st_mode & 0o004, f"{p} is not world-readable"
    # Built beside it under a temp name, then renamed: nothing else is left in the store.
    assert [p.name for p in model_store.iterdir()] == ["tiny-sd"]


def test_make_tiny_model_refuses_an_existing_folder(model_store) -> None:
    r = subprocess.run(
        [CLI, "--make-tiny-model", str(model_store / "tiny-sd")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert f"{model_store / 'tiny-sd'} already exists" in r.stderr


# ---- start-up --------------------------------------------------------------------------------


def test_readiness_goes_from_503_to_200_and_status_tells_the_stages(webui) -> None:
    seen = [s for s in webui.readiness if s is not None]
    assert seen[0] == 503 and seen[-1] == 200, seen
    assert set(seen) == {503, 200}
    assert webui.loading_bodies[0] == {"detail": "loading model tiny-sd"}

    options = webui.get("/sdapi/v1/options").json()
    assert options["sd_model_checkpoint"] == "tiny-sd"
    assert options["samples_save"] is True
    assert options["outdir_txt2img_samples"] == str(webui.data_dir / "outputs/txt2img-images")

    status = webui.get("/gpulab/status").json()
    assert status["stage"] == "ready"
    assert status["model"] == "tiny-sd"
    assert status["device"] in ("cpu", "cuda")
    assert status["error"] is None
    t = status["timings"]
    assert abs(t["started"] - time.time()) < START_DEADLINE + 60
    assert 0 < t["http_up"] < t["imports_done"] <= t["model_loaded"]


def test_sd_models_lists_the_model(webui, model_store) -> None:
    models = webui.get("/sdapi/v1/sd-models").json()
    assert [(m["title"], m["model_name"], m["filename"]) for m in models] == [
        ("tiny-sd", "tiny-sd", str(model_store / "tiny-sd"))
    ]


# ---- txt2img ---------------------------------------------------------------------------------


def txt2img(webui: WebUI, **body) -> dict:
    r = webui.post("/sdapi/v1/txt2img", json={"prompt": "a red fox", **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_txt2img_answers_a_png_of_the_asked_size_and_saves_it(webui) -> None:
    out = txt2img(webui, width=96, height=64, steps=2, seed=1234)
    assert len(out["images"]) == 1
    png = base64.b64decode(out["images"][0])
    assert png_size(png) == (96, 64)
    assert Image.open(io.BytesIO(png)).size == (96, 64)
    assert out["parameters"]["steps"] == 2
    info = json.loads(out["info"])
    assert info["seed"] == 1234 and info["all_seeds"] == [1234]
    assert info["sd_model_name"] == "tiny-sd"

    saved = Path(info["saved_to"])
    day = time.strftime("%Y-%m-%d")
    assert saved.parent == webui.data_dir / "outputs" / "txt2img-images" / day
    assert saved.name.endswith("-1234.png") and saved.name[:5].isdigit()
    assert saved.read_bytes() == png


def test_same_seed_draws_the_same_image_and_another_seed_another(webui) -> None:
    a = txt2img(webui, seed=42)["images"][0]
    b = txt2img(webui, seed=42)["images"][0]
    c = txt2img(webui, seed=43)["images"][0]
    assert a == b
    assert a != c
    # A random seed is reported back, so the image can be made again.
    r = txt2img(webui, seed=-1)
    seed = json.loads(r["info"])["seed"]
    assert seed >= 0
    assert txt2img(webui, seed=seed)["images"][0] == r["images"][0]


@pytest.mark.parametrize(
    ("body", "field", "allowed"),
    [
        ({"steps": 4}, "prompt", "a string"),
        ({"prompt": "x", "width": 33}, "width", "a multiple of 8 from 32 to 1024"),
        ({"prompt": "x", "steps": 0}, "steps", "an integer from 1 to 50"),
        ({"prompt": "x", "steps": "four"}, "steps", "an integer from 1 to 50"),
        ({"prompt": "x", "seed": 1.5}, "seed", "or -1 for a random seed"),
        ({"prompt": "x", "batch_size": 2}, "batch_size", "1 (one image per request)"),
        ({"prompt": "x", "hr_scale": 2}, "hr_scale", "one of the fields prompt, negative_prompt"),
        ("not an object", "body", "a JSON object"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    webui, body, field, allowed
) -> None:
    before = files_under(webui.data_dir)
    r = webui.post("/sdapi/v1/txt2img", json=body)
    assert r.status_code == 400
    detail = r.json()
    assert detail["field"] == field
    assert detail["detail"].startswith(f"{field}: ")
    assert allowed in detail["allowed"]
    assert files_under(webui.data_dir) == before


def test_invalid_json_is_refused(webui) -> None:
    r = webui.post("/sdapi/v1/txt2img", data=b"{prompt")
    assert r.status_code == 400
    assert r.json()["field"] == "body"


# ---- the queue: WebSocket and SSE --------------------------------------------------------------


def ws_job(webui: WebUI, request: dict) -> list[dict]:
    ws = websocket.create_connection(webui.ws_base + "/queue/join", timeout=60)
    try:
        ws.send(json.dumps(request))
        messages = []
        while True:
            messages.append(json.loads(ws.recv()))
            if messages[-1]["msg"] == "process_completed":
                break
        assert ws.recv() == ""  # the server closes the connection after the job
        return messages
    finally:
        ws.close()


def assert_job_messages(messages: list[dict], steps: int, size: tuple[int, int]) -> None:
    assert messages[0]["msg"] == "estimation"
    assert messages[1:-1] == [
        {"msg": "progress", "step": i, "steps": steps} for i in range(1, steps + 1)
    ]
    done = messages[-1]
    assert done["msg"] == "process_completed" and done["success"] is True
    assert png_size(base64.b64decode(done["output"]["images"][0])) == size
    assert json.loads(done["output"]["info"])["steps"] == steps


def test_websocket_queue_streams_each_step_then_the_image(webui) -> None:
    messages = ws_job(webui, {"prompt": "a lighthouse", "steps": 3, "width": 64, "height": 32})
    assert_job_messages(messages, 3, (64, 32))

    [bad] = ws_job(webui, {"prompt": "a lighthouse", "steps": 0})
    assert bad["msg"] == "process_completed" and bad["success"] is False
    assert bad["output"]["field"] == "steps" and bad["output"]["status"] == 400
    assert bad["output"]["error"].startswith("steps: got 0; allowed: an integer from 1 to 50")


def test_websocket_from_another_site_is_refused(webui) -> None:
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(
            webui.ws_base + "/queue/join", timeout=10, origin="https://evil.example"
        )
    assert e.value.status_code == 403


def test_sse_streams_the_same_messages(webui) -> None:
    r = webui.get(
        "/queue/sse", params={"prompt": "a lighthouse", "steps": "3", "seed": "7"}, stream=True
    )
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/event-stream"
    events = [line for line in r.iter_lines() if line]
    assert all(e.startswith(b"data: ") for e in events)
    assert_job_messages([json.loads(e[6:]) for e in events], 3, (64, 64))

    bad = webui.get("/queue/sse", params={"prompt": "x", "width": "33"})
    assert bad.status_code == 400 and bad.json()["field"] == "width"


def test_sse_sends_each_event_as_it_happens(webui) -> None:
    params = {"prompt": "a lighthouse", "steps": "10", "width": "128", "height": "128"}
    with webui.get("/queue/sse", params=params, stream=True) as r:
        # One byte at a time: nothing here waits for more than the server has sent.
        events = (line for line in r.iter_lines(chunk_size=1) if line)
        assert json.loads(next(events)[6:])["msg"] == "estimation"
        assert json.loads(next(events)[6:]) == {"msg": "progress", "step": 1, "steps": 10}
        # Sent while the job still runs, not buffered until its end.
        assert webui.get("/sdapi/v1/progress").json()["state"]["job_count"] == 1
        assert json.loads(list(events)[-1][6:])["msg"] == "process_completed"


def test_status_and_progress_answer_while_an_image_is_made(webui) -> None:
    steps = 10
    ws = websocket.create_connection(webui.ws_base + "/queue/join", timeout=60)
    try:
        ws.send(json.dumps({"prompt": "slow", "steps": steps, "width": 128, "height": 128}))
        assert json.loads(ws.recv())["msg"] == "estimation"
        first = json.loads(ws.recv())
        assert first == {"msg": "progress", "step": 1, "steps": steps}
        # The job runs off the event loop: both answer at once while it has steps to go.
        started = time.monotonic()
        progress = webui.get("/sdapi/v1/progress").json()
        status = webui.get("/gpulab/status").json()
        assert time.monotonic() - started < 5
        assert status["stage"] == "ready"
        assert progress["state"]["job_count"] == 1
        assert 0 < progress["progress"] <= 1
        assert progress["state"]["sampling_steps"] == steps
        while json.loads(ws.recv())["msg"] != "process_completed":
            pass
    finally:
        ws.close()
    idle = webui.get("/sdapi/v1/progress").json()
    assert idle["progress"] == 0 and idle["state"]["job_count"] == 0


def test_a_client_that_leaves_frees_the_queue_and_saves_nothing(webui) -> None:
    before = files_under(webui.data_dir)
    ws = websocket.create_connection(webui.ws_base + "/queue/join", timeout=60)
    try:
        ws.send(json.dumps({"prompt": "long", "steps": 50, "width": 256, "height": 256}))
        assert json.loads(ws.recv())["msg"] == "estimation"
        assert json.loads(ws.recv())["msg"] == "progress"
    finally:
        ws.close()
    # The remaining steps are skipped: the queue is free long before 50 steps could run.
    wait_for(
        lambda: webui.get("/sdapi/v1/progress").json()["state"]["job_count"] == 0,
        timeout=30,
        what="the abandoned job to stop",
    )
    assert files_under(webui.data_dir) == before
    assert txt2img(webui, steps=1)["images"]


# ---- user data -------------------------------------------------------------------------------


def test_userdata_encoded_slash_is_a_subfolder_and_a_literal_slash_404s(webui) -> None:
    workflow = b'{"nodes": []}'
    r = webui.post("/userdata/workflows%2Fmy.json", data=workflow)
    assert r.status_code == 200, r.text
    assert r.json() == "workflows/my.json"
    assert (webui.data_dir / "userdata" / "workflows" / "my.json").read_bytes() == workflow

    r = webui.get("/userdata/workflows%2Fmy.json")
    assert r.status_code == 200 and r.content == workflow
    # What a proxy that decodes %2F would forward: not a route at all.
    assert webui.get("/userdata/workflows/my.json").status_code == 404
    assert webui.post("/userdata/workflows/other.json", data=b"{}").status_code == 404
    assert webui.get("/userdata/workflows%2Fnone.json").status_code == 404

    r = webui.post("/userdata/workflows%2Fmy.json", params={"overwrite": "false"}, data=b"{}")
    assert r.status_code == 409
    assert (webui.data_dir / "userdata" / "workflows" / "my.json").read_bytes() == workflow


@pytest.mark.parametrize("name", ["..%2Fescape.json", "a%2F..%2F..%2Fescape.json", "%2Fetc%2Fx"])
def test_userdata_refuses_names_that_leave_the_store(webui, name) -> None:
    before = files_under(webui.data_dir.parent)
    r = webui.post(f"/userdata/{name}", data=b"x")
    assert r.status_code == 400
    assert r.json()["field"] == "file"
    assert webui.get(f"/userdata/{name}").status_code == 400
    assert files_under(webui.data_dir.parent) == before


# ---- the page and the network ------------------------------------------------------------------


def test_page_lives_under_the_subpath_with_relative_urls(webui) -> None:
    r = webui.get("", allow_redirects=False)
    assert r.status_code in (301, 302)
    assert r.headers["Location"] == f"{SUBPATH}/"
    page = webui.get("/")
    assert page.status_code == 200
    text = page.text
    assert "<title>Stable Diffusion WebUI (gpulab diffusers)</title>" in text
    assert 'id="generate"' in text and 'id="result"' in text and 'id="status"' in text
    assert "gpulab's own small WebUI on the diffusers library, not AUTOMATIC1111" in text
    assert '<strong id="model">tiny-sd</strong>' in text
    # Issue 22: the demo model's random weights are said plainly, and the hub is one click away.
    notice = text.split('id="random-weights"')[1].split("</p>")[0]
    assert "weights are random" in notice and " hidden>" not in notice[:40]
    assert 'id="hub-home" href="/hub/home"' in text
    # The app's own URLs are relative (the link home is the hub's, not the app's).
    own = text.replace('href="/hub/home"', "")
    for absolute in ('fetch("/', 'URL("/', 'src="/', 'href="/', "http://", "https://"):
        assert absolute not in own


def listening_addresses(port: int) -> list[str]:
    """Local addresses of the LISTEN sockets on ``port``, as /proc/net/tcp{,6} spell them."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hexport = local.rpartition(":")
            if state == "0A" and int(hexport, 16) == port:
                found.append(address)
    return found


def outward_address() -> str | None:
    """This machine's address on its default route, if it has one (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_listens_on_loopback_only(webui) -> None:
    assert listening_addresses(webui.port) == ["0100007F"]  # 127.0.0.1, IPv4 only
    address = outward_address()
    if address is not None:
        with pytest.raises(OSError), socket.create_connection((address, webui.port), timeout=5):
            pass


# ---- without a model -------------------------------------------------------------------------


def test_without_a_model_it_is_not_ready_and_says_where_to_put_one(tmp_path) -> None:
    """Issue 22 ("ready" means the app can do its job): with no model the readiness URL answered
    200 (the hub said "ready" and billed a WebUI that could draw nothing); it answers 409 naming
    where a model goes, and the status says failed, so that the hub ends the launch."""
    empty = tmp_path / "models"
    empty.mkdir()
    # No --subpath: jupyter-server-proxy's GRADIO_ROOT_PATH names it.
    ui = start_webui(
        tmp_path,
        [empty],
        subpath=None,
        env={"GRADIO_ROOT_PATH": "/user/bob/sd/"},
        served_at="/user/bob/sd",
    )
    try:
        ui.wait_http()
        status = wait_for(
            lambda: (s := ui.get("/gpulab/status").json())["stage"] != "starting" and s,
            timeout=START_DEADLINE,
            what="the app to look for a model",
        )
        assert status["stage"] == "failed" and status["model"] is None
        assert status["error"].startswith(f"no model in {empty}: ")
        ready = ui.get("/sdapi/v1/options")
        assert ready.status_code == 409
        assert str(empty) in ready.json()["detail"]
        assert ui.get("/sdapi/v1/sd-models").json() == []

        r = ui.post("/sdapi/v1/txt2img", json={"prompt": "x"})
        assert r.status_code == 409
        assert str(empty) in r.json()["detail"]
        assert "model_index.json" in r.json()["detail"]
        assert not ui.data_dir.exists()
    finally:
        took = ui.stop()
    assert took < 5
    assert ui.proc.returncode == 0


def test_a_model_that_fails_to_load_says_so(tmp_path) -> None:
    first, second = tmp_path / "models", tmp_path / "more-models"
    (first / "notes").mkdir(parents=True)  # no model_index.json: not a model
    (first / "broken").mkdir()
    (first / "broken" / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    (second / "an-sdxl").mkdir(parents=True)
    (second / "an-sdxl" / "model_index.json").write_text(
        '{"_class_name": "StableDiffusionXLPipeline"}'
    )
    ui = start_webui(tmp_path, [first, second])
    try:
        ui.wait_http()
        models = ui.get("/sdapi/v1/sd-models").json()
        assert [m["title"] for m in models] == ["an-sdxl", "broken"]
        # The Stable Diffusion model is the one loaded, though another sorts first.
        status = wait_for(
            lambda: (s := ui.get("/gpulab/status").json())["stage"] == "failed" and s,
            timeout=START_DEADLINE,
            what="the load to fail",
        )
        assert status["model"] == "broken" and status["error"]
        r = ui.get("/sdapi/v1/options")
        assert r.status_code == 500
        assert r.json()["detail"].startswith("model broken failed to load: ")
        assert ui.post("/sdapi/v1/txt2img", json={"prompt": "x"}).status_code == 500
    finally:
        ui.stop()


def test_sigterm_during_a_generation_exits_promptly(tmp_path, model_store) -> None:
    ui = start_webui(tmp_path, [model_store])
    ws = None
    try:
        ui.wait_ready()
        ws = websocket.create_connection(ui.ws_base + "/queue/join", timeout=60)
        # Far more work than the test waits for: the process must not wait for it either.
        ws.send(json.dumps({"prompt": "slow", "steps": 50, "width": 256, "height": 256}))
        assert json.loads(ws.recv())["msg"] == "estimation"
        assert json.loads(ws.recv())["msg"] == "progress"
    finally:
        took = ui.stop()
        if ws is not None:
            ws.close()
    assert took < 5
    assert not list((ui.data_dir / "outputs").rglob("*.png"))
