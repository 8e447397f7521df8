# shellcheck shell=bash
# What images/*/gpu-smoke-test.sh share, sourced by each (not run on its own): the options, the
# docker checks, and starting the app's container the way a user's server does (as uid 1000 with
# every capability dropped, a fresh home volume, --gpus device=N, a model folder mounted read-only
# under ~/models) until its API answers. A script sets its defaults (IMAGE GPU MODEL TIMEOUT OUT),
# then calls
#   smoke_init APP "$@"                                    # options and docker checks
#   smoke_start IMAGE PORT PREFIX START_COMMAND READY_PATH # container up, READY_PATH answering
#   ... its own checks: docker exec -i "$CONTAINER" python - "$base" ... (a script writing the
#       last generated image to /tmp/gpulab-smoke.png) ...
#   smoke_finish                                           # --out, timings, PASS
# smoke_start leaves CONTAINER, base (the app's URL inside the container), t0 (its start time),
# deadline (date +%s the test must end by) and ready (seconds until the API answered); the
# container and its volume are removed on exit, with the container's last log lines on failure.

HOME_IN=/home/jovyan
SMOKE_APP=""
CONTAINER=""
VOLUME=""
STARTED=""

log() { printf '%s smoke: %s\n' "$SMOKE_APP" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# smoke_init APP "$@": the options into IMAGE GPU MODEL TIMEOUT OUT, then the docker checks.
smoke_init() {
  SMOKE_APP=$1
  shift
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
  docker image inspect "$IMAGE" >/dev/null 2>&1 \
    || die "image $IMAGE is not on this host (gpulab images --build $SMOKE_APP)"
}

smoke_cleanup() {
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

# smoke_start IMAGE PORT PREFIX START_COMMAND READY_PATH: runs START_COMMAND PORT PREFIX MODELS in
# IMAGE, then waits for GET PREFIX/READY_PATH to answer inside the container.
smoke_start() {
  local image=$1 port=$2 prefix=$3 start=$4 ready_path=$5 src last state
  CONTAINER=gpulab-smoke-$SMOKE_APP-$$
  VOLUME=gpulab-smoke-$SMOKE_APP-home-$$
  trap smoke_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  local args=(--name "$CONTAINER" --detach --cap-drop ALL --security-opt no-new-privileges
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
  docker run "${args[@]}" "$image" "$start" "$port" "$prefix" "$HOME_IN/models" >/dev/null \
    || die "docker run failed (a GPU needs the NVIDIA driver and Container Toolkit set up for Docker)"
  STARTED=1
  log "started $image as $CONTAINER (gpu: $GPU, model: ${MODEL:-none})"

  # The app listens on the container's loopback only, so every request runs inside it.
  # shellcheck disable=SC2016  # Python, not shell
  local probe='import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=5).read()
except Exception as e:
    sys.exit(f"{type(e).__name__}: {e}")'
  base="http://127.0.0.1:$port$prefix"
  until last=$(docker exec "$CONTAINER" python -c "$probe" "$base$ready_path" 2>&1); do
    state=$(docker inspect -f '{{.State.Status}} (exit code {{.State.ExitCode}})' "$CONTAINER")
    case $state in running*) ;; *) die "the container stopped, $state, before the API answered" ;; esac
    [ "$(date +%s)" -lt "$deadline" ] || die "GET $prefix$ready_path: no 200 within ${TIMEOUT}s (last: $last)"
    sleep 2
  done
  ready=$(since "$t0")
  log "API ready ${ready}s after the container started"
}

# smoke_finish: --out gets the last generated image (when the checks made one), then PASS.
smoke_finish() {
  if [ -n "$OUT" ] && docker exec "$CONTAINER" test -f /tmp/gpulab-smoke.png; then
    docker cp "$CONTAINER:/tmp/gpulab-smoke.png" "$OUT" >/dev/null
    log "image kept in $OUT"
  fi
  log "PASS: API ready in ${ready}s; total $(since "$t0")s"
}
