#!/usr/bin/env bash
# Builds promql-selectors (this folder: Prometheus' own PromQL parser, as a Go module dependency) into a
# cache folder keyed by its sources and the Go version, for the dashboard test (tests/chart/test_dashboard.py).
# Skips the build when the binary is there. Prints the binary's path as the last stdout line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

key="$(cat "$here/build.sh" "$here"/go.mod "$here"/go.sum "$here"/main.go \
        <(go env GOVERSION) | sha256sum | cut -c1-16)"
cache="${COLOCGRPO_CACHE:-$HOME/.cache/colocgrpo}"
bin="$cache/promql-bin/$key/promql-selectors"
if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi

mkdir -p "$cache/promql-bin"
tmp="$(mktemp -d "$cache/promql-bin/.tmp-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo ">> promql-selectors (github.com/prometheus/prometheus/promql/parser)" >&2
(cd "$here" && go build -trimpath -ldflags "-s -w" -o "$tmp/promql-selectors" .) >&2
mkdir -p "$(dirname "$bin")"
mv "$tmp/promql-selectors" "$bin"
echo "$bin"
