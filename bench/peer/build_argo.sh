#!/usr/bin/env bash
# Builds Argo Workflows' workflow-controller from the Go module proxy, for bench/bench_peer.py
# only (never shipped, never part of make test). Idempotent: the binary is cached outside the
# repository in
#   ${FLOWFORGE_CACHE:-~/.cache/flowforge}/argo-<version>/bin/workflow-controller
# and not rebuilt when present. Prints the binary's path on its last line of stdout.
#
# One change at build time (the module's files stay untouched): the controller's health
# server listens on ":6060" (every interface; no flag or setting moves it), and the bench's
# rule is that every server binds 127.0.0.1 only, so the binary is built from the module's
# own cmd/workflow-controller/main.go with that one address replaced.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${FLOWFORGE_CACHE:-$HOME/.cache/flowforge}"
dest="$cache_root/argo-$ARGO_VERSION"
binary="$dest/bin/workflow-controller-loopback"
module="github.com/argoproj/argo-workflows/v4"

log() { printf '[build-argo %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '[build-argo] ERROR: %s\n' "$*" >&2; exit 1; }

if [ -x "$binary" ]; then
  log "workflow-controller $ARGO_VERSION: cached"
  echo "$binary"
  exit 0
fi
command -v go >/dev/null || fail "go is not installed; Argo's controller is built from its Go module"
export GOFLAGS="-buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log "workflow-controller $ARGO_VERSION: downloading $module@$ARGO_VERSION"
source_dir="$(go mod download -json "$module@$ARGO_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[ -d "$source_dir/cmd/workflow-controller" ] || fail "could not download $module@$ARGO_VERSION"

# A throwaway main module beside the cache: the module's main.go with the one address
# replaced, requiring the module itself, so every other package is the module's own
# (and already in the build cache after a plain `go install` of the same version).
src="$dest/loopback-src"
rm -rf "$src" && mkdir -p "$src" "$dest/bin"
main="$source_dir/cmd/workflow-controller/main.go"
sed 's/http\.ListenAndServe(":6060"/http.ListenAndServe("127.0.0.1:6060"/' "$main" > "$src/main.go"
grep -q 'ListenAndServe("127.0.0.1:6060"' "$src/main.go" \
  || fail "the health server's address in $main changed: review the loopback patch"
go_line="$(grep -m1 '^go ' "$source_dir/go.mod")"
printf 'module flowforge.local/argo-loopback\n\n%s\n\nrequire %s %s\n' \
  "$go_line" "$module" "$ARGO_VERSION" > "$src/go.mod"
cp "$source_dir/go.sum" "$src/go.sum"

log "workflow-controller $ARGO_VERSION: building (about 4 minutes cold on 2 cores, more when loaded)"
(cd "$src" && go build -mod=mod -o "$binary.tmp" .)
mv "$binary.tmp" "$binary"
log "workflow-controller $ARGO_VERSION: built $binary"
echo "$binary"
