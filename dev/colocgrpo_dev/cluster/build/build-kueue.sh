#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue, pinned in kueue/go.mod) into a cache folder
# keyed by the pins, next to the CRDs and webhook manifests of the very same module version:
#   <cache>/kueue-bin/<key>/kueue
#   <cache>/kueue-bin/<key>/crd/      (config/components/crd: bases/ and the conversion-webhook patches)
#   <cache>/kueue-bin/<key>/webhook/  (config/components/webhook: manifests.yaml)
# Kept apart from build.sh's control plane, so bumping one never rebuilds the other.
# Skips everything when the folder is complete. Prints the folder as the last stdout line.
#   build-kueue.sh          build if missing, print the folder
#   build-kueue.sh --dir    print the folder only (no build)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

# The key covers every input that changes the output: the module pins, this script and the Go version.
key="$(cat "$here"/kueue/go.mod "$here"/kueue/go.sum "$here/build-kueue.sh" <(go env GOVERSION) \
        | sha256sum | cut -c1-16)"
cache="${COLOCGRPO_CACHE:-$HOME/.cache/colocgrpo}"
out="$cache/kueue-bin/$key"

if [[ "${1:-}" == "--dir" ]]; then echo "$out"; exit 0; fi
if [[ -x "$out/kueue" && -f "$out/crd/kustomization.yaml" && -f "$out/webhook/manifests.yaml" ]]; then
  echo "$out"; exit 0
fi

# Build into a temporary sibling and rename at the end, so an interrupted build never
# leaves a folder that looks complete.
tmp="$cache/kueue-bin/.tmp-$key-$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

version="$(cd "$here/kueue" && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)"
echo ">> kueue $version" >&2
(cd "$here/kueue" && go build -trimpath \
   -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version" \
   -o "$tmp/kueue" sigs.k8s.io/kueue/cmd/kueue) >&2

# The manifests come from the module cache copy of the same version (go.sum verified it).
src="$(cd "$here/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
cp -r "$src/config/components/crd" "$src/config/components/webhook" "$tmp/"
chmod -R u+w "$tmp"

rm -rf "$out"; mv "$tmp" "$out"; trap - EXIT
echo ">> built in $((SECONDS - start)) s: $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
