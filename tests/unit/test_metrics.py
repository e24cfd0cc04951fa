"""Every metric the operator defines is in the registry that /metrics serves."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from flowforge.operator import metrics


def test_every_metric_of_the_module_is_served() -> None:
    defined = {
        name: value for name, value in vars(metrics).items() if isinstance(value, MetricWrapperBase)
    }
    assert "JOB_CREATION_FAILURES" in defined
    served = {family.name for family in metrics.REGISTRY.collect()}  # what /metrics walks
    unserved = [
        name
        for name, metric in defined.items()
        if any(family.name not in served for family in metric.describe())
    ]
    assert unserved == []


def test_job_creation_failures_are_exported_by_kind() -> None:
    metrics.JOB_CREATION_FAILURES.labels("delayed").inc()
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'flowforge_job_creation_failures_total{kind="delayed"}' in text
