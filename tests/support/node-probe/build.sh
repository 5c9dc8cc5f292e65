#!/usr/bin/env bash
# Builds node-probe (this folder: a static program that reports what a pod sees) into a
# cache folder keyed by its sources and the Go version, for the real node's tests (tests/devcluster).
# Skips the build when the binary is there. Prints the binary's path as the last stdout line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

key="$(cat "$here/build.sh" "$here"/go.mod "$here"/main.go \
        <(go env GOVERSION) | sha256sum | cut -c1-16)"
cache="${COLOCGRPO_CACHE:-$HOME/.cache/colocgrpo}"
bin="$cache/node-probe-bin/$key/node-probe"
if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi

mkdir -p "$cache/node-probe-bin"
tmp="$(mktemp -d "$cache/node-probe-bin/.tmp-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo ">> node-probe" >&2
(cd "$here" && go build -trimpath -ldflags "-s -w" -o "$tmp/node-probe" .) >&2
mkdir -p "$(dirname "$bin")"
mv "$tmp/node-probe" "$bin"
echo "$bin"
