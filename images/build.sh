#!/bin/sh
# Build every catalog image (base, pytorch, sd-webui, comfyui, teaching) on a machine with internet.
# Same as `gpulab images --build --all`; extra arguments go to it (e.g. slugs, --catalog FILE).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GPULAB="$ROOT/.venv/bin/gpulab"
[ -x "$GPULAB" ] || GPULAB=gpulab
exec "$GPULAB" images --build --all "$@"
