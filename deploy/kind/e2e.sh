#!/usr/bin/env bash
# End-to-end check on kind, for machines with Docker (not run in CI: our CI has no Docker).
#   make e2e-kind            # or: bash deploy/kind/e2e.sh
# Builds the image, creates a kind cluster, loads the image, installs the chart with the
# bundled PostgreSQL, applies examples/etl-diamond.yaml and waits for the run to succeed.
# Needs docker, kind, kubectl and helm on PATH. Environment:
#   KIND_CLUSTER  cluster name (default flowforge-e2e; an existing one is reused)
#   KEEP_CLUSTER  1 keeps the cluster afterwards (default: deleted when this script made it)
#   TIMEOUT       seconds to wait for the run (default 300)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cluster=${KIND_CLUSTER:-flowforge-e2e}
image=flowforge/operator:e2e
release_namespace=flowforge-system
workflow_namespace=flowforge-e2e
run=etl-2026-11-30
timeout=${TIMEOUT:-300}
context="kind-${cluster}"
created_cluster=0

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is required on PATH" >&2; exit 2; }
done

diagnose() {
  echo "---- diagnostics" >&2
  kubectl --context "$context" get pods,jobs -A -l app.kubernetes.io/part-of=flowforge >&2 || true
  kubectl --context "$context" -n "$workflow_namespace" get workflowruns,jobs,pods >&2 || true
  kubectl --context "$context" -n "$workflow_namespace" get events --sort-by=.lastTimestamp >&2 || true
  kubectl --context "$context" -n "$release_namespace" logs deployment/flowforge-operator \
    --all-containers --tail=100 >&2 || true
  kubectl --context "$context" -n "$release_namespace" logs deployment/flowforge-webhook \
    --all-containers --tail=50 >&2 || true
}

cleanup() {
  local status=$?
  if [[ $status -ne 0 ]]; then diagnose; fi
  if [[ $created_cluster -eq 1 && "${KEEP_CLUSTER:-0}" != 1 ]]; then
    kind delete cluster --name "$cluster" || true
  fi
  exit "$status"
}
trap cleanup EXIT

echo "==> building $image"
docker build -t "$image" "$repo"

if kind get clusters | grep -qx "$cluster"; then
  echo "==> reusing kind cluster $cluster"
else
  echo "==> creating kind cluster $cluster"
  kind create cluster --name "$cluster" --config "$repo/deploy/kind/kind-config.yaml" --wait 120s
  created_cluster=1
fi
kind load docker-image "$image" --name "$cluster"

echo "==> installing the chart"
helm --kube-context "$context" upgrade --install flowforge "$repo/charts/flowforge" \
  --namespace "$release_namespace" --create-namespace \
  --set image.repository=flowforge/operator --set image.tag=e2e --set image.pullPolicy=Never \
  --set database.bundled.enabled=true \
  --set operator.replicas=1 --set webhook.replicas=1 \
  --set webhook.clientAuth.acceptAnyClient=true \
  --wait --timeout 10m

echo "==> running examples/etl-diamond.yaml"
kubectl --context "$context" create namespace "$workflow_namespace" --dry-run=client -o yaml \
  | kubectl --context "$context" apply -f -
kubectl --context "$context" -n "$workflow_namespace" apply -f "$repo/examples/etl-diamond.yaml"

deadline=$((SECONDS + timeout))
phase=""
while (( SECONDS < deadline )); do
  phase=$(kubectl --context "$context" -n "$workflow_namespace" get workflowrun "$run" \
    -o jsonpath='{.status.phase}' 2>/dev/null || true)
  case "${phase,,}" in
    succeeded)
      kubectl --context "$context" -n "$workflow_namespace" get workflowruns
      echo "==> e2e-kind passed: run $run succeeded"
      exit 0 ;;
    failed|cancelled|canceled)
      echo "e2e-kind: run $run ended $phase" >&2
      exit 1 ;;
  esac
  sleep 3
done
echo "e2e-kind: run $run not finished after ${timeout}s (phase '${phase}')" >&2
exit 1
