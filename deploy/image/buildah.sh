#!/usr/bin/env bash
# buildah on FlowForge's own container storage under $FLOWFORGE_IMAGE_CACHE (default
# ~/.cache/flowforge/image/storage): the base image and buildah's layer cache live next to
# the cached control plane, so the next `make image` (and CI, which keeps ~/.cache) reuses
# them. Usage as buildah's: deploy/image/buildah.sh images
set -euo pipefail
cache=${FLOWFORGE_IMAGE_CACHE:-$HOME/.cache/flowforge/image}
exec buildah --root "$cache/storage" --runroot "${FLOWFORGE_IMAGE_RUNROOT:-/run/flowforge-image}" \
    --storage-driver overlay "$@"
