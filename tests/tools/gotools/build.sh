#!/usr/bin/env bash
# Builds one of the tests' small Go programs (tests/tools/gotools/<name>: its own go.mod
# and go.sum, modules from the Go module proxy) into
#   ${FLOWFORGE_CACHE:-~/.cache/flowforge}/<name>-<digest of its sources>/<name>
# and prints that path on its last line. Idempotent: a binary of the same sources is not
# rebuilt. Used by tests/tools/go_tools.py (the kstatus reader, the gopher-lua harness).
set -euo pipefail

name="${1:?usage: build.sh NAME}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/$name"
[ -f "$src/go.mod" ] || { echo "[gotools] ERROR: no Go module at $src" >&2; exit 1; }
command -v go >/dev/null || { echo "[gotools] ERROR: go is not installed; $name is built from the Go module proxy" >&2; exit 1; }

digest="$(cat "$src"/go.mod "$src"/go.sum "$src"/*.go | sha256sum | cut -c1-12)"
dest="${FLOWFORGE_CACHE:-$HOME/.cache/flowforge}/$name-$digest"
if [ -x "$dest/$name" ]; then
  echo "$dest/$name"
  exit 0
fi
mkdir -p "$dest"
printf '[gotools %s] building %s (a few minutes cold)\n' "$(date +%H:%M:%S)" "$name" >&2
(
  cd "$src"
  CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
    go build -trimpath -o "$dest/$name.tmp.$$" .
)
mv "$dest/$name.tmp.$$" "$dest/$name"  # atomic: two test workers may build at once
echo "$dest/$name"
