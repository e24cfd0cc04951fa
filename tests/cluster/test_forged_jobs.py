"""Outcomes only from the run's own Jobs, tried on the real control plane as a tenant would.

The operator watches two namespaces: the run's and the attacker's. The attacker reads the
run's Job (its labels carry the run, task and attempt; its annotations the run's uid) and
creates copies: one in their own namespace that fails at once, one beside the real Job that
succeeds at once, one in their namespace that keeps running (the reconciler's cleanup would
delete it), and a Pod labelled ``job-name`` of the run's Job that exits 7. The run's own
Job fails with exit code 3 a few seconds later: that, and only that, is the run's outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from flowforge.domain.history import OUTCOME_KINDS
from flowforge.store.events import run_history
from flowforge.store.queries import recorded_jobs
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.cluster

VICTIM = {
    "image": "busybox:1.36",
    "annotations": {
        "flowforge.io/simulate-exit-code": "3",
        "flowforge.io/simulate-duration": "8s",
    },
}


def forged_job(original: Any, *, namespace: str, name: str, pod_annotations: dict[str, str]) -> Any:
    """What a tenant can make of a Job they can read: its labels and annotations, copied."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(original.metadata.labels),
            "annotations": dict(original.metadata.annotations),
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": pod_annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "task", "image": "busybox:1.36"}],
                },
            },
        },
    }


def forged_pod(job_name: str, *, namespace: str, exit_code: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job_name[:50]}-forged",
            "namespace": namespace,
            "labels": {"job-name": job_name, "batch.kubernetes.io/job-name": job_name},
            "annotations": {"flowforge.io/simulate-exit-code": str(exit_code)},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "task", "image": "busybox:1.36"}],
        },
    }


def finished(batch: k8s.BatchV1Api, *, namespace: str, name: str) -> bool:
    job = batch.read_namespaced_job(name, namespace)
    return any(c.status == "True" for c in (job.status.conditions or []))


def exists(batch: k8s.BatchV1Api, *, namespace: str, name: str) -> bool:
    try:
        batch.read_namespaced_job(name, namespace)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


async def test_copies_of_a_runs_job_and_a_forged_pod_change_nothing(
    operators: Callable[..., OperatorProcess],
    driver: RunDriver,
    namespace: str,
) -> None:
    attacker = namespace
    operator = operators(env={"FLOWFORGE_NAMESPACES": f"{driver.namespace},{attacker}"})
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    await driver.publish(
        {
            "workflow": "victim",
            "version": 1,
            "taskTypes": {"victim": VICTIM},
            "tasks": [{"key": "work", "type": "victim"}],
        }
    )
    created = driver.create_run("v1", workflow="victim")
    [job] = wait_until_blocking(lambda: driver.jobs("v1"), timeout=60, what="the run's Job")
    name = job.metadata.name
    batch, core = driver.batch, driver.core

    fails_at_once = {"flowforge.io/simulate-exit-code": "5"}
    batch.create_namespaced_job(
        attacker,
        forged_job(job, namespace=attacker, name=name, pod_annotations=fails_at_once),
    )
    batch.create_namespaced_job(
        driver.namespace,
        forged_job(job, namespace=driver.namespace, name=f"{name[:40]}-twin", pod_annotations={}),
    )
    keeps_running = {"flowforge.io/simulate-duration": "600s"}
    batch.create_namespaced_job(
        attacker,
        forged_job(job, namespace=attacker, name="sleeper", pod_annotations=keeps_running),
    )
    wait_until_blocking(
        lambda: (
            core.list_namespaced_pod(
                driver.namespace,
                label_selector=f"batch.kubernetes.io/controller-uid={job.metadata.uid}",
            ).items
        ),
        timeout=30,
        what="the run's Pod",
    )
    await asyncio.sleep(1.5)  # creation timestamps have 1 s resolution: the forged Pod is newer
    core.create_namespaced_pod(
        driver.namespace, forged_pod(name, namespace=driver.namespace, exit_code=7)
    )
    wait_until_blocking(
        lambda: (
            finished(batch, namespace=attacker, name=name)
            and finished(batch, namespace=driver.namespace, name=f"{name[:40]}-twin")
        ),
        timeout=60,
        what="the forged Jobs to finish",
    )

    body = await driver.wait_phase("v1", {"Succeeded", "Failed"}, operator=operator)

    assert body["status"]["phase"] == "Failed", body["status"]
    [task] = body["status"]["tasks"]
    assert task["state"] == "failed" and task["exitCode"] == 3, task
    run = await find_run(
        driver.pool, namespace=driver.namespace, name="v1", uid=created["metadata"]["uid"]
    )
    outcomes = [e for e in await run_history(driver.pool, run.id) if e.kind in OUTCOME_KINDS]
    assert [(e.kind, e.attempt, e.detail["exitCode"]) for e in outcomes] == [("task.failed", 1, 3)]
    assert await recorded_jobs(driver.pool, run.id) == {("work", 1): job.metadata.uid}

    def forged_events() -> list[Any]:
        return [e for e in driver.events("v1") if e.reason == "ForgedJob" and e.type == "Warning"]

    events = wait_until_blocking(
        lambda: len(forged_events()) >= 2 and forged_events(), timeout=30, what="ForgedJob Events"
    )
    messages = " | ".join(e.message for e in events)
    assert f"{attacker}/{name}" in messages and "another namespace" in messages
    assert f"{driver.namespace}/{name[:40]}-twin" in messages

    await asyncio.sleep(5)  # two reconcile passes: the attempt is over, its Jobs are cleanable
    assert exists(batch, namespace=attacker, name="sleeper"), (
        "the reconciler deleted a Job that is not the run's"
    )
    assert exists(batch, namespace=attacker, name=name)
    assert exists(batch, namespace=driver.namespace, name=f"{name[:40]}-twin")
    assert any("sleeper" in e.message for e in forged_events()), messages
