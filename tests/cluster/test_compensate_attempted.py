"""`compensateOn: Attempted` on the real control plane: a task whose container started and
failed (it may have charged the card) is undone, first, its compensator told
FLOWFORGE_UNDO_OF=attempted; one whose Pod never started (unschedulable, failed after its
pending timeout) is not."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.api import API_VERSION, GROUP, POLICY_KIND, POLICY_PLURAL, VERSION
from flowforge.domain.undo import UNDO_OF_ENV
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.sagas import FAIL, OK, UNDO, compensation_history, compensator_states

pytestmark = pytest.mark.cluster

NEVER_STARTS = {
    "image": "busybox:1.36",
    "nodeSelector": {"flowforge.io/no-such-node": "anywhere"},
    "pendingTimeoutSeconds": 3,
}


def payment(workflow: str, *, charge: str) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"ok": OK, "undo": UNDO, "fail": FAIL, "never": NEVER_STARTS},
        "tasks": [
            {"key": "reserve", "type": "ok"},
            {"key": "charge", "type": charge, "dependsOn": ["reserve"]},
            {"key": "release", "type": "undo", "compensateFor": "reserve"},
            {
                "key": "refund",
                "type": "undo",
                "compensateFor": "charge",
                "compensateOn": "Attempted",
            },
        ],
    }


def undo_of(driver: RunDriver, run: str) -> dict[str, str]:
    """Each compensator Job's task -> its FLOWFORGE_UNDO_OF."""
    found: dict[str, str] = {}
    for job in driver.jobs(run):
        if job.metadata.labels["flowforge.io/role"] == "compensation":
            env = {e.name: e.value for e in job.spec.template.spec.containers[0].env or []}
            found[job.metadata.labels["flowforge.io/task"]] = env[UNDO_OF_ENV]
    return found


async def test_an_attempted_task_is_undone_first_and_one_that_never_started_is_not(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    # the operator judges each Job against the namespace's policy: allow the node selector
    driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        POLICY_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": POLICY_KIND,
            "metadata": {"name": "nodes"},
            "spec": {"nodeSelector": {"flowforge.io/no-such-node": ["*"]}},
        },
    )
    await driver.publish(payment("charged", charge="fail"))
    await driver.publish(payment("unscheduled", charge="never"))
    driver.create_run("charged-1", workflow="charged")
    driver.create_run("unscheduled-1", workflow="unscheduled")

    await driver.wait_phase("charged-1", {"Failed"}, timeout=120, operator=operator)
    await driver.wait_phase("unscheduled-1", {"Failed"}, timeout=120, operator=operator)

    # the container ran and failed: its refund runs first, as the latest work, then release
    ran = [task for kind, task in await compensation_history(driver, "charged-1")]
    assert ran == ["refund", "refund", "release", "release"]
    assert undo_of(driver, "charged-1") == {"refund": "attempted", "release": "succeeded"}
    # its Pod never started: nothing to refund
    states = await compensator_states(driver.pool, driver, "unscheduled-1")
    assert (states["refund"], states["release"]) == ("skipped", "succeeded")
    assert undo_of(driver, "unscheduled-1") == {"release": "succeeded"}
