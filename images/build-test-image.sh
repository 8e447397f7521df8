#!/bin/sh
# Build the small single-user image the Docker tests and benchmark use, without any registry.
#
# No container registry is reachable from CI, so this does not start `FROM` anything: it bootstraps
# a minimal Debian bookworm root file system with mmdebstrap, installs single-user wheels that were
# downloaded on the host (containers can't reach PyPI: the host trusts a CA they lack), and turns the
# tree into an image with `docker import` (there is no buildx). About a minute on a cache miss.
#
# The result is cached by its inputs: the tag is gpulab-test-singleuser:<hash of this script, the
# package pins, gpulab's launcher and any extensions/>, so an unchanged input never rebuilds, and
# with GPULAB_IMAGE_CACHE set the image is also saved there (zstd) to survive a wiped Docker.
#
# Usage: images/build-test-image.sh          prints the tag on stdout (logs on stderr)
# Needs: Debian's mmdebstrap and docker.io (dockerd running), pip on the host, root (mmdebstrap).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PIP=${PIP:-"$ROOT/.venv/bin/pip"}
[ -x "$PIP" ] || PIP="python3 -m pip"
# The image's Python is bookworm's 3.11.2; a wheel set resolved for a newer 3.11.x can fail there.
IMAGE_PYTHON=3.11.2
# Pinned to what the hub runs, so hub and server always agree on versions.
# jupyter-server-proxy: apps (catalog [apps]) run behind it, as in the real images.
PACKAGES="jupyterhub==6.1.1 jupyterlab==4.6.6 jupyter-server-proxy==4.6.0"
REPO=gpulab-test-singleuser

log() { echo "build-test-image: $*" >&2; }

# gpulab's own Jupyter extensions go into every image once they exist (extensions/NAME/pyproject.toml).
EXT_DIRS=""
for d in "$ROOT"/extensions/*/; do
  [ -f "$d/pyproject.toml" ] && EXT_DIRS="$EXT_DIRS $d"
done

inputs_hash() {
  {
    cat "$0"
    echo "$PACKAGES $IMAGE_PYTHON"
    cat "$ROOT/spawners/inside/launcher.py" "$HERE/finish-venv.sh"
    for d in $EXT_DIRS; do
      (cd "$d" && git ls-files -co --exclude-standard -z . 2>/dev/null | sort -z | xargs -0 sha256sum)
    done
  } | sha256sum | cut -c1-16
}

TAG="$REPO:$(inputs_hash)"
if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG is present"
  echo "$TAG"
  exit 0
fi
CACHE=${GPULAB_IMAGE_CACHE:-}
ARCHIVE="${CACHE:+$CACHE/$(echo "$TAG" | tr ':' '-').tar.zst}"
if [ -n "$ARCHIVE" ] && [ -f "$ARCHIVE" ]; then
  log "loading $TAG from $ARCHIVE"
  zstd -dc "$ARCHIVE" | docker load >&2
  echo "$TAG"
  exit 0
fi

log "building $TAG (cache miss)"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/wheels" "$WORK/gpulab"
# shellcheck disable=SC2086  # word splitting of the package list is intended
$PIP download -q --disable-pip-version-check --only-binary=:all: \
  --python-version "$IMAGE_PYTHON" -d "$WORK/wheels" $PACKAGES
for d in $EXT_DIRS; do
  $PIP wheel -q --disable-pip-version-check --no-deps -w "$WORK/wheels" "$d"
done
EXT_WHEELS=""
for d in $EXT_DIRS; do EXT_WHEELS="$EXT_WHEELS $(basename "$d")"; done
# The launcher and the bytecode: the same last step as every image's (images/finish-venv.sh).
cp "$ROOT/spawners/inside/launcher.py" "$HERE/finish-venv.sh" "$WORK/gpulab/"

# libstdc++6: pyzmq needs it and the essential variant lacks it. passwd: useradd.
mmdebstrap --quiet --variant=essential --include=python3-venv,passwd,libstdc++6,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook="cp -r '$WORK/wheels' \"\$1/tmp/wheels\"" \
  --customize-hook='chroot "$1" python3 -m venv /opt/venv' \
  --customize-hook="chroot \"\$1\" /opt/venv/bin/pip install -q --no-cache-dir --no-index --find-links=/tmp/wheels $PACKAGES $EXT_WHEELS" \
  --customize-hook="cp -r '$WORK/gpulab' \"\$1/tmp/gpulab\"" \
  --customize-hook='chroot "$1" sh /tmp/gpulab/finish-venv.sh /tmp/gpulab/launcher.py' \
  --customize-hook='chroot "$1" useradd -m -u 1000 -s /bin/bash jovyan' \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1/tmp/gpulab" "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  bookworm - http://deb.debian.org/debian \
| docker import \
  -c 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENV LANG=C.UTF-8' -c 'ENV SHELL=/bin/bash' -c 'USER jovyan' -c 'WORKDIR /home/jovyan' \
  -c 'EXPOSE 8888' \
  -c 'CMD ["python", "-m", "gpulab.spawners.inside.launcher"]' \
  -c 'LABEL org.opencontainers.image.title="gpulab test single-user image"' \
  -c "LABEL org.gpulab.preloads.libraries=\"$PACKAGES\"" \
  -c 'LABEL org.gpulab.preloads.models="" org.gpulab.preloads.datasets=""' \
  -c 'LABEL org.gpulab.cuda="none"' \
  - "$TAG" >&2
if [ -n "$ARCHIVE" ]; then
  mkdir -p "$CACHE"
  docker save "$TAG" | zstd -q -3 -o "$ARCHIVE.tmp" && mv "$ARCHIVE.tmp" "$ARCHIVE"
fi
log "built $TAG"
echo "$TAG"
