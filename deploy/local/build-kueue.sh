#!/usr/bin/env bash
# Builds the Kueue controller manager from the Go module proxy and keeps its
# CRDs and webhook manifests (from the same module) beside it. Idempotent: cached
# outside the repository in
#   ${FLOWFORGE_CACHE:-~/.cache/flowforge}/kueue-<version>/{bin/kueue,crds/,webhooks.yaml}
# and not rebuilt when present. Prints the kueue directory on its last line.
# tests/plugins/kueue.py runs it against the test control plane.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${FLOWFORGE_CACHE:-$HOME/.cache/flowforge}"
dest="$cache_root/kueue-$KUEUE_VERSION"
bin="$dest/bin"
crds="$dest/crds"

export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[build-kueue %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '[build-kueue] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || fail "go is not installed; Kueue is built from its Go module"

if [ -x "$bin/kueue" ] && [ -f "$dest/webhooks.yaml" ] && [ -n "$(ls "$crds"/*.yaml 2>/dev/null)" ]; then
  log "kueue $KUEUE_VERSION: cached"
  echo "$dest"
  exit 0
fi

started=$SECONDS
mkdir -p "$bin" "$crds"
if [ ! -x "$bin/kueue" ]; then
  log "kueue $KUEUE_VERSION: building (about 4 minutes on 2 cores)"
  GOBIN="$bin" go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" || fail "go install sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION failed"
fi
moddir="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[ -d "$moddir/config/components/crd/bases" ] || fail "no CRDs in the sigs.k8s.io/kueue@$KUEUE_VERSION module ($moddir)"
[ -f "$moddir/config/components/webhook/manifests.yaml" ] || fail "no webhook manifests in $moddir"
cp "$moddir"/config/components/crd/bases/*.yaml "$crds/"
cp "$moddir/config/components/webhook/manifests.yaml" "$dest/webhooks.yaml"
chmod u+w "$crds"/*.yaml "$dest/webhooks.yaml"
log "kueue $KUEUE_VERSION: ready in $dest ($((SECONDS - started)) s)"
echo "$dest"
