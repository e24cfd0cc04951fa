"""Task types that queue through Kueue, on the real control plane, PostgreSQL, operator and
Kueue: admission under a quota, Admitting never shown as running, eviction without a failed
attempt, and the admission timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from flowforge.store.events import run_history
from flowforge.store.runs import find_run
from tests.plugins.kueue import Kueue
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.support.job_times import most_at_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster


def step(*, queue: str, seconds: int, cpu: str = "1", **extra: Any) -> dict[str, Any]:
    return {
        "image": "busybox:1.36",
        "command": ["true"],
        "annotations": {"flowforge.io/simulate-duration": f"{seconds}s"},
        "resources": {"requests": {"cpu": cpu}},
        "queueName": queue,
        **extra,
    }


def _time(value: Any) -> float:
    assert isinstance(value, datetime), value
    return value.timestamp()


# how long the operator may take to see that Kueue suspended a Job and re-project the
# run's status (watch event, store move, 0.1 s coalescing, status patch), plus the second
# that the suspension's whole-second timestamp (lastTransitionTime, creationTimestamp) may
# put it earlier than it was
PROPAGATION_SECONDS = 3.0 + 1.0

Sample = tuple[float, dict[str, Any], dict[str, float | None]]


def _suspended_since(job: Any, *, now: float) -> float | None:
    """When the Job was suspended (None: it is not), from its Suspended condition: since
    its creation when it has none yet, just now when it still says resumed."""
    if not job.spec.suspend:
        return None
    for condition in job.status.conditions or []:
        if condition.type == "Suspended":
            return _time(condition.last_transition_time) if condition.status == "True" else now
    return _time(job.metadata.creation_timestamp)


async def _sample_until_finished(
    driver: RunDriver, name: str, *, timeout: float, operator: OperatorProcess
) -> list[Sample]:
    """Until the run finishes (at most every 0.2 s): when, its status, and since when each of its
    Jobs has been suspended (read right after the status)."""
    samples: list[Sample] = []

    def sampled_finished() -> bool:
        moment = time.time()
        status = driver.run(name).get("status") or {}
        suspended = {
            job.metadata.labels["flowforge.io/task"]: _suspended_since(job, now=time.time())
            for job in driver.jobs(name)
        }
        samples.append((moment, status, suspended))
        return status.get("phase") in ("Succeeded", "Failed", "Cancelled")

    await wait_until(
        sampled_finished, timeout=timeout, what=f"run {name} to finish", operator=operator
    )
    return samples


def _never_shows_suspended_as_running(samples: list[Sample]) -> None:
    """No status shows running a task whose Job had been suspended for longer than the
    operator needs to notice (a Job created suspended has been so since its creation)."""
    for moment, status, suspended in samples:
        for task in status.get("tasks") or []:
            since = suspended.get(task["name"])
            if task["state"] == "running" and since is not None:
                assert moment - since < PROPAGATION_SECONDS, (moment - since, task, status)


async def test_fan_out_runs_two_at_a_time_under_a_two_cpu_quota(
    kueue: Kueue,
    operators: Callable[..., OperatorProcess],
    driver: RunDriver,
) -> None:
    queue = kueue.queue(namespace=driver.namespace, cpu="2")
    operator = operators()
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    # timeoutSeconds 6 < the ~9 s the last pair waits in the queue: it counts from admission
    await driver.publish(
        {
            "workflow": "fan",
            "version": 1,
            "taskTypes": {"one-cpu": step(queue=queue, seconds=3)},
            "tasks": [
                {"key": f"part-{index}", "type": "one-cpu", "timeoutSeconds": 6}
                for index in range(6)
            ],
        }
    )
    driver.create_run("wide", workflow="fan")
    samples = await _sample_until_finished(driver, "wide", timeout=120, operator=operator)
    final = samples[-1][1]
    assert final["phase"] == "Succeeded", final
    assert all(task["attempt"] == 1 for task in final["tasks"]), final["tasks"]
    _never_shows_suspended_as_running(samples)
    assert max(status.get("counts", {}).get("running", 0) for _, status, _ in samples) <= 2
    # while the first pair ran, the others were shown admitting, in counts and progress
    admitting = [s for _, s, _ in samples if s.get("counts", {}).get("admitting")]
    assert admitting, samples[:5]
    assert any("admitting" in status.get("progress", "") for status in admitting)
    assert any(task["state"] == "admitting" for s in admitting for task in s.get("tasks") or [])

    # the run ends when its last Pod succeeds, about a second before the Job controller
    # marks that Job complete
    def completed() -> list[Any] | None:
        jobs = driver.jobs("wide")
        return jobs if all(job.status.completion_time for job in jobs) else None

    jobs = await wait_until(completed, timeout=30, what="every Job of wide marked complete")
    assert len(jobs) == 6
    for job in jobs:
        assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == queue
    # admitted = unsuspended: the Job controller resets startTime then
    intervals = [(_time(job.status.start_time), _time(job.status.completion_time)) for job in jobs]
    assert most_at_once(intervals) == 2, intervals
    first_admitted = min(start for start, _ in intervals)
    last_admitted = max(start for start, _ in intervals)
    assert last_admitted - first_admitted >= 5, intervals  # three waves of ~3 s each
    reasons = {event.reason for event in driver.events("wide")}
    assert "TaskAdmitted" in reasons


async def test_a_preempted_job_is_readmitted_without_a_failed_attempt(
    kueue: Kueue,
    operators: Callable[..., OperatorProcess],
    driver: RunDriver,
) -> None:
    queue = kueue.queue(namespace=driver.namespace, cpu="1", preemption=True)
    for name, value in (("ff-low", 10), ("ff-high", 1000)):
        kueue.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    operator = operators()
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    await driver.publish(
        {
            "workflow": "low",
            "version": 1,
            "workloadPriorityClass": "ff-low",
            "queueName": queue,
            "taskTypes": {"slow": step(queue=queue, seconds=6)},
            "tasks": [{"key": "batch", "type": "slow"}],
        }
    )
    await driver.publish(
        {
            "workflow": "high",
            "version": 1,
            "taskTypes": {"urgent": step(queue=queue, seconds=2, workloadPriorityClass="ff-high")},
            "tasks": [{"key": "hotfix", "type": "urgent"}],
        }
    )
    driver.create_run("low-1", workflow="low")
    await wait_until(
        lambda: any(job.spec.suspend is False for job in driver.jobs("low-1")),
        timeout=60,
        what="low-1's Job admitted (unsuspended)",
        operator=operator,
    )
    (low_job,) = driver.jobs("low-1")
    assert low_job.metadata.labels["kueue.x-k8s.io/priority-class"] == "ff-low"
    first_uid = low_job.metadata.uid
    driver.create_run("high-1", workflow="high")
    low_samples_task = asyncio.create_task(
        _sample_until_finished(driver, "low-1", timeout=120, operator=operator)
    )
    high = await driver.wait_phase("high-1", {"Succeeded", "Failed"}, operator=operator)
    assert high["status"]["phase"] == "Succeeded", high["status"]
    samples = await low_samples_task
    final = samples[-1][1]
    assert final["phase"] == "Succeeded", final
    (task,) = final["tasks"]
    assert task["attempt"] == 1, task  # the eviction was not a failed attempt
    _never_shows_suspended_as_running(samples)
    # after the preemption the low task was admitting again, not running
    assert any(
        status.get("counts", {}).get("admitting") and suspended.get("batch")
        for _, status, suspended in samples
    )
    (low_job,) = driver.jobs("low-1")
    assert low_job.metadata.uid == first_uid  # the same Job, admitted again
    reasons = [event.reason for event in driver.events("low-1")]
    assert "TaskEvicted" in reasons and "TaskFailed" not in reasons, reasons
    uid = driver.run("low-1")["metadata"]["uid"]
    run = await find_run(driver.pool, namespace=driver.namespace, name="low-1", uid=uid)
    kinds = [event.kind for event in await run_history(driver.pool, run.id)]
    assert "task.evicted" in kinds and "task.attempt_failed" not in kinds, kinds
    assert kinds.count("task.admitted") >= 2, kinds


async def test_admission_timeout_fails_a_job_kueue_never_admits(
    kueue: Kueue,
    operators: Callable[..., OperatorProcess],
    driver: RunDriver,
) -> None:
    queue = kueue.queue(namespace=driver.namespace, cpu="1")
    operator = operators()
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    await driver.publish(
        {
            "workflow": "too-big",
            "version": 1,
            "taskTypes": {"huge": step(queue=queue, seconds=1, cpu="4", admissionTimeoutSeconds=3)},
            "tasks": [{"key": "train", "type": "huge"}],
        }
    )
    driver.create_run("big-1", workflow="too-big")
    body = await driver.wait_phase("big-1", {"Succeeded", "Failed"}, timeout=60, operator=operator)
    status = body["status"]
    assert status["phase"] == "Failed", status
    (task,) = status["tasks"]
    assert task["state"] == "failed"
    assert task["message"].startswith("AdmissionTimeout: "), task
    assert "not admitted by Kueue" in task["message"] and queue in task["message"], task
    assert "not admitted by Kueue" in status["message"], status
    # the Job that held its place in the queue is gone
    await wait_until(
        lambda: not driver.jobs("big-1"),
        timeout=30,
        what=lambda: f"big-1's Jobs gone: {[job.metadata.name for job in driver.jobs('big-1')]}",
    )
