"""Prometheus metrics of the operator, served on 127.0.0.1 by default."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()

RUNS_BY_PHASE = Gauge(
    "flowforge_runs", "Runs known to this operator by phase", ["phase"], registry=REGISTRY
)
RUNS_FINISHED = Counter(
    "flowforge_runs_finished_total", "Runs that reached a final phase", ["phase"], registry=REGISTRY
)
TRACES_DROPPED = Counter(
    "flowforge_traces_dropped_total",
    "Finished runs' traces not sent: the trace exporter's queue was full, or the operator "
    "stopped before they went out",
    registry=REGISTRY,
)
TASK_OUTCOMES = Counter(
    "flowforge_task_outcomes_total",
    "Recorded attempt outcomes",
    ["role", "reason"],
    registry=REGISTRY,
)
JOB_CREATION_FAILURES = Counter(
    "flowforge_job_creation_failures_total",
    "Job creations the apiserver did not take: refused for good (the attempt failed) or "
    "delayed (tried again later); and policy: the namespace's policy refused the Job before "
    "it was sent (the attempt failed PolicyRefused)",
    ["kind"],
    registry=REGISTRY,
)
JOBS_CREATED = Counter(
    "flowforge_jobs_created_total",
    "Jobs created (AlreadyExists excluded)",
    ["role"],
    registry=REGISTRY,
)
FORGED_JOBS = Counter(
    "flowforge_forged_jobs_total",
    "Jobs that claimed a run's attempt but are not the Job the operator created for it "
    "(another namespace, another uid, another controller): ignored; and (act mount) a run's "
    "ConfigMap re-created by someone else, never mounted, or a running Pod's files annotation "
    "changed, its attempt failed",
    # what the forgery would have caused: outcome, vanished, cleanup, adopt, admission, mount
    ["act"],
    registry=REGISTRY,
)
FORGED_PODS = Counter(
    "flowforge_forged_pods_total",
    "Succeeded Pods with FlowForge's labels that the Job controller would not count for the "
    "attempt's Job: ignored (the Job watch decides). untracked also counts a Pod of the "
    "run's Job first seen after the Job controller had counted it (after a re-list)",
    ["reason"],  # orphan, label, uid, namespace, untracked
    registry=REGISTRY,
)
POD_SUCCESSES = Counter(
    "flowforge_pod_successes_total",
    "Attempts' successes read from their Pods (before their Jobs' status said so)",
    registry=REGISTRY,
)
KUEUE_ADMISSIONS = Counter(
    "flowforge_kueue_admissions_total",
    "Kueue Jobs admitted (unsuspended) and evicted (suspended again) by Kueue",
    ["event"],  # admitted, evicted
    registry=REGISTRY,
)
HANDOFF_LATENCY = Histogram(
    "flowforge_handoff_latency_seconds",
    "From a task's release (its dependencies satisfied, or a retry due) to its Job created",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "flowforge_reconcile_errors_total", "Errors in the reconciler", registry=REGISTRY
)
RECONCILE_FIXES = Counter(
    "flowforge_reconcile_fixes_total",
    "Things the reconciler found and fixed",
    ["kind"],
    registry=REGISTRY,
)
STORE_LATENCY = Histogram(
    "flowforge_store_latency_seconds",
    "Duration of store transactions",
    ["operation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
    registry=REGISTRY,
)
CACHED_RUNS = Gauge(
    "flowforge_cached_runs",
    "Runs this operator keeps anything of in memory (its active runs: a finished run's go)",
    registry=REGISTRY,
)
CACHED_DEFINITION_TASKS = Gauge(
    "flowforge_cached_definition_tasks",
    "Tasks of the definitions kept in the bounded definitions cache",
    registry=REGISTRY,
)
STATUS_PENDING = Gauge(
    "flowforge_status_writes_pending",
    "Runs whose status is marked for re-projection or being written",
    registry=REGISTRY,
)
STATUS_UNCHANGED = Counter(
    "flowforge_status_unchanged_total",
    "Status projections not patched: equal to the last one patched",
    registry=REGISTRY,
)
LEADER = Gauge("flowforge_leader", "1 while this operator holds the lease", registry=REGISTRY)
RECONCILE_LAST_PASS = Gauge(
    "flowforge_reconcile_last_pass_timestamp_seconds",
    "When this operator last completed a reconciler pass (Unix time; 0: never)",
    registry=REGISTRY,
)
QUEUE_OLDEST_WAIT = Gauge(
    "flowforge_queue_oldest_wait_seconds",
    "How long the longest-queued run has waited (0: none queued), at the last pass",
    registry=REGISTRY,
)
NOTICES = Counter(
    "flowforge_notices_total",
    "Events posted on runs, by reason (CompensationFailed: a rollback halted)",
    ["reason"],
    registry=REGISTRY,
)
STORE_UP = Gauge(
    "flowforge_store_up",
    "1 while the database answered the readiness check within its bound, else 0",
    registry=REGISTRY,
)
FAILURES = Counter(
    "flowforge_failures_total",
    "Handlers, deferred work and reconciler repairs that did not complete, by what went "
    "wrong: refused (the input is wrong), deposed (another operator leads), infrastructure "
    "(the database or the apiserver did not answer), bug (anything else)",
    ["kind"],
    registry=REGISTRY,
)

# The series that alerts take an increase() of exist from the start, at zero: a counter
# series that first appears at 1 shows no increase (charts/flowforge/files/prometheus-rules).
NOTICES.labels("CompensationFailed")
for _act in ("outcome", "vanished", "cleanup", "adopt", "admission", "mount"):
    FORGED_JOBS.labels(_act)


@contextmanager
def store_timer(operation: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        STORE_LATENCY.labels(operation).observe(time.perf_counter() - started)


def serve(*, host: str, port: int) -> None:
    """Serve /metrics; the host defaults to loopback in the settings."""
    start_http_server(port, addr=host, registry=REGISTRY)
