#!/usr/bin/env bash
# Stop the local control plane and remove its state.
# Usage: deploy/local/cluster-down.sh [--dir STATE_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
exec "$python" -m flowforge.localdev.controlplane down "$@"
