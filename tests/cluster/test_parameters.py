"""Runs shaped by their parameters, on the real control plane with the operator and the
webhooks on one store: typed parameters refused at ``kubectl apply`` naming the parameter,
defaults recorded; a task whose ``when`` is false never gets a Job, its dependents run, the
run succeeds and the task shows ConditionFalse; ``when`` true runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.domain.api import API_VERSION, DEFINITION_KIND, RUN_KIND
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.reuse import find_run_by_name
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.plugins.webhooks import WebhookServer, webhooks_on_store

pytestmark = pytest.mark.cluster

STEP = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
DEFINITION: dict[str, Any] = {
    "workflow": "shaped",
    "version": 1,
    "taskTypes": {"step": STEP},
    "parameters": [
        {
            "name": "mode",
            "type": "string",
            "enum": ["full", "incremental"],
            "default": "incremental",
        },
        {"name": "regions", "type": "array", "items": {"type": "string"}, "default": ["eu"]},
        {"name": "batchSize", "type": "integer", "minimum": 1, "default": 500},
        {"name": "owner", "type": "string", "required": True},
    ],
    "tasks": [
        {"key": "extract", "type": "step"},
        {
            "key": "migrate",
            "type": "step",
            "dependsOn": ["extract"],
            "when": "params.mode == 'full'",
        },
        {"key": "load", "type": "step", "dependsOn": ["migrate"]},
        {"key": "undo-migrate", "type": "step", "compensateFor": "migrate"},
    ],
}


@pytest.fixture
def store_webhooks(cluster: Cluster, store_dsn: str, tmp_path: Path) -> Iterator[WebhookServer]:
    """The webhooks on the operator's store, enforced by the apiserver."""
    with webhooks_on_store(cluster, directory=tmp_path, dsn=store_dsn) as server:
        yield server


def apply(cluster: Cluster, namespace: str, kind: str, name: str, spec: dict[str, Any]) -> str:
    """``kubectl apply`` of one object; its stderr when refused, "" when applied."""
    document = {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    result = kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(document), check=False)
    return "" if result.returncode == 0 else result.stderr


def run_spec(**parameters: Any) -> dict[str, Any]:
    return {"workflow": "shaped", "parameters": parameters}


async def test_parameters_are_checked_at_apply_and_when_shapes_the_run(
    cluster: Cluster,
    store_webhooks: WebhookServer,
    operator: OperatorProcess,
    driver: RunDriver,
) -> None:
    namespace = driver.namespace
    assert apply(cluster, namespace, DEFINITION_KIND, "shaped-v1", DEFINITION) == ""

    misspelled = apply(cluster, namespace, RUN_KIND, "r-bad-1", run_spec(owner="ops", regoins=[]))
    assert "spec.parameters.regoins: unknown parameter" in misspelled, misspelled
    mistyped = apply(cluster, namespace, RUN_KIND, "r-bad-2", run_spec(owner="ops", batchSize="9"))
    assert "spec.parameters.batchSize: must be of type integer, not string" in mistyped, mistyped
    missing = apply(cluster, namespace, RUN_KIND, "r-bad-3", run_spec(mode="full"))
    assert "spec.parameters.owner: required parameter" in missing, missing

    # when false: migrate never gets a Job, load runs after extract, the run succeeds
    assert apply(cluster, namespace, RUN_KIND, "r-incr", run_spec(owner="ops")) == ""
    # when true: migrate runs
    assert apply(cluster, namespace, RUN_KIND, "r-full", run_spec(owner="ops", mode="full")) == ""
    incremental = await driver.wait_phase("r-incr", {"Succeeded", "Failed"}, operator=operator)
    full = await driver.wait_phase("r-full", {"Succeeded", "Failed"}, operator=operator)
    assert incremental["status"]["phase"] == "Succeeded", incremental["status"]
    assert full["status"]["phase"] == "Succeeded", full["status"]

    jobs = {job.metadata.labels["flowforge.io/task"] for job in driver.jobs("r-incr")}
    assert jobs == {"extract", "load"}
    assert {job.metadata.labels["flowforge.io/task"] for job in driver.jobs("r-full")} == {
        "extract",
        "migrate",
        "load",
    }
    tasks = {task["name"]: task for task in incremental["status"]["tasks"]}
    assert tasks["migrate"]["state"] == "skipped"
    assert tasks["migrate"]["message"].startswith("ConditionFalse")
    counts = incremental["status"]["counts"]
    assert (counts["conditionSkipped"], counts["skipped"], counts["succeeded"]) == (1, 0, 2)
    assert incremental["status"]["progress"] == "2/2"

    recorded = await find_run_by_name(driver.pool, namespace=namespace, name="r-incr")
    assert recorded is not None
    assert dict(recorded.parameters) == {
        "mode": "incremental",
        "regions": ["eu"],
        "batchSize": 500,
        "owner": "ops",
    }
