"""A task's success read from its Pod (``domain/observed_pod.py``, ``Engine.on_pod_event``):
recorded at once for a Pod the Job controller counts, and for no other. Forged Pods are
ignored and counted; the Job watch stays the complete fallback."""

from __future__ import annotations

import asyncio
import copy
import uuid
from typing import Any

import pytest

from flowforge.domain.history import OUTCOME_KINDS, EventKind
from flowforge.domain.states import RunPhase, TaskState
from flowforge.operator import engine as engine_module
from flowforge.operator import launcher as launcher_module
from flowforge.operator import metrics
from flowforge.operator.engine import Engine
from flowforge.store.events import run_history
from tests.engine.conftest import NAMESPACE, Harness, engine_settings

pytestmark = pytest.mark.store

CHAIN: list[dict[str, Any]] = [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}]


def forged_pods(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("flowforge_forged_pods_total", {"reason": reason})
    return value or 0.0


def pod_successes() -> float:
    return metrics.REGISTRY.get_sample_value("flowforge_pod_successes_total") or 0.0


async def outcomes(harness: Harness, run_id: int) -> list[tuple[str, str | None, str]]:
    return [
        (e.kind, e.task_key, e.detail.get("message", ""))
        for e in await run_history(harness.pool, run_id)
        if e.kind in OUTCOME_KINDS
    ]


async def test_a_succeeded_pod_hands_off_before_its_job_says_so(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await harness.start("fromthepod", CHAIN)
    job = harness.job_of("a")
    before = pod_successes()

    await harness.engine.on_pod_event(harness.kube.job_pod(job), "ADDED")

    assert (await harness.states(run))["a"] == TaskState.SUCCEEDED
    assert harness.job_of("b") in harness.kube.active()  # handed off already
    assert pod_successes() - before == 1
    [(kind, task, message)] = await outcomes(harness, run.run_id)
    assert (kind, task) == (EventKind.TASK_SUCCEEDED, "a") and message.startswith(f"Pod {job}-")

    async def no_store(*_: Any, **__: Any) -> None:
        raise AssertionError("a Job whose outcome is recorded needs no store access")

    monkeypatch.setattr(harness.engine.runs, "by_uid", no_store)
    monkeypatch.setattr(harness.engine.launcher, "owns", no_store)
    complete = harness.kube.finish(job, succeeded=True)
    await harness.engine.on_job_event(complete, "MODIFIED")  # the Job says so a second later
    untracked = harness.kube.job_pod(job, tracked=False)  # the controller removed the finalizer
    await harness.engine.on_pod_event(untracked, "MODIFIED")
    monkeypatch.undo()

    assert len(await outcomes(harness, run.run_id)) == 1
    await harness.finish("b")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    assert pod_successes() - before == 1


def orphan(harness: Harness, job: str) -> dict[str, Any]:
    pod = harness.kube.job_pod(job)
    pod["metadata"]["ownerReferences"] = []
    return pod


def untracked(harness: Harness, job: str) -> dict[str, Any]:
    return harness.kube.job_pod(job, tracked=False)


def another_jobs_uid(harness: Harness, job: str) -> dict[str, Any]:
    """The attempt's Job named as owner, but with the uid of another Job (a copy of it)."""
    copied = copy.deepcopy(harness.kube.jobs[(NAMESPACE, job)])
    copied["metadata"] |= {"name": f"{job}-copy", "uid": str(uuid.uuid4())}
    harness.kube.jobs[(NAMESPACE, f"{job}-copy")] = copied
    pod = harness.kube.job_pod(f"{job}-copy")
    pod["metadata"]["ownerReferences"][0]["name"] = job
    return pod


def another_namespace(harness: Harness, job: str) -> dict[str, Any]:
    return harness.kube.job_pod(job, namespace="attacker")


def mislabelled(harness: Harness, job: str) -> dict[str, Any]:
    pod = harness.kube.job_pod(job)
    pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] = str(uuid.uuid4())
    return pod


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (orphan, "orphan"),
        (untracked, "untracked"),
        (another_jobs_uid, "uid"),
        (another_namespace, "namespace"),
        (mislabelled, "label"),
    ],
)
async def test_a_forged_pod_is_ignored_and_counted(
    harness: Harness, forge: Any, reason: str
) -> None:
    run = await harness.start(f"forged-{reason}", CHAIN)
    job = harness.job_of("a")
    counted, before = forged_pods(reason), pod_successes()

    pod = forge(harness, job)
    assert pod["status"]["phase"] == "Succeeded"  # it claims a success, with the run's labels
    await harness.engine.on_pod_event(pod, "ADDED")
    await harness.engine.on_pod_event(pod, None)  # a re-list replays it

    assert (await harness.states(run))["a"] == TaskState.RUNNING
    assert await outcomes(harness, run.run_id) == []
    assert forged_pods(reason) - counted == 2 and pod_successes() == before

    await harness.finish("a", succeeded=False)  # the run's own Job still decides
    assert (await harness.states(run))["a"] == TaskState.FAILED


