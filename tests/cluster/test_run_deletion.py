"""Deleting a WorkflowRun on the real control plane: FlowForge's finalizer holds the object
(and so the Jobs it owns) until the rollback has settled; the escape annotation forces it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import FINALIZER, FORCE_DELETE_ANNOTATION, GROUP, RUN_PLURAL, VERSION
from flowforge.store.connection import Pool
from flowforge.store.queries import list_tasks
from flowforge.store.reuse import find_run_by_name
from tests.cluster.test_saga import ORDER_SAGA
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

UNDO = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "4s"}}
HANG = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "600s"}}


def saga(workflow: str, undo: dict[str, Any]) -> dict[str, Any]:
    """test_saga's order saga, with compensators that take ``undo``'s time."""
    return {
        **ORDER_SAGA,
        "workflow": workflow,
        "taskTypes": {**ORDER_SAGA["taskTypes"], "undo": undo},
    }


async def compensators(pool: Pool, driver: RunDriver, name: str) -> dict[str, str]:
    run = await find_run_by_name(pool, namespace=driver.namespace, name=name)
    if run is None:
        return {}
    return {
        task.task_key: str(task.state)
        for task in await list_tasks(pool, run.id)
        if task.compensates_key is not None
    }


async def wait_gone(
    operator: OperatorProcess, driver: RunDriver, name: str, *, timeout: float
) -> None:
    await wait_until(
        lambda: present(driver, name) is None,
        timeout=timeout,
        what=f"{name} to go",
        operator=operator,
    )


def present(driver: RunDriver, name: str) -> dict[str, Any] | None:
    try:
        return driver.run(name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


async def delete_mid_rollback(
    operator: OperatorProcess, driver: RunDriver, name: str, *, undo: dict[str, Any]
) -> None:
    """Start a saga run whose compensators take ``undo``'s time; delete it once ``refund``
    (the first compensator) runs."""
    await driver.publish(saga(f"w-{name}", undo))
    driver.create_run(name, workflow=f"w-{name}")
    await wait_until(
        lambda: (
            FINALIZER in (present(driver, name) or {}).get("metadata", {}).get("finalizers", [])
        ),
        timeout=60,
        what="the operator's finalizer on the run",
        operator=operator,
    )

    async def refund_running() -> bool:
        return (await compensators(driver.pool, driver, name)).get("refund") == "running"

    await wait_until(
        refund_running, timeout=90, what="the rollback to start (refund running)", operator=operator
    )
    driver.delete_run(name)


async def test_deleting_a_run_mid_rollback_lets_every_compensator_finish_first(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await delete_mid_rollback(operator, driver, "o1", undo=UNDO)

    held = present(driver, "o1")
    assert held is not None and held["metadata"].get("deletionTimestamp"), held
    states = await compensators(driver.pool, driver, "o1")
    assert states["release"] in {"pending", "running"}, states  # not done yet: still held

    await wait_gone(operator, driver, "o1", timeout=120)
    states = await compensators(driver.pool, driver, "o1")
    assert states == {"refund": "succeeded", "release": "succeeded"}, states
    run = await find_run_by_name(driver.pool, namespace=driver.namespace, name="o1")
    assert run is not None and str(run.phase) in {"Failed", "Cancelled"}


async def test_the_force_delete_annotation_skips_the_rollback_and_the_run_goes_at_once(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await delete_mid_rollback(operator, driver, "s1", undo=HANG)
    await asyncio.sleep(3)
    assert present(driver, "s1") is not None  # held: refund would take ten minutes

    driver.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        RUN_PLURAL,
        "s1",
        {"metadata": {"annotations": {FORCE_DELETE_ANNOTATION: "true"}}},
    )
    await wait_gone(operator, driver, "s1", timeout=30)
    states = await compensators(driver.pool, driver, "s1")
    assert states == {"refund": "skipped", "release": "skipped"}, states
    run = await find_run_by_name(driver.pool, namespace=driver.namespace, name="s1")
    assert run is not None and str(run.phase) == "Cancelled"
