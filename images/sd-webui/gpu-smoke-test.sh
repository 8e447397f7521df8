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
HOME_IN=/home/jovyan

log() { printf 'sd-webui smoke: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

while [ $# -gt 0 ]; do
  case $1 in
    --model) MODEL=${2:?--model needs a folder}; shift 2 ;;
    --image) IMAGE=${2:?--image needs a value}; shift 2 ;;
    --gpu) GPU=${2:?--gpu needs a value}; shift 2 ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
case $TIMEOUT in '' | *[!0-9]*) die "--timeout takes whole seconds, not $TIMEOUT" ;; esac
command -v docker >/dev/null || die "no docker command"
docker image inspect "$IMAGE" >/dev/null 2>&1 || die "image $IMAGE is not on this host (gpulab images --build sd-webui)"

CONTAINER=gpulab-smoke-sd-webui-$$
VOLUME=gpulab-smoke-sd-webui-home-$$
STARTED=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" -ne 0 ] && [ -n "$STARTED" ]; then
    log "last lines of the container's log:"
    docker logs --tail 60 "$CONTAINER" 2>&1 | sed 's/^/  | /' >&2 || true
  fi
  docker rm -f "$CONTAINER" >/dev/null 2>&1 || true
  docker volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

args=(--name "$CONTAINER" --detach --cap-drop ALL --security-opt no-new-privileges
  --shm-size 2g --volume "$VOLUME:$HOME_IN")
if [ "$GPU" != none ]; then
  args+=(--gpus "device=$GPU")
fi
if [ -n "$MODEL" ]; then
  [ -d "$MODEL" ] || die "--model $MODEL is not a folder"
  src=$(cd "$MODEL" && pwd -P)
  args+=(--volume "$src:$HOME_IN/models/$(basename "$src"):ro")
fi

docker volume create "$VOLUME" >/dev/null
t0=$(now)
deadline=$(($(date +%s) + TIMEOUT))
docker run "${args[@]}" "$IMAGE" start-sd-webui "$PORT" "$PREFIX" "$HOME_IN/models" >/dev/null \
  || die "docker run failed (a GPU needs the NVIDIA driver and Container Toolkit set up for Docker)"
STARTED=1
log "started $IMAGE as $CONTAINER (gpu: $GPU, model: ${MODEL:-none})"

# The app listens on the container's loopback only, so every request runs inside it.
# shellcheck disable=SC2016  # Python, not shell
PROBE='import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=5).read()
except Exception as e:
    sys.exit(f"{type(e).__name__}: {e}")'
base="http://127.0.0.1:$PORT$PREFIX"
until last=$(docker exec "$CONTAINER" python -c "$PROBE" "$base/sdapi/v1/options" 2>&1); do
  state=$(docker inspect -f '{{.State.Status}} (exit code {{.State.ExitCode}})' "$CONTAINER")
  case $state in running*) ;; *) die "the container stopped, $state, before the API answered" ;; esac
  [ "$(date +%s)" -lt "$deadline" ] || die "GET $PREFIX/sdapi/v1/options: no 200 within ${TIMEOUT}s (last: $last)"
  sleep 2
done
ready=$(since "$t0")
log "API ready ${ready}s after the container started"

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

if [ -n "$OUT" ]; then
  docker cp "$CONTAINER:/tmp/gpulab-smoke.png" "$OUT" >/dev/null
  log "image kept in $OUT"
fi
log "PASS: API ready in ${ready}s; total $(since "$t0")s"
