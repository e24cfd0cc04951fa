"""`forEach` on the real control plane (kwok Pods, the operator as it ships): a 6-item
fan-out with `maxParallel: 2` never has more than 2 of its Jobs running (from the Jobs' own
times) and its dependent runs once, after all 6; a 4-item fan-out whose item `us` fails
(`flowforge.io/simulate-fail-items`) rolls back item by item, in reverse completion order,
never undoing `us`, and with `tolerateFailures: 1` succeeds with `PartialFailure`. One
operator for the three runs, which go side by side."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.api import API_VERSION, GROUP, RUN_KIND, RUN_PLURAL, VERSION
from flowforge.store.events import run_history
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.job_times import JobTimes, most_at_once

pytestmark = pytest.mark.cluster

STEP = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
REGIONS = {"name": "regions", "type": "array", "items": {"type": "string"}, "minItems": 1}


def fan_out(workflow: str, *, for_each: dict[str, Any], fail: str = "") -> dict[str, Any]:
    deployer = dict(STEP)
    if fail:
        deployer = {**STEP, "annotations": {**STEP["annotations"]}}
        deployer["annotations"]["flowforge.io/simulate-fail-items"] = fail
    return {
        "workflow": workflow,
        "version": 1,
        "parameters": [REGIONS],
        "taskTypes": {"step": STEP, "deployer": deployer},
        "tasks": [
            {"key": "deploy", "type": "deployer", "forEach": for_each},
            {"key": "verify", "type": "step", "dependsOn": ["deploy"]},
            {"key": "undo-deploy", "type": "step", "compensateFor": "deploy"},
        ],
    }


def task_key(job: Any) -> str:
    """The task (instance) key a Job runs: an instance's exact key is its annotation, a
    plain task's its label."""
    annotations = job.metadata.annotations or {}
    return str(annotations.get("flowforge.io/task-key") or job.metadata.labels["flowforge.io/task"])


def create(driver: RunDriver, name: str, *, workflow: str, regions: list[str]) -> None:
    driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        RUN_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": RUN_KIND,
            "metadata": {"name": name},
            "spec": {"workflow": workflow, "version": 1, "parameters": {"regions": regions}},
        },
    )


async def compensations(driver: RunDriver, name: str) -> list[str]:
    """The compensator instances in the order they started, from the run's history."""
    body = driver.run(name)
    run = await find_run(
        driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
    )
    return [
        str(event.task_key)
        for event in await run_history(driver.pool, run.id)
        if event.kind == "compensation.started"
    ]


async def succeeded_order(driver: RunDriver, name: str) -> list[str]:
    body = driver.run(name)
    run = await find_run(
        driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
    )
    return [
        str(event.task_key)
        for event in await run_history(driver.pool, run.id)
        if event.kind == "task.succeeded" and str(event.task_key).startswith("deploy[")
    ]


async def test_for_each_caps_its_items_waits_for_all_and_undoes_item_by_item(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    six = ["r1", "r2", "r3", "r4", "r5", "r6"]
    await driver.publish(fan_out("wide", for_each={"items": "params.regions", "maxParallel": 2}))
    # one at a time, us last: eu, sa and ap succeed first, in that order
    line = {"items": "params.regions", "maxParallel": 1}
    await driver.publish(fan_out("strict", for_each=line, fail="us"))
    await driver.publish(fan_out("lenient", for_each={**line, "tolerateFailures": 1}, fail="us"))
    jobs = JobTimes(driver.api, driver.namespace)
    try:
        create(driver, "wide-1", workflow="wide", regions=six)
        create(driver, "strict-1", workflow="strict", regions=["eu", "sa", "ap", "us"])
        create(driver, "lenient-1", workflow="lenient", regions=["eu", "sa", "ap", "us"])
        wide = await driver.wait_phase("wide-1", {"Succeeded"}, timeout=180, operator=operator)
        strict = await driver.wait_phase("strict-1", {"Failed"}, timeout=180, operator=operator)
        lenient = await driver.wait_phase(
            "lenient-1", {"Succeeded"}, timeout=180, operator=operator
        )
        await jobs.completed({"wide-1": 7})
    finally:
        jobs.close()

    # wide: never more than 2 of its items at once; verify once, after every item
    keys = {
        name: task_key(job) for name, job in jobs.objects.items() if jobs.times[name][0] == "wide-1"
    }
    items = [name for name, key in keys.items() if str(key).startswith("deploy[")]
    assert sorted(str(keys[name]) for name in items) == [f"deploy[{r}]" for r in six]
    spans = [(jobs.times[name][1], driver.pod_finished(jobs.objects[name])) for name in items]
    assert most_at_once(spans) <= 2, spans
    [verify] = [name for name, key in keys.items() if key == "verify"]
    assert jobs.times[verify][1] >= max(end for _, end in spans)
    assert wide["status"]["counts"]["succeeded"] == 7

    # strict: us fails; the others are undone in reverse completion order, us never
    done = await succeeded_order(driver, "strict-1")
    assert done == ["deploy[eu]", "deploy[sa]", "deploy[ap]"]
    undone = await compensations(driver, "strict-1")
    assert undone == ["undo-deploy[ap]", "undo-deploy[sa]", "undo-deploy[eu]"]
    assert "verify" not in {task_key(job) for job in driver.jobs("strict-1")}
    assert strict["status"]["phase"] == "Failed"

    # lenient: one failure tolerated, the dependent ran, nothing undone
    conditions = {c["type"]: c for c in lenient["status"]["conditions"]}
    assert conditions["PartialFailure"]["status"] == "True"
    assert await compensations(driver, "lenient-1") == []
