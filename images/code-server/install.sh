#!/bin/sh
# code-server (VS Code in the browser, the catalog's `vscode` app) from its npm package, for the
# local spawner: installed in VENV/code-server and linked as VENV/bin/code-server, where the
# local spawner looks for an app's command. `make install` runs it; images install code-server
# from its release instead (images/pytorch/Dockerfile).
#
# Usage: sh images/code-server/install.sh VENV
#
# Needs Node.js 18 or 20 with npm, a C++ toolchain (native modules), libkrb5-dev and Debian's
# ripgrep: code-server's VS Code fetches ripgrep from GitHub's releases in its postinstall, unless
# that download is in the cache it reads first; Debian's rg is put there, so nothing but npm's
# registry is reached.
set -eu
venv=$(cd "$1" && pwd)
node_major=$(node -p 'process.versions.node.split(".")[0]')
# The newest releases for the Node.js here (code-server 4.91+ needs Node 22).
case "$node_major" in
  18|19) version=${CODE_SERVER_VERSION:-4.89.1} ;;
  *) version=${CODE_SERVER_VERSION:-4.90.3} ;;
esac
rg=$(command -v rg) || { echo "ripgrep is needed (apt-get install ripgrep)"; exit 1; }

cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
mkdir "$cache/rg"
cp "$rg" "$cache/rg/rg"
asset=ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz
case "$(uname -m)" in
  aarch64) asset=ripgrep-v13.0.0-10-aarch64-unknown-linux-musl.tar.gz ;;
esac
tar czf "$cache/$asset" -C "$cache/rg" rg
# @vscode/ripgrep's cache: TMPDIR/vscode-ripgrep-cache-VERSION/ASSET (its version is not known
# before the nested install runs: every 1.x a VS Code of this age uses).
export TMPDIR="$cache"
for v in 1.15.9 1.15.10 1.15.11 1.15.12 1.15.13 1.15.14; do
  mkdir -p "$cache/vscode-ripgrep-cache-$v"
  cp "$cache/$asset" "$cache/vscode-ripgrep-cache-$v/"
done

prefix="$venv/code-server"
rm -rf "$prefix"
mkdir -p "$prefix"
# Newer Node.js headers declare finalizers const: the pinned node-addon-api needs -fpermissive.
# code-server's postinstall refuses to run as root without unsafe-perm.
CXXFLAGS="${CXXFLAGS:-} -fpermissive" npm_config_unsafe_perm=true \
  npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "code-server@$version"
ln -sf "$prefix/node_modules/.bin/code-server" "$venv/bin/code-server"
# Every user's account runs it: readable and searchable by all, writable by root alone.
chmod -R go-w,a+rX "$prefix"
HOME="$cache" "$venv/bin/code-server" --version >/dev/null
echo "code-server $version installed: $venv/bin/code-server"
