#!/usr/bin/env bash
# make image: build the repository's Dockerfile with buildah (no Docker engine needed).
#   bash deploy/image/build.sh            # prints the image name as its last line
# The base: $FLOWFORGE_IMAGE_BASE when set (any image buildah can pull or has); else the
# official Python base (the Dockerfile's default) when it is in buildah's storage or one
# quick pull gets it; else a Debian base made with mmdebstrap (deploy/image/base.sh, cached).
# Layers are cached (buildah --layers) in FlowForge's own storage (deploy/image/buildah.sh),
# so an unchanged dependency set is not installed again and an unchanged tree rebuilds
# nothing. Environment: FLOWFORGE_IMAGE (the name, default localhost/flowforge/operator:
# <version in pyproject.toml>, the chart's repository and appVersion).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
buildah=("$here/buildah.sh")
started=$SECONDS

bash "$here/install-tools.sh"

# Every dependency or base change leaves the previous layers behind as the cache: past the
# limit, start the cache afresh (the base tarball stays; the next build takes minutes).
limit_mb=${FLOWFORGE_IMAGE_STORAGE_LIMIT_MB:-8192}
storage=${FLOWFORGE_IMAGE_CACHE:-$HOME/.cache/flowforge/image}/storage
if [ -d "$storage" ] && [ "$(du -sm "$storage" | cut -f1)" -gt "$limit_mb" ]; then
    echo "==> $storage is over ${limit_mb} MiB: clearing buildah's layer cache" >&2
    "${buildah[@]}" rm --all >/dev/null
    "${buildah[@]}" rmi --all --force >/dev/null
fi

version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$repo/pyproject.toml")
image=${FLOWFORGE_IMAGE:-localhost/flowforge/operator:$version}
official=docker.io/library/$(sed -n 's/^ARG BASE_IMAGE=//p' "$repo/Dockerfile")

if [ -n "${FLOWFORGE_IMAGE_BASE:-}" ]; then
    base=$FLOWFORGE_IMAGE_BASE
elif "${buildah[@]}" inspect --type image "$official" >/dev/null 2>&1; then
    base=$official
elif timeout 20 "${buildah[@]}" pull --quiet --retry 0 "$official" >/dev/null 2>&1; then
    base=$official
else
    echo "==> $official cannot be pulled here: building on a Debian base (mmdebstrap)" >&2
    base=$(bash "$here/base.sh")
fi

# The CAs this machine trusts, for pip behind a TLS-inspecting proxy (a build secret: used
# by the RUN steps, never stored in the image).
secrets=()
ca_file=${FLOWFORGE_IMAGE_CA_FILE:-/etc/ssl/certs/ca-certificates.crt}
if [ -s "$ca_file" ]; then
    secrets=(--secret "id=ca-certificates,src=$ca_file")
fi

echo "==> buildah bud $image (base $base)" >&2
"${buildah[@]}" bud --quiet --isolation chroot --layers --network host "${secrets[@]}" \
    --build-arg "BASE_IMAGE=$base" --tag "$image" --file "$repo/Dockerfile" "$repo" >/dev/null
size=$("${buildah[@]}" images --format '{{.Size}}' "$image")
echo "    built in $((SECONDS - started)) s ($size)" >&2
echo "$image"
