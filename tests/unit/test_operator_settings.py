"""The operator reads every tunable the Helm chart passes it (no value is silently ignored)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flowforge.operator.settings import OperatorSettings

CHART_DEPLOYMENT = (
    Path(__file__).resolve().parents[2]
    / "charts"
    / "flowforge"
    / "templates"
    / "operator-deployment.yaml"
)


def test_every_tunable_is_read_from_the_environment() -> None:
    settings = OperatorSettings.from_environment(
        {
            "FLOWFORGE_DSN": "postgresql://x",
            "FLOWFORGE_NAMESPACES": "a,b",
            "FLOWFORGE_JOB_CREATION_QPS": "7",
            "FLOWFORGE_JOB_CREATION_BURST": "9",
            "FLOWFORGE_KUBE_API_QPS": "11",
            "FLOWFORGE_KUBE_API_BURST": "13",
            "FLOWFORGE_KUBE_API_THREADS": "3",
            "FLOWFORGE_EVENT_WORKERS": "5",
            "FLOWFORGE_LOG_FORMAT": "JSON",
            "FLOWFORGE_RECONCILE_INTERVAL": "2.5",
            "FLOWFORGE_JOB_TTL": "-1",
            "FLOWFORGE_STORE_POOL_SIZE": "4",
            "FLOWFORGE_EVENT_WORKER_IDLE": "0.5",
        }
    )
    assert settings.namespaces == ("a", "b")
    assert (settings.job_creation_qps, settings.job_creation_burst) == (7.0, 9)
    assert (settings.kube_api_qps, settings.kube_api_burst) == (11.0, 13)
    assert (settings.kube_api_threads, settings.event_workers) == (3, 5)
    assert settings.event_worker_idle_seconds == 0.5
    assert settings.log_format == "json"
    assert settings.reconcile_interval_seconds == 2.5
    assert settings.job_ttl_seconds == -1.0
    assert settings.store_pool_size == 4


def test_a_bad_log_format_names_the_variable() -> None:
    with pytest.raises(ValueError, match="FLOWFORGE_LOG_FORMAT must be one of text, json"):
        OperatorSettings.from_environment({"FLOWFORGE_LOG_FORMAT": "xml"})


def test_the_chart_passes_only_variables_the_operator_reads() -> None:
    import inspect

    from flowforge.operator import settings as settings_module

    passed = set(re.findall(r"name: (FLOWFORGE_[A-Z_]+)", CHART_DEPLOYMENT.read_text()))
    read = set(re.findall(r'"(FLOWFORGE_[A-Z_]+)"', inspect.getsource(settings_module)))
    assert passed, "the chart passes FLOWFORGE_* variables"
    assert passed - read == set(), "the chart sets variables the operator ignores"
