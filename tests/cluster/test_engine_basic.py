"""The run engine on the real control plane and PostgreSQL: order, fan-in, status, events."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from flowforge.domain.event_series import COMBINED_PREFIX, SIMILAR_BEFORE_SERIES
from flowforge.domain.projection import STATUS_TASK_SUMMARY_LIMIT
from flowforge.domain.run_files import EMPTY_FILE_ANNOTATION
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.operator.notifier import SERIES_FLUSH_SECONDS
from flowforge.store import queries as store_queries
from flowforge.store.events import run_history
from flowforge.store.runs import RunRecord, find_run
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

STEP = {
    "image": "busybox:1.36",
    "command": ["true"],
    "annotations": {"flowforge.io/simulate-duration": "1s"},
}


def diamond(workflow: str = "diamond") -> dict[str, Any]:
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"step": STEP},
        "tasks": [
            {"key": "extract", "type": "step", "config": {"source": "s3://b"}},
            {"key": "left", "type": "step", "dependsOn": ["extract"]},
            {"key": "right", "type": "step", "dependsOn": ["extract"]},
            {"key": "load", "type": "step", "dependsOn": ["left", "right"]},
        ],
    }


def _finished(job: Any) -> float:
    return float(job.status.completion_time.timestamp())


async def test_diamond_runs_in_dependency_order_and_succeeds(
    operators: Callable[..., OperatorProcess], driver: RunDriver
) -> None:
    metrics_port = free_port()
    operator = operators(env={"FLOWFORGE_METRICS_PORT": str(metrics_port)})
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    await driver.publish(diamond())
    driver.create_run("d1", workflow="diamond", parameters={"date": "2026-11-30"})
    body = await driver.wait_phase("d1", {"Succeeded", "Failed"}, operator=operator)
    status = body["status"]
    assert status["phase"] == "Succeeded", status
    assert status["progress"] == "4/4"
    assert driver.printer_row("d1")["Progress"] == "4/4"
    assert driver.printer_row("d1")["Phase"] == "Succeeded"

    jobs = {job.metadata.labels["flowforge.io/task"]: job for job in driver.jobs("d1")}
    assert set(jobs) == {"extract", "left", "right", "load"}
    # a dependent's Job is created only after its upstream's Pod succeeded (whole seconds)
    for upstream, dependent in [
        ("extract", "left"),
        ("extract", "right"),
        ("left", "load"),
        ("right", "load"),
    ]:
        assert jobs[dependent].metadata.creation_timestamp >= driver.pod_finished(jobs[upstream])
        assert _finished(jobs[upstream]) >= driver.pod_finished(jobs[upstream]).timestamp()
    extract = jobs["extract"]
    assert extract.spec.backoff_limit == 0
    assert extract.metadata.owner_references[0].kind == "WorkflowRun"
    assert extract.metadata.owner_references[0].controller is True
    env = {e.name: e.value for e in extract.spec.template.spec.containers[0].env}
    assert env["FLOWFORGE_PARAM_DATE"] == "2026-11-30"
    assert env["FLOWFORGE_CONFIG_FILE"] == "/etc/flowforge/config.json"
    assert "FLOWFORGE_CONFIG" not in env
    assert env["FLOWFORGE_ATTEMPT"] == "1"

    assert status["counts"] == {
        "total": 4,
        "waiting": 0,
        "ready": 0,
        "admitting": 0,
        "running": 0,
        "succeeded": 4,
        "failed": 0,
        "tolerated": 0,
        "skipped": 0,
        "cancelled": 0,
        "conditionSkipped": 0,
    }
    assert status["definitionFingerprint"].startswith("sha256:")
    assert status["startedAt"] and status["finishedAt"]
    assert {t["name"] for t in status["tasks"]} == {"extract", "left", "right", "load"}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Succeeded"
    reasons = {event.reason for event in driver.events("d1")}
    assert {"RunStarted", "TaskStarted", "RunSucceeded"} <= reasons

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as response:
        exposition = response.read().decode()
    assert 'flowforge_task_outcomes_total{reason="Completed",role="forward"} 4.0' in exposition
    assert "flowforge_handoff_latency_seconds_count 3.0" in exposition
    assert 'flowforge_jobs_created_total{role="forward"} 4.0' in exposition
    # the successes were read from the Pods, a second before their Jobs said so (one the Job
    # path recorded first, on a loaded machine, would be no error: it is the fallback)
    run = await find_run(
        driver.pool, namespace=driver.namespace, name="d1", uid=body["metadata"]["uid"]
    )
    from_pods = [
        event.task_key
        for event in await run_history(driver.pool, run.id)
        if event.kind == "task.succeeded" and event.detail["message"].startswith("Pod ")
    ]
    assert from_pods, "no success was read from a Pod"
    assert f"flowforge_pod_successes_total {float(len(from_pods))}" in exposition


async def test_a_running_pod_whose_files_annotation_is_patched_fails_its_attempt(
    operators: Callable[..., OperatorProcess], driver: RunDriver, cluster: Cluster
) -> None:
    """A run without parameters or configs reads both files from its Pod's annotation; a
    tenant who may patch Pods changes it on the running Pod (the kubelet would refresh the
    files): the attempt fails ``ForgedPod``, with an Event, and its Job is deleted."""
    operator = operators()
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    slow = {**STEP, "annotations": {"flowforge.io/simulate-duration": "30s"}}
    await driver.publish(
        {
            "workflow": "patched",
            "version": 1,
            "taskTypes": {"step": slow},
            "tasks": [{"key": "only", "type": "step"}],
        }
    )
    driver.create_run("p1", workflow="patched")

    def running_pod() -> str | None:
        for job in driver.jobs("p1"):
            for pod in driver.core.list_namespaced_pod(
                driver.namespace,
                label_selector=f"batch.kubernetes.io/controller-uid={job.metadata.uid}",
            ).items:
                if pod.status.phase == "Running":
                    return str(pod.metadata.name)
        return None

    await wait_until(lambda: running_pod() is not None, what="the task's Pod running")
    pod = running_pod()
    kubectl(
        cluster,
        "annotate",
        "pod",
        str(pod),
        "-n",
        driver.namespace,
        "--overwrite",
        f'{EMPTY_FILE_ANNOTATION}={{"amount": 1000000}}',
    )

    body = await driver.wait_phase("p1", {"Succeeded", "Failed"}, operator=operator)
    assert body["status"]["phase"] == "Failed", body["status"]
    (task,) = body["status"]["tasks"]
    assert "ForgedPod" in str(task), task
    assert "ForgedPod" in {event.reason for event in driver.events("p1")}
    await wait_until(lambda: not driver.jobs("p1"), what="the attempt's Job deleted")


async def test_fan_in_of_fifty_releases_the_join_exactly_once(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    width = 50
    spec = {
        "workflow": "fan",
        "version": 1,
        "taskTypes": {"step": {"image": "busybox:1.36"}},
        "tasks": [
            {"key": "root", "type": "step"},
            *(
                {"key": f"branch-{i:02d}", "type": "step", "dependsOn": ["root"]}
                for i in range(width)
            ),
            {"key": "join", "type": "step", "dependsOn": [f"branch-{i:02d}" for i in range(width)]},
        ],
    }
    await driver.publish(spec)
    driver.create_run("f1", workflow="fan")
    body = await driver.wait_phase("f1", {"Succeeded", "Failed"}, timeout=180, operator=operator)
    assert body["status"]["phase"] == "Succeeded", body["status"]
    assert body["status"]["progress"] == f"{width + 2}/{width + 2}"
    joins = [job for job in driver.jobs("f1") if job.metadata.labels["flowforge.io/task"] == "join"]
    assert len(joins) == 1
    run = await find_run(
        driver.pool, namespace=driver.namespace, name="f1", uid=body["metadata"]["uid"]
    )
    history = await run_history(driver.pool, run.id)
    assert [e.kind for e in history if e.task_key == "join"].count("task.released") == 1
    assert [e.kind for e in history if e.task_key == "join"].count("task.dispatched") == 1
    # 52 tasks: above the summary limit, so the status lists none and says so
    assert width + 2 > STATUS_TASK_SUMMARY_LIMIT
    assert body["status"].get("tasks", []) == [] and body["status"]["tasksTruncated"] is True

    # a Job's creation is recorded after the call that made it returns, so its outcome (from
    # the Job watch) and the run's end can come first: wait for the records, then count them
    async def all_recorded() -> set[tuple[str, int]] | None:
        created = await store_queries.job_created_attempts(driver.pool, run.id)
        return created if len(created) >= width + 2 else None

    created = await wait_until(all_recorded, timeout=30, what="every Job's creation recorded")
    assert len(created) == width + 2

    # 52 starts: the first few are Events of their own, the rest one Event that counts them
    def every_start_counted() -> list[Any] | None:
        started = [e for e in driver.events("f1") if e.reason == "TaskStarted"]
        return started if sum(e.count for e in started) == width + 2 else None

    started: list[Any] = await wait_until(
        every_start_counted,
        timeout=SERIES_FLUSH_SECONDS + 10,
        interval=0.5,
        what="TaskStarted Events counting every start",
    )
    [series] = [e for e in started if e.count > 1]
    assert series.count == width + 2 - SIMILAR_BEFORE_SERIES
    assert series.message.startswith(COMBINED_PREFIX)
    assert len(started) == SIMILAR_BEFORE_SERIES + 1


async def test_deleting_a_run_removes_its_jobs_and_keeps_its_history(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "doomed",
            "version": 1,
            "taskTypes": {
                "slow": {
                    "image": "busybox:1.36",
                    "annotations": {"flowforge.io/simulate-duration": "60s"},
                }
            },
            "tasks": [
                {"key": "slow", "type": "slow"},
                {"key": "after", "type": "slow", "dependsOn": ["slow"]},
            ],
        }
    )
    body = driver.create_run("gone", workflow="doomed")
    await wait_until(lambda: driver.jobs("gone"), timeout=60, what="the run's first Job")
    assert len(driver.jobs("gone")) == 1
    driver.delete_run("gone")
    await wait_until(
        lambda: not driver.jobs("gone"),
        timeout=60,
        interval=0.5,
        what="the garbage collector to remove the deleted run's Jobs",
    )

    async def stopped() -> RunRecord | None:
        run = await find_run(
            driver.pool, namespace=driver.namespace, name="gone", uid=body["metadata"]["uid"]
        )
        return run if run.phase.value != "Running" else None

    run = await wait_until(stopped, timeout=30, what="the deleted run to stop in the store")
    assert run.phase.value == "Cancelled"
    kinds = [event.kind for event in await run_history(driver.pool, run.id)]
    assert kinds[0] == "run.created" and "task.dispatched" in kinds
    assert "run.cancel_requested" in kinds
