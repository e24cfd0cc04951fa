#!/usr/bin/env bash
# Jaeger's all-in-one program (a trace store receiving OTLP, queried over HTTP), built from
# the Go module proxy into ~/.cache/flowforge/jaeger/<version>/jaeger. Cached and
# idempotent; prints the binary's path on its last line. `make jaeger` runs it;
# tests/cluster/test_tracing.py sends a run's spans to it.
set -euo pipefail
JAEGER_VERSION=v1.76.0
exec bash "$(dirname "${BASH_SOURCE[0]}")/build-go-tool.sh" jaeger \
  github.com/jaegertracing/jaeger/cmd/jaeger "$JAEGER_VERSION"
