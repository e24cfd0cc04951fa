"""`finally` tasks on the real control plane: after a run that succeeded, and after the
rollback of a run that failed, they run in list order, one at a time, each Job told the
decided outcome (FLOWFORGE_RUN_OUTCOME, FLOWFORGE_ROLLBACK); a failing one leaves the run's
phase as decided, and the run takes it only once they have run."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.final_tasks import ROLLBACK_ENV, RUN_OUTCOME_ENV
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.sagas import FAIL, OK, UNDO, history

pytestmark = pytest.mark.cluster


def closing(workflow: str, *, deploy: str) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"ok": OK, "undo": UNDO, "fail": FAIL},
        "tasks": [
            {"key": "build", "type": "ok"},
            {"key": "deploy", "type": deploy, "dependsOn": ["build"]},
            {"key": "unbuild", "type": "undo", "compensateFor": "build"},
        ],
        "finally": [
            {"key": "notify", "type": "fail"},  # fails: the phase stands
            {"key": "release-lock", "type": "ok"},
        ],
    }


def told(driver: RunDriver, run: str) -> dict[str, tuple[str, str]]:
    """Each finally Job's task -> the outcome its container was told."""
    found: dict[str, tuple[str, str]] = {}
    for job in driver.jobs(run):
        if job.metadata.labels["flowforge.io/role"] != "finally":
            continue
        env = {e.name: e.value for e in job.spec.template.spec.containers[0].env or []}
        found[job.metadata.labels["flowforge.io/task"]] = (
            env[RUN_OUTCOME_ENV],
            env[ROLLBACK_ENV],
        )
    return found


async def order(driver: RunDriver, run: str) -> list[tuple[str, str | None]]:
    kinds = ("compensation.succeeded", "finally.started", "finally.failed", "finally.succeeded")
    return [(e.kind, e.task_key) for e in await history(driver, run) if e.kind in kinds]


async def test_finally_runs_in_order_after_a_success_and_after_a_rollback(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(closing("shipped", deploy="ok"))
    await driver.publish(closing("undone", deploy="fail"))
    driver.create_run("shipped-1", workflow="shipped")
    driver.create_run("undone-1", workflow="undone")

    shipped = await driver.wait_phase("shipped-1", {"Succeeded"}, timeout=120, operator=operator)
    undone = await driver.wait_phase("undone-1", {"Failed"}, timeout=120, operator=operator)

    assert told(driver, "shipped-1") == {
        "notify": ("Succeeded", "None"),
        "release-lock": ("Succeeded", "None"),
    }
    assert told(driver, "undone-1") == {
        "notify": ("Failed", "Completed"),
        "release-lock": ("Failed", "Completed"),
    }
    assert await order(driver, "shipped-1") == [
        ("finally.started", "notify"),
        ("finally.failed", "notify"),
        ("finally.started", "release-lock"),
        ("finally.succeeded", "release-lock"),
    ]
    assert (await order(driver, "undone-1"))[:2] == [
        ("compensation.succeeded", "unbuild"),
        ("finally.started", "notify"),
    ]
    for body, outcome, rollback in (
        (shipped, "Succeeded", "None"),
        (undone, "Failed", "Completed"),
    ):
        final = body["status"]["finally"]
        assert (final["outcome"], final["rollback"]) == (outcome, rollback)
        assert [(s["name"], s["state"]) for s in final["steps"]] == [
            ("notify", "failed"),
            ("release-lock", "succeeded"),
        ]
