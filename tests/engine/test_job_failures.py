"""Failures that say why: Job creations the apiserver refuses (for good, or for now) and
Pods that never start, against the real store and the Kubernetes fake."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from flowforge.domain.states import RunPhase, TaskState
from flowforge.kube.errors import KubernetesRefusal, KubernetesUnavailable
from flowforge.kube.jobs import LABEL_TASK
from flowforge.operator.runs import RunContext
from flowforge.store.queries import latest_outcomes
from tests.engine.conftest import Harness
from tests.support.waiting import wait_until

PAIR: list[dict[str, Any]] = [{"key": "first"}, {"key": "second", "dependsOn": ["first"]}]
FAN_OUT: list[dict[str, Any]] = [{"key": "a"}, {"key": "b"}, {"key": "c"}]
INVALID = (
    'Job.batch "x" is invalid: spec.template.labels: Invalid value: "a b": a valid label '
    "must be an empty string or consist of alphanumeric characters"
)
QUOTA = (
    'jobs.batch "x" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1, '
    "used: count/jobs.batch=2, limited: count/jobs.batch=2"
)


def refuse(task_key: str, error: Exception) -> Any:
    def answer(manifest: Mapping[str, Any]) -> Exception | None:
        return error if manifest["metadata"]["labels"][LABEL_TASK] == task_key else None

    return answer


async def start_refused(
    harness: Harness, name: str, spec: list[dict[str, Any]], *, task_key: str, error: Exception
) -> RunContext:
    """Start a run whose ``task_key`` Jobs the apiserver answers with ``error``."""
    harness.kube.create_error = refuse(task_key, error)
    run = await harness.start(name, spec)
    await harness.settle_background()
    return run


async def test_an_invalid_job_fails_the_attempt_with_the_apiservers_message(
    harness: Harness,
) -> None:
    invalid = KubernetesRefusal(INVALID, status=422, reason="")
    run = await start_refused(harness, "invalid", PAIR, task_key="first", error=invalid)

    states = await harness.states(run)
    assert states == {"first": TaskState.FAILED, "second": TaskState.SKIPPED}
    outcome = (await latest_outcomes(harness.pool, run.run_id, ["first"]))["first"]
    assert outcome["reason"] == "JobRefused"
    assert "Invalid value" in outcome["message"]
    assert (await harness.run(run)).phase is RunPhase.FAILED
    failed = [e for e in harness.kube.events if e.reason == "TaskFailed"]
    assert failed and "JobRefused" in failed[0].message and "Invalid value" in failed[0].message
    assert harness.kube.created == []


async def test_a_refusal_is_retried_like_any_failed_attempt(harness: Harness) -> None:
    forbidden = KubernetesRefusal("pods are forbidden: violates PodSecurity", status=403, reason="")
    run = await start_refused(
        harness, "forbidden", [{"key": "a", "retries": 1}], task_key="a", error=forbidden
    )
    assert (await harness.states(run))["a"] == TaskState.READY  # waiting for its backoff
    assert "TaskRetrying" in harness.kube.reasons()
    harness.kube.create_error = None

    async def second_attempt_created() -> bool:
        return any("-a-2-" in name for name in harness.kube.created)

    await wait_until(second_attempt_created, what="attempt 2's Job")
    await harness.finish("a", attempt=2)
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_a_full_quota_delays_the_job_without_failing_it_or_other_tasks(
    harness: Harness,
) -> None:
    quota = KubernetesRefusal(QUOTA, status=403, reason="")
    tries: list[str] = []

    def refuse_c(manifest: Mapping[str, Any]) -> Exception | None:
        if manifest["metadata"]["labels"][LABEL_TASK] != "c":
            return None
        tries.append(manifest["metadata"]["name"])
        return quota

    harness.kube.create_error = refuse_c
    run = await harness.start("quota", FAN_OUT)
    await harness.settle_background()
    assert sorted(harness.kube.active()) == sorted(
        [harness.job_of("a"), harness.job_of("b")]
    )  # the others ran
    assert (await harness.states(run))["c"] == TaskState.RUNNING
    delayed = [e for e in harness.kube.events if e.reason == "JobCreationDelayed"]
    assert len(delayed) == 1 and "exceeded quota" in delayed[0].message and delayed[0].warning
    status = await harness.engine.status.project(run)
    task_c = next(task for task in status["tasks"] if task["name"] == "c")
    assert "exceeded quota" in task_c["message"]
    # several tries in the backoff (0.05 s, doubling to 0.2 s): one Event only, still running
    await wait_until(lambda: len(tries) >= 4, what="four tries of c's Job")
    assert harness.kube.reasons().count("JobCreationDelayed") == 1
    assert (await harness.states(run))["c"] == TaskState.RUNNING

    await harness.finish("a")
    harness.kube.create_error = None  # the quota frees

    async def created() -> bool:
        return any("-c-1-" in name for name in harness.kube.created)

    await wait_until(created, what="the Job")
    status = await harness.engine.status.project(run)
    assert next(task for task in status["tasks"] if task["name"] == "c")["message"] == ""
    await harness.finish("b")
    await harness.finish("c")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    assert "TaskRetrying" not in harness.kube.reasons()


async def test_an_unavailable_apiserver_delays_the_job(harness: Harness) -> None:
    outage = KubernetesUnavailable("503 Service Unavailable", status=503, reason="")
    run = await start_refused(harness, "outage", [{"key": "a"}], task_key="a", error=outage)
    assert (await harness.states(run))["a"] == TaskState.RUNNING
    assert "JobCreationDelayed" in harness.kube.reasons()
    harness.kube.create_error = None

    async def created() -> bool:
        return bool(harness.kube.created)

    await wait_until(created, what="the Job")
    await harness.finish("a")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_a_delayed_creation_of_a_cancelled_attempt_is_dropped(harness: Harness) -> None:
    quota = KubernetesRefusal(QUOTA, status=403, reason="")
    run = await start_refused(harness, "dropped", [{"key": "a"}], task_key="a", error=quota)
    await harness.engine.cancel(run, reason="spec.cancel is true")
    harness.kube.create_error = None
    await asyncio.sleep(0.3)  # past the next try
    assert harness.kube.created == []
    assert (await harness.run(run)).phase is RunPhase.CANCELLED


UNSCHEDULABLE = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity",
        }
    ],
}
IMAGE_PULL = {
    "phase": "Pending",
    "conditions": [{"type": "PodScheduled", "status": "True"}],
    "containerStatuses": [
        {
            "name": "task",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'pull "nope" failed'}},
        }
    ],
}


async def test_a_pod_that_cannot_be_scheduled_fails_after_the_pending_timeout(
    harness: Harness,
) -> None:
    run = await harness.start("stuck", PAIR, task_type={"pendingTimeoutSeconds": 5})
    job = harness.job_of("first")
    harness.kube.add_waiting_pod(job, status=UNSCHEDULABLE)
    await harness.reconciler.pass_once()  # not yet 5 s old
    assert (await harness.states(run))["first"] == TaskState.RUNNING
    # created at x.99 s, its creationTimestamp says x s: 5 s old to it, 4.01 s in fact,
    # and the timeout counts from the store's exact record of the creation
    await harness.age_job(run, job, seconds=4.01)
    harness.kube.age_job(job, seconds=5.01)
    await harness.reconciler.pass_once()
    assert (await harness.states(run))["first"] == TaskState.RUNNING

    await harness.age_job(run, job, seconds=6)
    await harness.reconciler.pass_once()
    await harness.settle_background()

    assert await harness.states(run) == {"first": TaskState.FAILED, "second": TaskState.SKIPPED}
    outcome = (await latest_outcomes(harness.pool, run.run_id, ["first"]))["first"]
    assert outcome["reason"] == "Unschedulable"
    assert "didn't match Pod's node affinity" in outcome["message"]
    assert job in harness.kube.deleted
    failed = [e for e in harness.kube.events if e.reason == "TaskFailed"]
    assert failed and "Unschedulable" in failed[0].message
    status = await harness.engine.status.project(run)
    messages = [c.get("message") or "" for c in status["conditions"]]
    assert any("Unschedulable" in text and "0/1 nodes" in text for text in messages)
    first = next(task for task in status["tasks"] if task["name"] == "first")
    assert first["message"].startswith("Unschedulable: the Pod of Job")


async def test_an_image_that_cannot_be_pulled_fails_with_its_reason(harness: Harness) -> None:
    run = await harness.start("pull", [{"key": "a", "retries": 1}])
    job = harness.job_of("a")
    harness.kube.add_waiting_pod(job, status=IMAGE_PULL)
    await harness.age_job(run, job, seconds=harness.engine.settings.pending_timeout_seconds + 1)
    await harness.engine.watchdog.check(run, harness.ref("a"))
    # a retry: ready until its backoff (50 ms on the event loop's clock) is over, then running
    assert (await harness.states(run))["a"] in (TaskState.READY, TaskState.RUNNING)
    outcome = (await latest_outcomes(harness.pool, run.run_id, ["a"]))["a"]
    assert (outcome["reason"], outcome["message"].endswith('pull "nope" failed')) == (
        "ImagePullBackOff",
        True,
    )


async def test_a_pod_that_started_is_not_failed_however_old(harness: Harness) -> None:
    run = await harness.start("slow", [{"key": "a"}], task_type={"pendingTimeoutSeconds": 1})
    job = harness.job_of("a")
    harness.kube.add_waiting_pod(job, status=UNSCHEDULABLE)
    harness.kube.add_waiting_pod(job, status={"phase": "Running"})  # a newer one runs
    await harness.age_job(run, job, seconds=60)
    await harness.reconciler.pass_once()
    assert (await harness.states(run))["a"] == TaskState.RUNNING
    assert job not in harness.kube.deleted
