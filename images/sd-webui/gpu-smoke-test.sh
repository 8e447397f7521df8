#!/usr/bin/env bash
# GPU smoke test of the sd-webui image (AUTOMATIC1111): run on a GPU host with the NVIDIA driver,
# the NVIDIA Container Toolkit and the image built (`gpulab images --build sd-webui`, which needs
# internet). It starts the image's app the way a user's server does (start-sd-webui PORT PREFIX
# MODELS, as uid 1000 with every capability dropped, a fresh home volume, a model folder mounted
# read-only under ~/models), then checks, through the full proxied path (/sd-webui/...):
#   - the API answers (GET /sdapi/v1/options), and only on 127.0.0.1 inside the container;
#   - a checkpoint is offered (GET /sdapi/v1/sd-models);
#   - txt2img (4 steps, 512x512) returns a PNG, twice (the first one loads the model), and saves
#     it under the user's home (~/sd-webui/outputs).
# It prints the timings (container start -> API ready, each generation) and removes its container
# and volume on exit; on failure it exits non-zero with the container's last log lines.
#
# Usage: images/sd-webui/gpu-smoke-test.sh [--model DIR] [--image IMAGE] [--gpu N|UUID|none]
#                                          [--timeout SECONDS] [--out FILE.png]
#   --model DIR   a folder of .safetensors/.ckpt checkpoints (a catalog model of kind
#                 "checkpoint"), mounted at ~/models/NAME. Needed unless the image was built with
#                 SD_MODEL_URL (a preloaded checkpoint).
#   --image       default gpulab/sd-webui:0.1.0
#   --gpu         the card to request (docker run --gpus device=N), default 0; "none" requests no
#                 GPU (only to try this script against a stand-in image)
#   --timeout     seconds the whole test may take, default 900
#   --out FILE    keep the last generated image there
set -euo pipefail

IMAGE=gpulab/sd-webui:0.1.0
GPU=0
MODEL=""
TIMEOUT=900
OUT=""
PORT=7860
PREFIX=/sd-webui

# shellcheck source=SCRIPTDIR/../gpu-smoke-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gpu-smoke-lib.sh"
smoke_init sd-webui "$@"
smoke_start "$IMAGE" "$PORT" "$PREFIX" start-sd-webui /sdapi/v1/options

# The rest: one Python run inside the container (its stdin is the script).
docker exec -i "$CONTAINER" python - "$base" "$PORT" "$HOME_IN" "$((deadline - $(date +%s)))" <<'PY'
import base64, glob, json, os, socket, sys, time, urllib.error, urllib.request

base, port, home, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
end = time.monotonic() + budget


def fail(msg):
    sys.exit(f"sd-webui smoke: FAIL: {msg}")


def call(path, body=None):
    left = end - time.monotonic()
    if left <= 0:
        fail(f"out of time before {path}")
    req = urllib.request.Request(
        base + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=left) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        fail(f"{path}: HTTP {e.code}: {e.read()[:800].decode(errors='replace')}")
    except OSError as e:
        fail(f"{path}: {e}")


# Listening on loopback only: the container's own address must refuse the port.
addr = socket.gethostbyname(socket.gethostname())
if not addr.startswith("127."):
    try:
        socket.create_connection((addr, port), timeout=3).close()
        fail(f"the WebUI answers on {addr}:{port}, not on 127.0.0.1 only")
    except ConnectionRefusedError:
        print(f"sd-webui smoke: {addr}:{port} refused (loopback only)", file=sys.stderr)

models = call("/sdapi/v1/sd-models")
if not models:
    fail("no checkpoint offered: pass --model DIR (a folder of .safetensors) or build with SD_MODEL_URL")
print(f"sd-webui smoke: {len(models)} checkpoint(s): {', '.join(m['title'] for m in models[:5])}",
      file=sys.stderr)

png = b""
for run in ("first (loads the model)", "second"):
    t = time.monotonic()
    res = call("/sdapi/v1/txt2img", {
        "prompt": "a red apple on a wooden table, photo", "negative_prompt": "",
        "steps": 4, "width": 512, "height": 512, "seed": 1234, "batch_size": 1,
        "sampler_name": "Euler a", "save_images": True,
    })
    took = time.monotonic() - t
    images = res.get("images") or []
    if not images:
        fail(f"txt2img returned no image: {json.dumps(res)[:500]}")
    png = base64.b64decode(images[0].split(",", 1)[-1])
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        fail(f"txt2img returned {len(png)} bytes that are not a PNG: {png[:16]!r}")
    print(f"sd-webui smoke: txt2img {run}: {took:.1f}s, PNG of {len(png)} bytes", file=sys.stderr)

saved = glob.glob(os.path.join(home, "sd-webui", "outputs", "**", "*.png"), recursive=True)
if not saved:
    fail(f"the images were not saved under {home}/sd-webui/outputs (the user's home)")
print(f"sd-webui smoke: saved in the home: {saved[-1]}", file=sys.stderr)
with open("/tmp/gpulab-smoke.png", "wb") as f:
    f.write(png)
PY

smoke_finish
