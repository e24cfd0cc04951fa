#!/usr/bin/env bash
# Builds the local control plane from Go modules: kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl (Kubernetes), etcd, kwok,
# kwokctl and helm. Idempotent: binaries are cached outside the repository in
#   ${FLOWFORGE_CACHE:-~/.cache/flowforge}/controlplane-<versions>/bin
# and a binary already present at the pinned version is not rebuilt.
# Prints the bin directory on its last line of stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${FLOWFORGE_CACHE:-$HOME/.cache/flowforge}"
tag="k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
dest="$cache_root/controlplane-$tag"
bin="$dest/bin"
work="$dest/work"
mkdir -p "$bin" "$work"

export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || fail "go is not installed; the control plane is built from Go modules (Go >= 1.24 needed)"

started=$SECONDS
kube_minor="${KUBE_VERSION#v1.}"; kube_minor="${kube_minor%%.*}"
staging_version="v0.${KUBE_VERSION#v1.}"

build_kubernetes() {
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl) missing=0
  for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing=1; done
  [ "$missing" = 0 ] && { log "kubernetes $KUBE_VERSION: cached"; return; }
  log "kubernetes $KUBE_VERSION: building ${want[*]} (the slow part: 20-40 min cold on 2 cores)"
  local mod="$work/kubernetes"
  mkdir -p "$mod"
  (
    cd "$mod"
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    [ -f "$gomod" ] || fail "could not download k8s.io/kubernetes@$KUBE_VERSION from the module proxy"
    {
      echo "module flowforge.local/controlplane"
      echo
      echo "go 1.24"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      # k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces
      # them with ./staging paths; point each at its published release instead.
      grep -E '=> \./staging/src/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
    } > go.mod
    cat > tools.go <<'GO'
//go:build tools

package tools
GO
    local ldver="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$kube_minor -X k8s.io/component-base/version.gitTreeState=clean"
    go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBE_VERSION" "k8s.io/kubernetes/cmd/kube-scheduler@$KUBE_VERSION" "k8s.io/kubernetes/cmd/kubectl@$KUBE_VERSION" \
      || fail "go get of k8s.io/kubernetes $KUBE_VERSION commands failed (try a neighbouring served release in versions.env)"
    go build -mod=mod -trimpath -ldflags "-s -w $ldver" -o "$bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
      || fail "go build of kubernetes $KUBE_VERSION failed"
  )
  log "kubernetes $KUBE_VERSION: built"
}

build_etcd() {
  [ -x "$bin/etcd" ] && { log "etcd $ETCD_VERSION: cached"; return; }
  log "etcd $ETCD_VERSION: building"
  local mod="$work/etcd"
  mkdir -p "$mod"
  (
    cd "$mod"
    printf 'module flowforge.local/etcd\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > go.mod
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" || fail "go get etcd $ETCD_VERSION failed"
    go build -mod=mod -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3 \
      || fail "go build of etcd $ETCD_VERSION failed"
  )
  log "etcd $ETCD_VERSION: built"
}

build_plain() { # name package version
  local name="$1" pkg="$2" version="$3"
  [ -x "$bin/$name" ] && { log "$name $version: cached"; return; }
  log "$name $version: building"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "$pkg@$version" || fail "go install $pkg@$version failed"
  log "$name $version: built"
}

build_etcd
build_plain kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
build_plain kwokctl sigs.k8s.io/kwok/cmd/kwokctl "$KWOK_VERSION"
build_plain helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
build_kubernetes

log "control plane ready in $bin ($((SECONDS - started)) s)"
echo "$bin"
