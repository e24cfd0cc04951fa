"""The CRDs against the real apiserver, through the kubectl built with it."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest

from flowforge.localdev.controlplane import Cluster, kubectl, kubectl_json

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("flowforge_crds")]

DEFINITION: dict[str, Any] = {
    "apiVersion": "flowforge.io/v1alpha1",
    "kind": "WorkflowDefinition",
    "metadata": {"name": "nightly-etl-v1"},
    "spec": {
        "workflow": "nightly-etl",
        "version": 1,
        "description": "Nightly ETL",
        "taskTypes": {"python": {"image": "python:3.12-slim", "command": ["python", "-m", "s"]}},
        "tasks": [
            {"key": "extract", "type": "python", "config": {"source": {"table": "orders"}}},
            {"key": "load", "type": "python", "dependsOn": ["extract"], "retries": 2},
            {"key": "undo-extract", "type": "python", "compensateFor": "extract"},
        ],
    },
}

RUN: dict[str, Any] = {
    "apiVersion": "flowforge.io/v1alpha1",
    "kind": "WorkflowRun",
    "metadata": {"name": "nightly-etl-run"},
    "spec": {"workflow": "nightly-etl", "version": 1, "parameters": {"date": "2026-11-30"}},
}


def _apply(
    cluster: Cluster, namespace: str, manifest: dict[str, Any], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return kubectl(
        cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest), check=check
    )


def _rejected(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> str:
    completed = _apply(cluster, namespace, manifest, check=False)
    assert completed.returncode != 0, f"accepted: {completed.stdout}"
    stderr: str = completed.stderr
    return stderr


def test_a_valid_definition_is_accepted_as_written(cluster: Cluster, namespace: str) -> None:
    _apply(cluster, namespace, DEFINITION)
    stored = kubectl_json(cluster, "get", "wfd", "nightly-etl-v1", "-n", namespace)
    assert stored["spec"] == DEFINITION["spec"]  # nothing pruned, config preserved


def test_an_unknown_field_is_rejected_by_name(cluster: Cluster, namespace: str) -> None:
    manifest = copy.deepcopy(DEFINITION)
    manifest["spec"]["tasks"][1]["retrys"] = 3
    stderr = _rejected(cluster, namespace, manifest)
    assert "unknown field" in stderr
    assert "spec.tasks[1].retrys" in stderr


def test_a_wrong_type_is_rejected_by_name(cluster: Cluster, namespace: str) -> None:
    manifest = copy.deepcopy(DEFINITION)
    manifest["spec"]["version"] = "one"
    stderr = _rejected(cluster, namespace, manifest)
    assert "spec.version" in stderr
    assert "integer" in stderr


def test_a_run_with_a_bad_workflow_name_is_rejected(cluster: Cluster, namespace: str) -> None:
    manifest = copy.deepcopy(RUN)
    manifest["spec"]["workflow"] = "Not_A_Name"
    stderr = _rejected(cluster, namespace, manifest)
    assert "spec.workflow" in stderr


def test_get_prints_the_run_columns(cluster: Cluster, namespace: str) -> None:
    _apply(cluster, namespace, RUN)
    status = {
        "status": {
            "phase": "Running",
            "progress": "3/4",
            "counts": {"total": 4, "succeeded": 3, "running": 1},
        }
    }
    kubectl(
        cluster,
        "patch",
        "wfr",
        "nightly-etl-run",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )
    lines = kubectl(cluster, "get", "wfr", "-n", namespace).stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "WORKFLOW",
        "VERSION",
        "PHASE",
        "PROGRESS",
        "PRIORITY",
        "QUEUE",
        "POSITION",
        "AGE",
    ]
    assert lines[1].split()[:5] == ["nightly-etl-run", "nightly-etl", "1", "Running", "3/4"]


def test_get_flowforge_lists_both_kinds_with_columns(cluster: Cluster, namespace: str) -> None:
    _apply(cluster, namespace, DEFINITION)
    _apply(cluster, namespace, RUN)
    kubectl(
        cluster,
        "patch",
        "wfd",
        "nightly-etl-v1",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"taskCount": 3}}),
    )
    output = kubectl(cluster, "get", "flowforge", "-n", namespace).stdout
    assert "workflowdefinition.flowforge.io/nightly-etl-v1" in output
    assert "workflowrun.flowforge.io/nightly-etl-run" in output
    headers = [line.split() for line in output.splitlines() if line.startswith("NAME")]
    assert ["NAME", "WORKFLOW", "VERSION", "TASKS", "AGE"] in headers
    definition_row = next(line for line in output.splitlines() if "nightly-etl-v1" in line)
    assert definition_row.split()[1:4] == ["nightly-etl", "1", "3"]


def test_explain_teaches_the_tasks_field(cluster: Cluster) -> None:
    output = kubectl(cluster, "explain", "workflowdefinition.spec.tasks").stdout
    assert "The tasks: forward tasks and their compensators" in output
    assert "dependsOn" in output
    assert "compensateFor" in output
    assert "Keys of the forward tasks that must succeed before this one starts" in output
    run_output = kubectl(cluster, "explain", "workflowrun.status.tasks").stdout
    assert "Per-task summary" in run_output


def test_a_runs_workflow_cannot_change(cluster: Cluster, namespace: str) -> None:
    _apply(cluster, namespace, RUN)
    manifest = copy.deepcopy(RUN)
    manifest["spec"]["workflow"] = "other-workflow"
    assert "spec.workflow is immutable" in _rejected(cluster, namespace, manifest)


def test_a_runs_version_cannot_change_once_set(cluster: Cluster, namespace: str) -> None:
    _apply(cluster, namespace, RUN)
    manifest = copy.deepcopy(RUN)
    manifest["spec"]["version"] = 2
    assert "spec.version cannot change once set" in _rejected(cluster, namespace, manifest)
    del manifest["spec"]["version"]
    assert "spec.version cannot change once set" in _rejected(cluster, namespace, manifest)


def test_a_runs_missing_version_may_be_filled_in(cluster: Cluster, namespace: str) -> None:
    manifest = copy.deepcopy(RUN)
    del manifest["spec"]["version"]
    _apply(cluster, namespace, manifest)
    kubectl(
        cluster,
        "patch",
        "wfr",
        "nightly-etl-run",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"version": 3}}),
    )
    stored = kubectl_json(cluster, "get", "wfr", "nightly-etl-run", "-n", namespace)
    assert stored["spec"]["version"] == 3


def test_a_run_may_be_cancelled(cluster: Cluster, namespace: str) -> None:
    _apply(cluster, namespace, RUN)
    kubectl(
        cluster,
        "patch",
        "wfr",
        "nightly-etl-run",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"cancel": True}}),
    )
    stored = kubectl_json(cluster, "get", "wfr", "nightly-etl-run", "-n", namespace)
    assert stored["spec"]["cancel"] is True


def test_a_definitions_spec_is_immutable(cluster: Cluster, namespace: str) -> None:
    _apply(cluster, namespace, DEFINITION)
    manifest = copy.deepcopy(DEFINITION)
    manifest["spec"]["tasks"][1]["retries"] = 5
    stderr = _rejected(cluster, namespace, manifest)
    assert "the spec of a WorkflowDefinition is immutable" in stderr
    unchanged = kubectl_json(cluster, "get", "wfd", "nightly-etl-v1", "-n", namespace)
    assert unchanged["spec"]["tasks"][1]["retries"] == 2
