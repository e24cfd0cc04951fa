#!/usr/bin/env bash
# make dev-down: stop everything make dev started.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -x .venv/bin/python ]; then echo "nothing to stop (no .venv)"; exit 0; fi
exec .venv/bin/python -m flowforge.localdev.dev down "$@"
