"""The operator publishes what admission admitted and the apiserver stored, and nothing else.

A run applied in the same `kubectl apply -f` as its definition (as GitOps does, and as
examples/etl-diamond.yaml is written) is pinned at admission to the stored, not yet published
version and runs to the end: the operator publishes the definition from its watch or, if it
sees the run first, from the stored object. A published version stays immutable after its
object is deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from flowforge.kube.client import KubeClient
from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, kubectl, kubectl_json
from flowforge.operator.publishing import PendingPublisher
from flowforge.store.connection import Pool
from flowforge.store.definitions import list_versions
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.plugins.webhooks import WebhookServer, start_operator
from tests.support.admission import apply, definition, names_of
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.store]

EXAMPLE = repo_root() / "examples" / "etl-diamond.yaml"


async def run_example_to_the_end(
    cluster: Cluster, namespace: str, webhook_store: Pool, driver: RunDriver, process: Any
) -> None:
    run = await driver.wait_phase(
        "etl-2026-11-30", {"Succeeded", "succeeded"}, timeout=120, operator=process
    )
    assert run["spec"]["version"] == 1  # pinned at admission, before anything was published
    assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == [1]
    stored = kubectl_json(cluster, "get", "workflowdefinition", "etl-v1", "-n", namespace)
    assert stored.get("status", {}).get("message") == "published", stored.get("status")


@pytest.mark.parametrize(
    "operator_first", [True, False], ids=["operator-running", "operator-later"]
)
async def test_a_run_applied_with_its_definition_runs_to_the_end(
    cluster: Cluster,
    engine_namespace: str,
    admission_webhooks: WebhookServer,
    webhook_store: Pool,
    operators: Callable[..., OperatorProcess],
    kube_api: k8s.ApiClient,
    operator_first: bool,
) -> None:
    process = (
        await start_operator(operators, webhook_store, admission_webhooks)
        if operator_first
        else None
    )
    applied = kubectl(cluster, "apply", "-n", engine_namespace, "-f", str(EXAMPLE))
    assert "workflowrun.flowforge.io/etl-2026-11-30 created" in applied.stdout
    if process is None:
        # nothing publishes while no operator runs; the run must wait, not be refused
        assert await list_versions(webhook_store, namespace=engine_namespace, workflow="etl") == []
        process = await start_operator(operators, webhook_store, admission_webhooks)
    driver = RunDriver(api=kube_api, namespace=engine_namespace, pool=webhook_store)
    await run_example_to_the_end(cluster, engine_namespace, webhook_store, driver, process)


async def test_the_pending_publisher_publishes_stored_objects_only(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer, webhook_store: Pool
) -> None:
    kube = KubeClient.connect(kubeconfig=str(cluster.kubeconfig), threads=2)
    try:
        publish = PendingPublisher(pool=webhook_store, kube=kube, namespace_uid=kube.namespace_uid)
        assert await publish(namespace=namespace, workflow="etl") is False
        assert apply(cluster, namespace, definition(), dry_run=True).returncode == 0
        assert await publish(namespace=namespace, workflow="etl") is False  # nothing stored
        for version in (1, 2):
            manifest = definition(name=f"etl-v{version}", version=version, description=f"{version}")
            assert apply(cluster, namespace, manifest).returncode == 0
        assert await publish(namespace=namespace, workflow="etl") is True
        assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == [1, 2]
    finally:
        kube.close()


async def test_deleting_a_published_definition_does_not_free_its_version(
    cluster: Cluster,
    engine_namespace: str,
    admission_webhooks: WebhookServer,
    webhook_store: Pool,
    operators: Callable[..., OperatorProcess],
) -> None:
    await start_operator(operators, webhook_store, admission_webhooks)
    assert apply(cluster, engine_namespace, definition()).returncode == 0

    async def published() -> bool:
        return await list_versions(webhook_store, namespace=engine_namespace, workflow="etl") == [1]

    await wait_until(published, timeout=60, what="the operator to publish etl v1")
    kubectl(cluster, "delete", "workflowdefinition", "etl-v1", "-n", engine_namespace)
    changed = definition(image="registry.example/attacker:latest")
    for dry_run in (True, False):
        refused = apply(cluster, engine_namespace, changed, dry_run=dry_run)
        assert refused.returncode != 0
        assert "version 1 is already published with different content" in refused.stderr
        assert "publish a new version" in refused.stderr
    assert names_of(cluster, engine_namespace, "workflowdefinitions") == []
    recreated = apply(cluster, engine_namespace, definition())
    assert recreated.returncode == 0, recreated.stderr
