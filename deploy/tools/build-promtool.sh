#!/usr/bin/env bash
# Prometheus' promtool (`promtool test rules` checks the chart's alert rules), built from
# the Go module proxy into ~/.cache/flowforge/promtool/<version>/promtool. Cached and
# idempotent; prints the binary's path on its last line. `make promtool` runs it.
set -euo pipefail
# Prometheus v3.16.0 (its Go module tags are v0.<minor*100+...>)
PROMTOOL_VERSION=v0.316.0
exec bash "$(dirname "${BASH_SOURCE[0]}")/build-go-tool.sh" promtool \
  github.com/prometheus/prometheus/cmd/promtool "$PROMTOOL_VERSION"
