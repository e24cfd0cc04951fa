"""Deleting a WorkflowRun on the real control plane: FlowForge's finalizer holds the object
(and so the Jobs it owns) until the rollback has settled; the escape annotation forces it."""

from __future__ import annotations

import asyncio

import pytest

from flowforge.domain.api import FORCE_DELETE_ANNOTATION, GROUP, RUN_PLURAL, VERSION
from flowforge.store.reuse import find_run_by_name
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.sagas import HANG, compensator_states, delete_mid_rollback, present, wait_gone

pytestmark = pytest.mark.cluster

UNDO = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "4s"}}


async def test_deleting_a_run_mid_rollback_lets_every_compensator_finish_first(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await delete_mid_rollback(operator, driver, "o1", undo=UNDO)

    held = present(driver, "o1")
    assert held is not None and held["metadata"].get("deletionTimestamp"), held
    states = await compensator_states(driver.pool, driver, "o1")
    assert states["release"] in {"pending", "running"}, states  # not done yet: still held

    await wait_gone(operator, driver, "o1", timeout=120)
    states = await compensator_states(driver.pool, driver, "o1")
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
    states = await compensator_states(driver.pool, driver, "s1")
    assert states == {"refund": "skipped", "release": "skipped"}, states
    run = await find_run_by_name(driver.pool, namespace=driver.namespace, name="s1")
    assert run is not None and str(run.phase) == "Cancelled"
