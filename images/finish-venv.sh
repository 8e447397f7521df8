#!/bin/sh
# The last step of every gpulab user image (Dockerfiles and images/build-test-image.sh), run as
# root inside the image: put gpulab's launcher into the venv, then compile all of the venv's
# bytecode so that it stays valid in every container.
#
# The launcher (spawners/inside/launcher.py, stdlib only) links ~/datasets to the read-only mounts and
# skips an import that costs a second of every server start; it is copied alone rather than
# installing gpulab and its hub-side dependencies.
#
# Bytecode is checked by hash, not by source mtime: an image that goes through a tar stream (the
# registry-free test image) does not keep the mtimes pip stamped into its .pyc files, and a stale
# cache that the user cannot rewrite means every module is compiled again at every start.
# Measured in a container: `import jupyterhub.singleuser, jupyterlab` 2.3 s before, 0.8 s after.
#
# Usage: finish-venv.sh PATH/TO/launcher.py   (venv: $GPULAB_VENV, default /opt/venv)
set -eu
venv=${GPULAB_VENV:-/opt/venv}
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
mkdir -p "$site/gpulab/spawners/inside"
cp "$1" "$site/gpulab/spawners/inside/launcher.py"
: > "$site/gpulab/spawners/__init__.py"
: > "$site/gpulab/spawners/inside/__init__.py"
"$venv/bin/python" -m compileall -q -f -j0 --invalidation-mode unchecked-hash "$site"
