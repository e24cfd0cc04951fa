"""Failures that say why, never a hang, on the real control plane: a full ResourceQuota delays
a Job (and the run goes on when it frees) without holding up another run, an invalid Job
fails its attempt with the apiserver's message, and a Pod that cannot be scheduled fails its
attempt after ``pendingTimeoutSeconds`` with the scheduler's reason."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from flowforge.domain.api import API_VERSION, GROUP, POLICY_KIND, POLICY_PLURAL, VERSION
from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver, fresh_namespace, wait_for_leader
from tests.support.waiting import wait_until, wait_until_blocking

pytestmark = pytest.mark.cluster


def simulated(duration: str) -> dict[str, Any]:
    return {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": duration}}


def tasks(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {task["name"]: task for task in (body.get("status") or {}).get("tasks") or []}


async def outcome_details(driver: RunDriver, name: str, body: dict[str, Any]) -> list[Any]:
    run = await find_run(
        driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
    )
    history = await run_history(driver.pool, run.id)
    return [e.detail for e in history if e.kind in ("task.failed", "task.attempt_failed")]


@pytest.fixture
def other_namespace(kube_api: k8s.ApiClient, engine_namespace: str) -> Iterator[str]:
    yield from fresh_namespace(kube_api, f"other-{uuid.uuid4().hex[:8]}")


def job_quota(api: k8s.ApiClient, namespace: str, *, jobs: int) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_resource_quota(
        namespace,
        {"metadata": {"name": "jobs"}, "spec": {"hard": {"count/jobs.batch": str(jobs)}}},
    )

    def enforced() -> bool:  # the quota controller has computed its usage
        quota = core.read_namespaced_resource_quota("jobs", namespace)
        return bool(quota.status and quota.status.hard)

    wait_until_blocking(enforced, timeout=30, what="ResourceQuota status")


async def test_a_full_quota_delays_the_third_job_until_it_frees_and_blocks_no_other_run(
    operators: Callable[..., OperatorProcess],
    engine_store: Pool,
    driver: RunDriver,
    engine_namespace: str,
    other_namespace: str,
    kube_api: k8s.ApiClient,
) -> None:
    operator = operators(
        env={
            "FLOWFORGE_NAMESPACES": f"{engine_namespace},{other_namespace}",
            "FLOWFORGE_JOB_TTL": "0",  # finished Jobs go, and free the quota
            "FLOWFORGE_JOB_CREATION_RETRY_FIRST_DELAY": "0.5",
            "FLOWFORGE_JOB_CREATION_RETRY_CAP": "1",
        }
    )
    await wait_for_leader(engine_store, operator.identity, process=operator)
    job_quota(kube_api, engine_namespace, jobs=2)
    fan_out = {
        "workflow": "fan",
        "version": 1,
        "taskTypes": {"work": simulated("6s")},
        "tasks": [{"key": key, "type": "work"} for key in ("a", "b", "c")],
    }
    await driver.publish(fan_out)
    other = RunDriver(api=kube_api, namespace=other_namespace, pool=engine_store)
    await other.publish(
        {
            "workflow": "quick",
            "version": 1,
            "taskTypes": {"work": simulated("1s")},
            "tasks": [
                {"key": "one", "type": "work"},
                {"key": "two", "dependsOn": ["one"], "type": "work"},
            ],
        }
    )
    driver.create_run("quota", workflow="fan")

    delayed: list[Any] = await wait_until(
        lambda: [e for e in driver.events("quota") if e.reason == "JobCreationDelayed"],
        timeout=60,
        what="a JobCreationDelayed Event",
        operator=operator,
    )
    assert delayed[0].type == "Warning" and "exceeded quota" in delayed[0].message
    assert len(driver.jobs("quota")) == 2

    def shown() -> str:
        return " ".join(task.get("message", "") for task in tasks(driver.run("quota")).values())

    # the delayed task says why it has no Job
    await wait_until(lambda: "exceeded quota" in shown(), timeout=60, what="the quota in a message")

    other.create_run("meanwhile", workflow="quick")
    body = await other.wait_phase("meanwhile", {"Succeeded", "Failed"}, operator=operator)
    assert body["status"]["phase"] == "Succeeded"
    assert (driver.run("quota")["status"]["phase"]) == "Running"  # still held by the quota

    body = await driver.wait_phase("quota", {"Succeeded", "Failed"}, timeout=120, operator=operator)
    assert body["status"]["phase"] == "Succeeded", body["status"]
    assert {task["attempt"] for task in tasks(body).values()} == {1}  # delayed, never failed
    assert await outcome_details(driver, "quota", body) == []
    assert "TaskRetrying" not in {e.reason for e in driver.events("quota")}


async def test_an_invalid_job_fails_its_attempt_with_the_apiservers_message(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    # the schema lets it through: only the apiserver knows an item's path may not hold '..'
    volume = {"name": "c", "configMap": {"name": "c", "items": [{"key": "k", "path": "../escape"}]}}
    invalid = simulated("1s") | {"volumes": [volume]}
    await driver.publish(
        {
            "workflow": "invalid",
            "version": 1,
            "taskTypes": {"bad": invalid, "ok": simulated("1s")},
            "tasks": [
                {"key": "bad", "type": "bad"},
                {"key": "after", "type": "ok", "dependsOn": ["bad"]},
                {"key": "fine", "type": "ok"},
            ],
        }
    )
    driver.create_run("i1", workflow="invalid")
    body = await driver.wait_phase("i1", {"Succeeded", "Failed"}, operator=operator)
    assert body["status"]["phase"] == "Failed"
    by_name = tasks(body)
    assert by_name["bad"]["state"] == "failed" and by_name["after"]["state"] == "skipped"
    assert by_name["fine"]["state"] == "succeeded"
    assert by_name["bad"]["message"].startswith("JobRefused: ")
    assert "Invalid value" in by_name["bad"]["message"]
    [detail] = await outcome_details(driver, "i1", body)
    assert detail["reason"] == "JobRefused" and "../escape" in detail["message"]
    failed = [e for e in driver.events("i1") if e.reason == "TaskFailed"]
    assert failed and "Invalid value" in failed[0].message


async def test_an_unschedulable_pod_fails_after_the_pending_timeout(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    stuck = simulated("1s") | {
        "nodeSelector": {"flowforge.io/no-such-node": "anywhere"},
        "pendingTimeoutSeconds": 5,
    }
    await driver.publish(
        {
            "workflow": "stuck",
            "version": 1,
            "taskTypes": {"stuck": stuck, "ok": simulated("1s")},
            "tasks": [{"key": "stuck", "type": "stuck"}, {"key": "fine", "type": "ok"}],
        }
    )
    # the operator judges each Job against the namespace's policy (the default one allows no
    # nodeSelector): an admin allows the label, as admission would have required
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
    started = time.monotonic()
    driver.create_run("u1", workflow="stuck")
    body = await driver.wait_phase("u1", {"Succeeded", "Failed"}, operator=operator)
    # the timeout counts from the store's record of the Job's creation (exact, and after
    # ``started``), not from its creationTimestamp's whole seconds
    assert time.monotonic() - started >= 5
    assert body["status"]["phase"] == "Failed"
    by_name = tasks(body)
    assert by_name["fine"]["state"] == "succeeded"
    assert by_name["stuck"]["message"].startswith("Unschedulable: ")
    assert "node" in by_name["stuck"]["message"]
    failed = next(c for c in body["status"]["conditions"] if c["type"] == "Failed")
    assert "Unschedulable" in failed["message"]
    [detail] = await outcome_details(driver, "u1", body)
    assert detail["reason"] == "Unschedulable"
    assert any(
        e.reason == "TaskFailed" and "Unschedulable" in e.message for e in driver.events("u1")
    )

    def stuck_job_deleted() -> bool:
        return all(job.metadata.labels["flowforge.io/task"] != "stuck" for job in driver.jobs("u1"))

    wait_until_blocking(stuck_job_deleted, timeout=30, what="the stuck Job deleted")
