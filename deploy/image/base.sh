#!/usr/bin/env bash
# The Debian base image for `make image` when no registry base can be pulled: a minimal
# Debian bookworm root filesystem made with mmdebstrap from Debian's own packages (python3,
# python3-venv, ca-certificates), imported into buildah's storage as
#   localhost/flowforge-base:bookworm-<key>
# where <key> is a hash of everything that determines it (this script and its package list).
# The root filesystem tarball is cached in $FLOWFORGE_IMAGE_CACHE (default
# ~/.cache/flowforge/image), so the next run, or the next `make test`, reuses it; delete
# base-*.tar there to take newer Debian packages (security updates). Prints the image name.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${FLOWFORGE_IMAGE_CACHE:-$HOME/.cache/flowforge/image}
buildah=("$here/buildah.sh")

suite=bookworm
packages=python3,python3-venv,ca-certificates
mirrors=(
    "deb http://deb.debian.org/debian $suite main"
    "deb http://deb.debian.org/debian $suite-updates main"
    "deb http://deb.debian.org/debian-security $suite-security main"
)
key=$(cat "$0" | sha256sum | cut -c1-12)
image=localhost/flowforge-base:$suite-$key
tarball=$cache/base-$suite-$key.tar

if "${buildah[@]}" inspect --type image "$image" >/dev/null 2>&1; then
    echo "$image"
    exit 0
fi
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
    echo "==> mmdebstrap $suite ($packages) -> $tarball" >&2
    started=$SECONDS
    partial=$cache/partial-$$-$(basename "$tarball")
    trap 'rm -f "$partial"' EXIT
    # No documentation, manuals or translations, no apt lists or caches: the image only runs
    # Python. The Debian base has no /usr/bin/python; the virtual environment provides it.
    # merged /usr set up by mmdebstrap's own hook, so that the usrmerge package (and the
    # full perl it needs) stays out.
    mmdebstrap --quiet --variant=minbase --include="$packages" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
        "$suite" "$partial" "${mirrors[@]}" >&2
    mv "$partial" "$tarball"
    trap - EXIT
    echo "    made in $((SECONDS - started)) s ($(du -h "$tarball" | cut -f1))" >&2
fi
echo "==> importing $tarball as $image" >&2
container=$("${buildah[@]}" from scratch)
trap '"${buildah[@]}" rm "$container" >/dev/null' EXIT
"${buildah[@]}" add --quiet "$container" "$tarball" / >&2
"${buildah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/sh \
    --label "org.opencontainers.image.description=Debian $suite ($packages), made by mmdebstrap" \
    "$container"
"${buildah[@]}" commit --quiet --rm "$container" "$image" >/dev/null
trap - EXIT
echo "$image"
