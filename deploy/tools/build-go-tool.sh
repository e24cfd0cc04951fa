#!/usr/bin/env bash
# Builds one Go program from the Go module proxy into a cache outside the repository:
#   ${FLOWFORGE_CACHE:-~/.cache/flowforge}/<tool>/<version>/<binary>
# Idempotent: nothing is rebuilt when the binary is there. Prints the binary's path on its
# last line. Used by build-promtool.sh and build-jaeger.sh (their versions are pinned there).
#   build-go-tool.sh TOOL PACKAGE VERSION [LDFLAGS]
set -euo pipefail

tool="$1" package="$2" version="$3" ldflags="${4:-}"
binary="${package##*/}"

cache_root="${FLOWFORGE_CACHE:-$HOME/.cache/flowforge}"
dest="$cache_root/$tool/$version"

export CGO_ENABLED=0
export GOFLAGS="-buildvcs=false"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

log() { printf '[build-%s %s] %s\n' "$tool" "$(date +%H:%M:%S)" "$*" >&2; }
fail() { printf '[build-%s] ERROR: %s\n' "$tool" "$*" >&2; exit 1; }

command -v go >/dev/null || fail "go is not installed; $tool is built from its Go module"

if [ -x "$dest/$binary" ]; then
  log "$tool $version: cached"
  echo "$dest/$binary"
  exit 0
fi

started=$SECONDS
mkdir -p "$dest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "$tool $version: building $package (minutes on 2 cores)"
# `go install pkg@version` refuses modules whose go.mod has replace directives; a throwaway
# main module that requires the tool's module builds it the same way either way.
(
  cd "$work"
  go mod init flowforge.local/build-"$tool" >/dev/null 2>&1
  go get "$package@$version"
  go build -trimpath -ldflags "-s -w $ldflags" -o "$work/$binary" "$package"
) || fail "building $package@$version failed"
mv "$work/$binary" "$dest/$binary"
log "$tool $version: ready in $dest ($((SECONDS - started)) s)"
echo "$dest/$binary"
