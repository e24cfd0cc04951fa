#!/usr/bin/env bash
# make dev: FlowForge locally against a real control plane (see flowforge.localdev.dev).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/python -m flowforge.localdev.dev up "$@"