async def test_a_pod_that_beat_the_deadline_is_a_success_the_job_calls_a_timeout(
    harness: Harness,
) -> None:
    """The Job controller syncs a Job at most once a second after its Pods change: a Pod that
    exits 0 within the last second before activeDeadlineSeconds is reported by the Job as
    DeadlineExceeded. The Pod's success was recorded first, and stays."""
    run = await harness.start("deadline", [{"key": "a", "timeoutSeconds": 60}])
    job = harness.job_of("a")
    await harness.engine.on_pod_event(harness.kube.job_pod(job), "ADDED")

    body = harness.kube.jobs[(NAMESPACE, job)]
    body["status"] = {
        "failed": 0,
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "DeadlineExceeded",
                "message": "Job was active longer than specified deadline",
            }
        ],
    }
    await harness.engine.on_job_event(copy.deepcopy(body), "MODIFIED")
    await harness.reconciler.pass_once()
    await harness.settle_background()

    assert [kind for kind, _, _ in await outcomes(harness, run.run_id)] == [
        EventKind.TASK_SUCCEEDED
    ]
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_a_restart_between_the_pods_success_and_the_store_write_records_it_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await harness.start("restarted", CHAIN)
    job = harness.job_of("a")
    pod = harness.kube.job_pod(job)

    async def crash(*_: Any, **__: Any) -> None:
        raise ConnectionError("the operator's process ended here")

    monkeypatch.setattr(engine_module, "record_outcome", crash)  # the store write
    with pytest.raises(ConnectionError):
        await harness.engine.on_pod_event(pod, "ADDED")
    monkeypatch.undo()
    assert await outcomes(harness, run.run_id) == []

    # a new process: the store and the cluster are the same, its memory is empty
    restarted = Engine(
        pool=harness.pool,
        kube=harness.kube,
        settings=engine_settings(),
        leadership=harness.engine.leadership,
    )
    before = pod_successes()
    try:
        # its watches list again: the Pod (its finalizer removed since) and the Job
        counted = harness.kube.job_pod(job, tracked=False)
        counted["metadata"]["uid"] = pod["metadata"]["uid"]
        await restarted.on_pod_event(counted, None)  # not a Job it recorded: the Job decides
        complete = harness.kube.finish(job, succeeded=True)
        await restarted.on_job_event(complete, None)
        await restarted.on_job_event(complete, "MODIFIED")
        await restarted.on_pod_event(counted, "MODIFIED")
        await harness.reconciler.pass_once()
        await asyncio.sleep(0)
    finally:
        await restarted.shutdown()

    assert [(kind, task) for kind, task, _ in await outcomes(harness, run.run_id)] == [
        (EventKind.TASK_SUCCEEDED, "a")
    ]
    assert pod_successes() == before
    assert harness.job_of("b") in harness.kube.active()


async def test_a_pod_seen_before_its_jobs_uid_is_stored_waits_for_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Job's uid comes back with its creation, before the store write of it: a Pod that
    succeeds in between is recorded once the write is done, not missed."""
    written, release = asyncio.Event(), asyncio.Event()
    record_jobs_created = launcher_module.record_jobs_created

    async def slow_write(*args: Any, **kwargs: Any) -> frozenset[tuple[str, int]]:
        written.set()
        await release.wait()
        return await record_jobs_created(*args, **kwargs)

    monkeypatch.setattr(launcher_module, "record_jobs_created", slow_write)
    starting = asyncio.create_task(harness.start("fast", [{"key": "a"}]))
    await asyncio.wait_for(written.wait(), timeout=10)
    seen = asyncio.create_task(
        harness.engine.on_pod_event(harness.kube.job_pod(harness.job_of("a")), "ADDED")
    )
    for _ in range(5):
        await asyncio.sleep(0)
    assert not seen.done()  # waiting for the store to hold the Job

    release.set()
    run = await starting
    await asyncio.wait_for(seen, timeout=10)
    assert (await harness.states(run))["a"] == TaskState.SUCCEEDED


async def test_a_job_whose_success_criteria_are_met_is_a_success(harness: Harness) -> None:
    """``SuccessCriteriaMet`` comes before ``Complete``; either is the Job's success."""
    run = await harness.start("criteria", CHAIN)
    job = harness.job_of("a")
    body = harness.kube.jobs[(NAMESPACE, job)]
    body["status"] = {
        "succeeded": 1,
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached"}
        ],
    }
    await harness.engine.on_job_event(copy.deepcopy(body), "MODIFIED")

    assert (await harness.states(run))["a"] == TaskState.SUCCEEDED
    assert harness.job_of("b") in harness.kube.active()


async def test_a_pod_still_running_or_failed_decides_nothing(harness: Harness) -> None:
    run = await harness.start("notyet", CHAIN)
    job = harness.job_of("a")
    await harness.engine.on_pod_event(harness.kube.job_pod(job, phase="Running"), "ADDED")
    await harness.engine.on_pod_event(
        harness.kube.job_pod(job, phase="Failed", exit_code=3), "MODIFIED"
    )
    await harness.engine.on_pod_event(harness.kube.job_pod(job), "DELETED")

    assert (await harness.states(run))["a"] == TaskState.RUNNING
    assert await outcomes(harness, run.run_id) == []
