#!/usr/bin/env bash
# Builds what the dev cluster's real node runs, from Go modules, into a cache folder keyed by the pins:
#   kubelet kube-proxy  (k8s.io/kubernetes, the same pinned module as the control plane: k8s/go.mod)
#   coredns             (github.com/coredns/coredns as a library, only the plugins the node uses: coredns/)
#   pause               (the pod sandbox program: pause/)
# containerd, runc and the CNI plugins come from Debian's packages (node/host.py installs them).
# Kept apart from build.sh, so the control plane never waits for the node nor the reverse.
# Skips everything when the folder is complete. Prints the folder as the last stdout line.
#   build-node.sh          build if missing, print the folder
#   build-node.sh --dir    print the folder only (no build)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

# The key covers every input that changes the binaries: the pins, the sources, this script and the Go version.
key="$(cat "$here/versions.env" "$here/build-node.sh" "$here"/k8s/go.mod "$here"/k8s/go.sum \
        "$here"/coredns/go.mod "$here"/coredns/go.sum "$here"/coredns/main.go \
        "$here"/pause/go.mod "$here"/pause/main.go <(go env GOVERSION) | sha256sum | cut -c1-16)"
cache="${COLOCGRPO_CACHE:-$HOME/.cache/colocgrpo}"
bin="$cache/node-bin/$key"

if [[ "${1:-}" == "--dir" ]]; then echo "$bin"; exit 0; fi

bins=(kubelet kube-proxy coredns pause)
complete=1
for b in "${bins[@]}"; do [[ -x "$bin/$b" ]] || complete=0; done
if [[ $complete == 1 ]]; then echo "$bin"; exit 0; fi

# Build into a temporary sibling and rename at the end, so an interrupted build never
# leaves a folder that looks complete.
tmp="$cache/node-bin/.tmp-$key-$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

ver="$K8S_VERSION"; minor="${ver#v1.}"; minor="${minor%%.*}"
# The kubelet reports its version on the Node (status.nodeInfo.kubeletVersion): stamped as build.sh does.
k8s_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$ver \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$ver \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
echo ">> kubelet kube-proxy $ver" >&2
(cd "$here/k8s" && go build -trimpath -ldflags "$k8s_ldflags" -o "$tmp/" \
   k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy) >&2

coredns_version="$(cd "$here/coredns" && go list -m -f '{{.Version}}' github.com/coredns/coredns)"
echo ">> coredns $coredns_version" >&2
(cd "$here/coredns" && go build -trimpath -ldflags "-s -w" -o "$tmp/coredns" .) >&2

echo ">> pause" >&2
(cd "$here/pause" && go build -trimpath -ldflags "-s -w" -o "$tmp/pause" .) >&2

rm -rf "$bin"; mv "$tmp" "$bin"; trap - EXIT
echo ">> built in $((SECONDS - start)) s: $(du -sh "$bin" | cut -f1) in $bin" >&2
echo "$bin"
