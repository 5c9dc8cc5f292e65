#!/usr/bin/env bash
# Builds the dev/test control plane from Go modules into a cache folder keyed by the pins:
#   kube-apiserver kube-controller-manager kube-scheduler  (k8s.io/kubernetes as a dependency, one `go build`)
#   etcd                                                   (go.etcd.io/etcd/server/v3 as a dependency)
#   kwok kwokctl                                           (sigs.k8s.io/kwok, installs directly)
# Skips everything when the folder is complete. Prints the folder as the last stdout line.
#   build.sh          build if missing, print the folder
#   build.sh --dir    print the folder only (no build)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

# The key covers every input that changes the binaries: the pins, this script and the Go version.
key="$(cat "$here/versions.env" "$here/build.sh" "$here"/k8s/go.mod "$here"/k8s/go.sum \
        "$here"/etcd/go.mod "$here"/etcd/go.sum <(go env GOVERSION) | sha256sum | cut -c1-16)"
cache="${COLOCGRPO_CACHE:-$HOME/.cache/colocgrpo}"
bin="$cache/k8s-bin/$key"

if [[ "${1:-}" == "--dir" ]]; then echo "$bin"; exit 0; fi

bins=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok kwokctl)
complete=1
for b in "${bins[@]}"; do [[ -x "$bin/$b" ]] || complete=0; done
if [[ $complete == 1 ]]; then echo "$bin"; exit 0; fi

# Build into a temporary sibling and rename at the end, so an interrupted build never
# leaves a folder that looks complete.
tmp="$cache/k8s-bin/.tmp-$key-$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

ver="$K8S_VERSION"; minor="${ver#v1.}"; minor="${minor%%.*}"
# kwokctl reads `kube-apiserver --version`, so the version must be stamped, not left as v0.0.0.
k8s_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$ver \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$ver \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
echo ">> kube-apiserver kube-controller-manager kube-scheduler $ver" >&2
(cd "$here/k8s" && go build -trimpath -ldflags "$k8s_ldflags" -o "$tmp/" \
   k8s.io/kubernetes/cmd/kube-apiserver \
   k8s.io/kubernetes/cmd/kube-controller-manager \
   k8s.io/kubernetes/cmd/kube-scheduler) >&2

echo ">> etcd $ETCD_VERSION" >&2
(cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3) >&2

echo ">> kwok kwokctl $KWOK_VERSION" >&2
GOBIN="$tmp" GOFLAGS= go install -trimpath -ldflags "-s -w" \
  "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION" >&2

rm -rf "$bin"; mv "$tmp" "$bin"; trap - EXIT
echo ">> built in $((SECONDS - start)) s: $(du -sh "$bin" | cut -f1) in $bin" >&2
echo "$bin"
