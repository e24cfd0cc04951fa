#!/usr/bin/env bash
# The Debian packages `make image` needs: buildah (builds and runs the image without a
# Docker engine, --isolation chroot) and mmdebstrap (makes the Debian base when no registry
# base can be pulled). Idempotent and quiet when everything is installed already.
set -euo pipefail

packages=(buildah mmdebstrap uidmap)
missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$package")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "deploy/image/install-tools.sh: needs root to install: ${missing[*]}" >&2
    exit 1
fi
echo "==> apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=600 -qq "$@"; }
apt_get update
apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null
