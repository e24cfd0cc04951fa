"""Failure, retries, timeouts, cancel and vanished Jobs on the real control plane."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.store.events import Event, run_history
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

OK = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
FAIL = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-exit-code": "3"}}
SLOW = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "60s"}}


async def history(driver: RunDriver, name: str, body: dict[str, Any]) -> list[Event]:
    run = await find_run(
        driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
    )
    return await run_history(driver.pool, run.id)


def tasks(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {task["name"]: task for task in body["status"]["tasks"]}


async def test_failure_skips_downstream_and_independent_branch_finishes(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "branches",
            "version": 1,
            "taskTypes": {"ok": OK, "fail": FAIL},
            "tasks": [
                {"key": "bad", "type": "fail"},
                {"key": "after-bad", "type": "ok", "dependsOn": ["bad"]},
                {"key": "after-after", "type": "ok", "dependsOn": ["after-bad"]},
                {"key": "good", "type": "ok"},
                {"key": "after-good", "type": "ok", "dependsOn": ["good"]},
            ],
        }
    )
    driver.create_run("b1", workflow="branches")
    body = await driver.wait_phase("b1", {"Succeeded", "Failed", "Cancelled"}, operator=operator)
    status = body["status"]
    assert status["phase"] == "Failed", status
    by_name = tasks(body)
    assert by_name["bad"]["state"] == "failed"
    assert by_name["bad"]["exitCode"] == 3
    assert by_name["after-bad"]["state"] == "skipped"
    assert by_name["after-after"]["state"] == "skipped"
    assert by_name["good"]["state"] == "succeeded"
    assert by_name["after-good"]["state"] == "succeeded"
    assert status["counts"]["failed"] == 1 and status["counts"]["skipped"] == 2
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "TaskFailed"
    assert "bad" in failed["message"]
    assert {job.metadata.labels["flowforge.io/task"] for job in driver.jobs("b1")} == {
        "bad",
        "good",
        "after-good",
    }
    reasons = {event.reason for event in driver.events("b1")}
    assert {"TaskFailed", "RunFailed"} <= reasons


async def test_retries_then_fails_with_every_attempt_a_new_job(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "flaky",
            "version": 1,
            "taskTypes": {"fail": FAIL},
            "tasks": [{"key": "flaky", "type": "fail", "retries": 2}],
        }
    )
    driver.create_run("r1", workflow="flaky")
    body = await driver.wait_phase("r1", {"Succeeded", "Failed"}, operator=operator)
    assert body["status"]["phase"] == "Failed"
    assert tasks(body)["flaky"]["attempt"] == 3
    jobs = sorted(driver.jobs("r1"), key=lambda job: job.metadata.labels["flowforge.io/attempt"])
    assert [job.metadata.labels["flowforge.io/attempt"] for job in jobs] == ["1", "2", "3"]
    assert len({job.metadata.name for job in jobs}) == 3
    events = await history(driver, "r1", body)
    failures = [e for e in events if e.kind == "task.attempt_failed"]
    assert [e.attempt for e in failures] == [1, 2]
    # backoff: first retry after 0.5 s .. 0.75 s (test setting), the second after 1 .. 1.5 s
    assert 0.5 <= failures[0].detail["retryInSeconds"] < 0.75
    assert 1.0 <= failures[1].detail["retryInSeconds"] < 1.5
    assert [e.attempt for e in events if e.kind == "task.failed"] == [3]
    # each retry's Job starts no earlier than its backoff allows
    created = [job.metadata.creation_timestamp.timestamp() for job in jobs]
    assert created[1] - created[0] >= 0.5 - 1.0  # creation timestamps have 1 s resolution


async def test_timeout_is_a_failed_attempt(operator: OperatorProcess, driver: RunDriver) -> None:
    await driver.publish(
        {
            "workflow": "slow",
            "version": 1,
            "taskTypes": {"slow": SLOW},
            "tasks": [{"key": "slow", "type": "slow", "timeoutSeconds": 2}],
        }
    )
    driver.create_run("t1", workflow="slow")
    body = await driver.wait_phase("t1", {"Succeeded", "Failed"}, timeout=120, operator=operator)
    assert body["status"]["phase"] == "Failed"
    [job] = driver.jobs("t1")
    assert job.spec.active_deadline_seconds == 2
    events = await history(driver, "t1", body)
    [failed] = [e for e in events if e.kind == "task.failed"]
    assert failed.detail["reason"] == "DeadlineExceeded"


async def test_cancel_stops_running_jobs_and_skips_the_rest(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "cancel",
            "version": 1,
            "taskTypes": {"slow": SLOW},
            "tasks": [
                {"key": "a", "type": "slow"},
                {"key": "b", "type": "slow"},
                {"key": "c", "type": "slow", "dependsOn": ["a", "b"]},
            ],
        }
    )
    driver.create_run("c1", workflow="cancel")
    await wait_until(lambda: len(driver.jobs("c1")) >= 2, timeout=60, what="c1's first two Jobs")
    assert len(driver.jobs("c1")) == 2
    driver.cancel("c1")
    body = await driver.wait_phase("c1", {"Succeeded", "Failed", "Cancelled"}, operator=operator)
    status = body["status"]
    assert status["phase"] == "Cancelled"
    assert {t["state"] for t in status["tasks"]} == {"cancelled"}
    assert status["counts"]["cancelled"] == 3
    cancelled = next(c for c in status["conditions"] if c["type"] == "Cancelled")
    assert cancelled["status"] == "True" and cancelled["reason"] == "CancelRequested"
    await wait_until(lambda: not driver.jobs("c1"), timeout=30, what="c1's Jobs deleted")
    events = await history(driver, "c1", body)
    assert not [e for e in events if e.kind == "task.dispatched" and e.task_key == "c"]


async def test_vanished_job_is_a_lost_attempt_and_is_retried(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "vanish",
            "version": 1,
            "taskTypes": {
                "slow": {
                    "image": "busybox:1.36",
                    "annotations": {"flowforge.io/simulate-duration": "4s"},
                }
            },
            "tasks": [{"key": "v", "type": "slow", "retries": 1}],
        }
    )
    driver.create_run("v1", workflow="vanish")
    [first] = await wait_until(lambda: driver.jobs("v1"), timeout=60, what="v1's first Job")
    driver.batch.delete_namespaced_job(
        first.metadata.name, driver.namespace, propagation_policy="Background"
    )
    body = await driver.wait_phase("v1", {"Succeeded", "Failed"}, operator=operator)
    assert body["status"]["phase"] == "Succeeded", body["status"]
    assert tasks(body)["v"]["attempt"] == 2
    events = await history(driver, "v1", body)
    [lost] = [e for e in events if e.kind == "task.attempt_failed"]
    assert lost.attempt == 1 and lost.detail["reason"] == "JobVanished"
    [job] = driver.jobs("v1")
    assert job.metadata.labels["flowforge.io/attempt"] == "2"
