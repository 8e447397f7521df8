#!/usr/bin/env bash
# GPU smoke test of the comfyui image: run on a GPU host with the NVIDIA driver, the NVIDIA
# Container Toolkit and the image built (`gpulab images --build comfyui`, which needs internet).
# It starts the image's app the way a user's server does (start-comfyui PORT PREFIX MODELS, as
# uid 1000 with every capability dropped, a fresh home volume, a model folder mounted read-only
# under ~/models), then checks, through the full proxied path (/comfyui/...):
#   - GET /system_stats answers, lists a CUDA device, and only on 127.0.0.1 inside the container;
#   - a workflow saved as /api/userdata/workflows%2F... lands in ~/comfyui/user;
#   - with --model: ComfyUI offers the model (as a checkpoint, or as a diffusers folder), and a
#     4-step 512x512 workflow, queued twice (the first run loads the model), yields a PNG that
#     /view returns and that is saved in ~/comfyui/output.
# It prints the timings (container start -> API ready, each run) and removes its container and
# volume on exit; on failure it exits non-zero with the container's last log lines.
#
# Usage: images/comfyui/gpu-smoke-test.sh [--model DIR] [--image IMAGE] [--gpu N|UUID|none]
#                                         [--timeout SECONDS] [--out FILE.png]
#   --model DIR   a catalog model folder (checkpoint files, or a diffusers folder holding
#                 model_index.json), mounted at ~/models/NAME. Without it only the API is checked.
#   --image       default gpulab/comfyui:0.1.0
#   --gpu         the card to request (docker run --gpus device=N), default 0; "none" requests no
#                 GPU (only to try this script against a stand-in image)
#   --timeout     seconds the whole test may take, default 900
#   --out FILE    keep the last generated image there
set -euo pipefail

IMAGE=gpulab/comfyui:0.1.0
GPU=0
MODEL=""
TIMEOUT=900
OUT=""
PORT=8188
PREFIX=/comfyui

# shellcheck source=SCRIPTDIR/../gpu-smoke-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gpu-smoke-lib.sh"
smoke_init comfyui "$@"
smoke_start "$IMAGE" "$PORT" "$PREFIX" start-comfyui /system_stats

want_gpu=1
[ "$GPU" = none ] && want_gpu=0
want_model=0
[ -n "$MODEL" ] && want_model=1
# The rest: one Python run inside the container (its stdin is the script).
docker exec -i "$CONTAINER" python - "$base" "$PORT" "$HOME_IN" "$((deadline - $(date +%s)))" \
  "$want_gpu" "$want_model" <<'PY'
import json, os, socket, sys, time, urllib.error, urllib.parse, urllib.request

base, port, home, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
want_gpu, want_model = sys.argv[5] == "1", sys.argv[6] == "1"
end = time.monotonic() + budget


def say(msg):
    print(f"comfyui smoke: {msg}", file=sys.stderr)


def fail(msg):
    sys.exit(f"comfyui smoke: FAIL: {msg}")


def call(path, body=None, raw=False):
    left = end - time.monotonic()
    if left <= 0:
        fail(f"out of time before {path}")
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=left) as r:
            out = r.read()
            return out if raw else json.loads(out)
    except urllib.error.HTTPError as e:
        fail(f"{path}: HTTP {e.code}: {e.read()[:800].decode(errors='replace')}")
    except OSError as e:
        fail(f"{path}: {e}")


# Listening on loopback only: the container's own address must refuse the port.
addr = socket.gethostbyname(socket.gethostname())
if not addr.startswith("127."):
    try:
        socket.create_connection((addr, port), timeout=3).close()
        fail(f"ComfyUI answers on {addr}:{port}, not on 127.0.0.1 only")
    except ConnectionRefusedError:
        say(f"{addr}:{port} refused (loopback only)")

stats = call("/system_stats")
devices = stats.get("devices") or []
say("devices: " + (", ".join(f"{d.get('name')} ({d.get('type')})" for d in devices) or "none"))
if want_gpu and not any(d.get("type") == "cuda" for d in devices):
    fail("no CUDA device in /system_stats: the card did not reach ComfyUI")

# A saved workflow: its name's '/' travels as %2F, and it must land in the user's home.
call("/api/userdata/workflows%2Fgpulab-smoke.json", b"{}")
saved_wf = os.path.join(home, "comfyui", "user", "default", "workflows", "gpulab-smoke.json")
if not os.path.isfile(saved_wf):
    fail(f"a workflow saved through /api/userdata/workflows%2F... is not at {saved_wf}")
say(f"workflow saved in the home: {saved_wf}")


def choices(node, name):
    spec = call(f"/object_info/{node}")[node]["input"]["required"][name]
    if isinstance(spec[0], list):
        return spec[0]
    return (spec[1] or {}).get("options", []) if spec[0] == "COMBO" else []


checkpoints = choices("CheckpointLoaderSimple", "ckpt_name")
diffusers = choices("DiffusersLoader", "model_path")
say(f"checkpoints: {checkpoints[:5]}; diffusers folders: {diffusers[:5]}")
if checkpoints:
    loader = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoints[0]}}
elif diffusers:
    loader = {"class_type": "DiffusersLoader", "inputs": {"model_path": diffusers[0]}}
elif want_model:
    fail("ComfyUI offers no model from ~/models (extra_model_paths.yaml written by start-comfyui)")
else:
    say("no --model: generation not tried")
    sys.exit(0)


def workflow(seed):
    return {
        "1": loader,
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red apple on a wooden table, photo", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "positive": ["2", 0], "negative": ["3", 0], "latent_image": ["4", 0],
            "seed": seed, "steps": 4, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal",
            "denoise": 1.0}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "gpulab-smoke"}},
    }


png = b""
# A new seed the second time: ComfyUI would otherwise answer from its cache without sampling.
for run, seed in (("first (loads the model)", 1234), ("second", 1235)):
    t = time.monotonic()
    pid = call("/prompt", {"prompt": workflow(seed), "client_id": "gpulab-smoke"})["prompt_id"]
    while True:
        entry = call(f"/history/{pid}").get(pid)
        status = (entry or {}).get("status") or {}
        if status.get("completed") or status.get("status_str") == "error":
            break
        time.sleep(0.5)
    took = time.monotonic() - t
    if status.get("status_str") != "success":
        fail(f"the workflow failed: {json.dumps(status.get('messages'))[:1500]}")
    images = entry["outputs"]["7"]["images"]
    img = images[0]
    png = call("/view?" + urllib.parse.urlencode(img), raw=True)
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        fail(f"/view returned {len(png)} bytes that are not a PNG: {png[:16]!r}")
    on_disk = os.path.join(home, "comfyui", "output", img.get("subfolder", ""), img["filename"])
    if not os.path.isfile(on_disk):
        fail(f"the image is not in the user's home: no {on_disk}")
    say(f"run {run}: {took:.1f}s, PNG of {len(png)} bytes, saved as {on_disk}")

with open("/tmp/gpulab-smoke.png", "wb") as f:
    f.write(png)
PY

smoke_finish
