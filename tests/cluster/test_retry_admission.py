"""``spec.retryOf`` at admission on the real control plane, with the operator and the
webhooks on one store: refused (the field named) for another namespace's run, a run still
running, a run that succeeded, other parameters; a valid retry reuses what succeeded and
records who asked. Who asked cannot be forged."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import (
    API_VERSION,
    GROUP,
    REQUESTED_BY_ANNOTATION,
    RUN_KIND,
    RUN_PLURAL,
    VERSION,
)
from flowforge.domain.validation import parse_definition
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.definitions import publish_definition
from flowforge.store.events import run_history
from flowforge.store.reuse import find_run_by_name
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.plugins.webhooks import (  # noqa: F401 (test_run_actions.py imports store_webhooks here)
    WebhookServer,
    store_webhooks,
)

pytestmark = pytest.mark.cluster

OK = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
FAIL = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-exit-code": "3"}}
SLOW = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "60s"}}
FINISHED = {"Succeeded", "Failed", "Cancelled"}


def workflow(name: str, last: dict[str, Any]) -> dict[str, Any]:
    return {
        "workflow": name,
        "version": 1,
        "taskTypes": {"ok": OK, "last": last},
        "tasks": [
            {"key": "a", "type": "ok"},
            {"key": "b", "type": "last", "dependsOn": ["a"]},
        ],
    }


def create(
    driver: RunDriver,
    name: str,
    *,
    workflow_name: str,
    namespace: str | None = None,
    parameters: dict[str, str] | None = None,
    retry_of: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"workflow": workflow_name, "parameters": parameters or {}}
    if retry_of is not None:
        spec["retryOf"] = retry_of
    body: dict[str, Any] = driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace or driver.namespace,
        RUN_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": RUN_KIND,
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": spec,
        },
    )
    return body


def refusal(driver: RunDriver, name: str, **kwargs: Any) -> str:
    with pytest.raises(ApiException) as raised:
        create(driver, name, **kwargs)
    return str(raised.value.body)


async def test_retry_of_is_checked_at_admission_and_records_who_asked(
    cluster: Cluster,
    store_webhooks: WebhookServer,  # noqa: F811 (the fixture imported above)
    operator: OperatorProcess,
    driver: RunDriver,
) -> None:
    me = kubectl(cluster, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout
    assert me
    await driver.publish(workflow("flaky", FAIL))
    await driver.publish(workflow("fine", OK))
    await driver.publish(workflow("slow", SLOW))
    failed = create(
        driver,
        "f1",
        workflow_name="flaky",
        parameters={"date": "2026-11-30"},
        annotations={REQUESTED_BY_ANNOTATION: "someone-else"},
    )
    assert failed["metadata"]["annotations"][REQUESTED_BY_ANNOTATION] == me  # not forgeable
    create(driver, "ok1", workflow_name="fine")
    create(driver, "s1", workflow_name="slow")
    await driver.wait_phase("f1", {"Failed"}, operator=operator)
    await driver.wait_phase("ok1", {"Succeeded"}, operator=operator)

    changed = driver.custom.patch_namespaced_custom_object
    with pytest.raises(ApiException) as raised:
        changed(
            GROUP,
            VERSION,
            driver.namespace,
            RUN_PLURAL,
            "f1",
            {"metadata": {"annotations": {REQUESTED_BY_ANNOTATION: "someone-else"}}},
        )
    assert REQUESTED_BY_ANNOTATION in str(raised.value.body)

    params = {"date": "2026-11-30"}
    running = refusal(driver, "r1", workflow_name="slow", retry_of="s1")
    # what is wrong, never what is stored: the retried run's phase is not repeated
    assert "spec.retryOf" in running and "is not Failed or Cancelled" in running, running
    assert "Running" not in running, running
    succeeded = refusal(driver, "r2", workflow_name="fine", retry_of="ok1")
    assert "spec.retryOf" in succeeded and "is not Failed or Cancelled" in succeeded, succeeded
    assert "Succeeded" not in succeeded, succeeded
    other = refusal(driver, "r3", workflow_name="flaky", retry_of="f1", parameters={"date": "x"})
    assert "spec.retryOf" in other and "parameters" in other, other
    missing = refusal(driver, "r4", workflow_name="flaky", retry_of="f1")  # no parameters
    assert "spec.retryOf" in missing and "parameters" in missing, missing

    elsewhere = f"{driver.namespace}-b"
    driver.core.create_namespace({"metadata": {"name": elsewhere}})
    try:
        await publish_definition(
            driver.pool, namespace=elsewhere, definition=parse_definition(workflow("flaky", FAIL))
        )
        foreign = refusal(
            driver,
            "r5",
            workflow_name="flaky",
            namespace=elsewhere,
            retry_of="f1",
            parameters=params,
        )
        assert "spec.retryOf" in foreign and "no run named 'f1'" in foreign, foreign
    finally:
        driver.core.delete_namespace(elsewhere)

    create(driver, "f1-retry", workflow_name="flaky", retry_of="f1", parameters=params)
    await driver.wait_phase("f1-retry", FINISHED, operator=operator)
    jobs = {job.metadata.labels["flowforge.io/task"] for job in driver.jobs("f1-retry")}
    assert jobs == {"b"}  # a succeeded in f1: reused
    retry = await find_run_by_name(driver.pool, namespace=driver.namespace, name="f1-retry")
    assert retry is not None
    events = [e for e in await run_history(driver.pool, retry.id) if e.kind == "run.retry_of"]
    assert [(e.detail["retryOf"], e.detail["requestedBy"], e.detail["reused"]) for e in events] == [
        ("f1", me, ["a"])
    ]
