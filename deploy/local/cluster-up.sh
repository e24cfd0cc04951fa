#!/usr/bin/env bash
# Start the local control plane (building the binaries first if needed).
# Usage: deploy/local/cluster-up.sh [--dir STATE_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
exec "$python" -m flowforge.localdev.controlplane up --build "$@"
