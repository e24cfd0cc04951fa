"""Outcomes only from the run's own Jobs: copies of its Jobs and forged Pods change nothing.

Each attack is one a tenant could try with nothing but the right to create Jobs and Pods in
some namespace: a copy of a run's Job (same labels, annotations and owner) elsewhere, a Job
with the run's labels beside the real one, a Job squatting the attempt's name, and a Pod
labelled ``job-name`` of the run's Job. The engine and the reconciler must take none of them
for the run's Job, and say so on the run (a few times at most).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

from flowforge.domain.history import OUTCOME_KINDS, EventKind
from flowforge.domain.states import RunPhase, TaskState
from flowforge.operator import metrics
from flowforge.operator.launcher import FORGERY_NOTICES_PER_RUN, ForgeryNotices
from flowforge.store.events import run_history
from flowforge.store.queries import recorded_jobs
from tests.engine.conftest import NAMESPACE, Harness
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

ATTACKER = "attacker"
ONE_TASK: list[dict[str, Any]] = [{"key": "only", "retries": 1}]


def forged_count(act: str) -> float:
    value = metrics.REGISTRY.get_sample_value("flowforge_forged_jobs_total", {"act": act})
    return value or 0.0


def forged_notices(harness: Harness) -> list[str]:
    return [e.message for e in harness.kube.events if e.reason == "ForgedJob" and e.warning]


async def outcome_events(harness: Harness, run_id: int) -> list[tuple[str, str | None, Any]]:
    return [
        (e.kind, e.task_key, e.detail.get("exitCode"))
        for e in await run_history(harness.pool, run_id)
        if e.kind in OUTCOME_KINDS
    ]


def same_namespace_copy(harness: Harness, name: str, *, new_name: str) -> dict[str, Any]:
    """A Job beside the run's, with its labels, annotations and owner, under another name."""
    original = harness.kube.jobs[(NAMESPACE, name)]
    forged = copy.deepcopy(original) | {"status": {}}
    forged["metadata"]["name"] = new_name
    forged["metadata"]["uid"] = str(uuid.uuid4())
    harness.kube.jobs[(NAMESPACE, new_name)] = forged
    return forged


async def test_a_copy_in_another_namespace_changes_no_outcome_and_is_reported_once(
    harness: Harness,
) -> None:
    run = await harness.start("copied", ONE_TASK)
    name = harness.job_of("only")
    outcomes_before, vanished_before = forged_count("outcome"), forged_count("vanished")

    harness.kube.copy_job(name, namespace=ATTACKER)
    failed = harness.kube.finish(name, succeeded=False, exit_code=9, namespace=ATTACKER)
    await harness.engine.on_job_event(failed, "MODIFIED")
    await harness.engine.on_job_event(failed, None)  # a re-list replays it
    del harness.kube.jobs[(ATTACKER, name)]
    await harness.engine.on_job_event(failed | {"status": {}}, "DELETED")  # "vanished"
    await harness.settle_background()

    assert (await harness.states(run))["only"] == TaskState.RUNNING
    assert await outcome_events(harness, run.run_id) == []
    assert forged_count("outcome") - outcomes_before == 2
    assert forged_count("vanished") - vanished_before == 1
    [notice] = forged_notices(harness)  # one forged Job: one Event, however often it is seen
    assert f"{ATTACKER}/{name}" in notice and "another namespace" in notice
    assert "only attempt 1" in notice

    await harness.finish("only")  # the run's own Job still decides
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_a_job_with_the_runs_labels_but_another_uid_changes_no_outcome(
    harness: Harness,
) -> None:
    run = await harness.start("beside", ONE_TASK)
    name = harness.job_of("only")
    forged = same_namespace_copy(harness, name, new_name="beside-only-forged")

    finished = harness.kube.finish(forged["metadata"]["name"], succeeded=True)
    await harness.engine.on_job_event(finished, "MODIFIED")
    del harness.kube.jobs[(NAMESPACE, "beside-only-forged")]
    await harness.engine.on_job_event(finished | {"status": {}}, "DELETED")
    await harness.settle_background()

    assert (await harness.states(run))["only"] == TaskState.RUNNING
    assert await outcome_events(harness, run.run_id) == []
    [notice] = forged_notices(harness)
    assert "its uid is not the one recorded" in notice

    await harness.finish("only", succeeded=False)  # the run's own Job still decides
    assert await outcome_events(harness, run.run_id) == [
        (EventKind.TASK_ATTEMPT_FAILED, "only", None)
    ]


async def test_the_reconciler_neither_deletes_nor_reads_a_copy(harness: Harness) -> None:
    run = await harness.start("orphans", ONE_TASK)
    name = harness.job_of("only")
    harness.kube.copy_job(name, namespace=ATTACKER)  # unfinished, in another namespace
    same_namespace_copy(harness, name, new_name="orphans-only-forged")
    await harness.finish("only")  # the attempt is over: its Jobs would be cleaned up

    await harness.reconciler.pass_once()
    await harness.settle_background()

    assert (ATTACKER, name) in harness.kube.jobs
    assert (NAMESPACE, "orphans-only-forged") in harness.kube.jobs
    assert harness.kube.deleted == []
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    assert len(forged_notices(harness)) == 2  # one per forged Job


def squat(harness: Harness, attempts: int) -> list[str]:
    """Before each of the first ``attempts`` Job creations, someone creates a Job of that
    name first, not owned by the run (the name is predictable from the run's uid)."""
    squatted: list[str] = []

    async def squat_first(manifest: Mapping[str, Any]) -> None:
        if len(squatted) < attempts:
            metadata = manifest["metadata"]
            squatted.append(metadata["name"])
            job = copy.deepcopy(dict(manifest)) | {"status": {}}
            job["metadata"]["ownerReferences"] = []
            job["metadata"]["uid"] = str(uuid.uuid4())
            harness.kube.jobs[(metadata["namespace"], metadata["name"])] = job

    harness.kube.before_create = squat_first
    return squatted


async def attempt_failures(harness: Harness, run_id: int) -> list[tuple[str, int | None, str]]:
    return [
        (e.kind, e.attempt, e.detail["reason"])
        for e in await run_history(harness.pool, run_id)
        if e.kind in (EventKind.TASK_ATTEMPT_FAILED, EventKind.TASK_FAILED)
    ]


async def test_a_squatter_with_the_attempts_name_is_never_adopted_and_does_not_hang_it(
    harness: Harness,
) -> None:
    squatted = squat(harness, 1)
    run = await harness.start("squat", ONE_TASK)
    await harness.settle_background()
    [name] = squatted

    finished = harness.kube.finish(name, succeeded=True)  # the squatter "succeeds"
    await harness.engine.on_job_event(finished, "MODIFIED")
    await harness.reconciler.pass_once()  # neither adopted nor deleted
    await harness.settle_background()

    # the attempt failed at once, saying why; its retry's Job has a name of its own
    assert await attempt_failures(harness, run.run_id) == [
        (EventKind.TASK_ATTEMPT_FAILED, 1, "JobNameTaken")
    ]
    await wait_until(  # the backoff (0.05 s) wakes the run up
        lambda: any("-only-2-" in created for created in harness.kube.created),
        what="attempt 2's Job",
    )
    assert not [
        e
        for e in await outcome_events(harness, run.run_id)
        if e[0] != EventKind.TASK_ATTEMPT_FAILED
    ]
    retry = harness.job_of("only", attempt=2)
    assert retry != name and retry in harness.kube.created
    recorded = await recorded_jobs(harness.pool, run.run_id)
    assert recorded == {("only", 2): harness.kube.jobs[(NAMESPACE, retry)]["metadata"]["uid"]}
    assert (NAMESPACE, name) in harness.kube.jobs and harness.kube.deleted == []
    [notice] = forged_notices(harness)
    assert "the run is not its controller owner" in notice
    await harness.finish("only", attempt=2)
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_squatting_every_attempts_name_fails_the_task_instead_of_hanging_it(
    harness: Harness,
) -> None:
    squatted = squat(harness, 2)  # ONE_TASK allows one retry: two attempts
    run = await harness.start("squat-all", ONE_TASK)

    async def task_failed() -> bool:
        return (await harness.states(run))["only"] == TaskState.FAILED

    await wait_until(task_failed, what="the task's failure")  # after the retry's backoff

    assert len(squatted) == 2
    assert await attempt_failures(harness, run.run_id) == [
        (EventKind.TASK_ATTEMPT_FAILED, 1, "JobNameTaken"),
        (EventKind.TASK_FAILED, 2, "JobNameTaken"),
    ]
    assert (await harness.run(run)).phase is RunPhase.FAILED
    assert await recorded_jobs(harness.pool, run.run_id) == {}
    assert harness.kube.deleted == []


async def test_a_job_put_in_place_of_a_vanished_one_is_no_outcome_of_it(
    harness: Harness,
) -> None:
    run = await harness.start("replaced", ONE_TASK)
    name = harness.job_of("only")
    forged = same_namespace_copy(harness, name, new_name=name)  # same name, a new uid
    harness.kube.finish(name, succeeded=True)

    await harness.reconciler.pass_once()

    history = await run_history(harness.pool, run.run_id)
    [lost] = [e for e in history if e.kind == EventKind.TASK_ATTEMPT_FAILED]
    assert lost.detail["reason"] == "JobVanished"  # the run's Job is gone; its copy is no proof
    assert not [e for e in history if e.kind == EventKind.TASK_SUCCEEDED]
    assert harness.kube.jobs[(NAMESPACE, name)]["metadata"]["uid"] == forged["metadata"]["uid"]


async def test_a_pod_with_a_forged_job_name_label_does_not_set_the_exit_code(
    harness: Harness,
) -> None:
    run = await harness.start("pod", [{"key": "only"}])
    name = harness.job_of("only")
    failed = harness.kube.finish(name, succeeded=False, exit_code=3)  # the Job's own Pod
    harness.kube.add_pod(NAMESPACE, job_name=name, exit_code=0)  # newer, anyone's
    harness.kube.add_pod(NAMESPACE, job_name=name, exit_code=7)

    await harness.engine.on_job_event(failed, "MODIFIED")

    assert await outcome_events(harness, run.run_id) == [(EventKind.TASK_FAILED, "only", 3)]
    history = await run_history(harness.pool, run.run_id)
    [final] = [e for e in history if e.kind == EventKind.TASK_FAILED]
    assert final.detail["reason"] == "NonZeroExitCode" and "exit code 3" in final.detail["message"]


async def test_many_forged_jobs_post_a_bounded_number_of_events(harness: Harness) -> None:
    run = await harness.start("flood", ONE_TASK)
    name = harness.job_of("only")
    before = forged_count("outcome")

    for n in range(FORGERY_NOTICES_PER_RUN + 7):
        harness.kube.copy_job(name, namespace=f"{ATTACKER}-{n}")
        job = harness.kube.finish(name, succeeded=True, namespace=f"{ATTACKER}-{n}")
        await harness.engine.on_job_event(job, "MODIFIED")
    await harness.settle_background()

    assert forged_count("outcome") - before == FORGERY_NOTICES_PER_RUN + 7  # all counted
    assert len(forged_notices(harness)) == FORGERY_NOTICES_PER_RUN  # a few reported
    assert (await harness.states(run))["only"] == TaskState.RUNNING


def test_forgery_notices_are_once_per_job_and_a_few_per_run_an_hour() -> None:
    now = [0.0]
    notices = ForgeryNotices(clock=lambda: now[0])

    assert notices.allow(run_id=1, job_key="a")
    assert not notices.allow(run_id=1, job_key="a")
    allowed = [notices.allow(run_id=1, job_key=f"b{n}") for n in range(FORGERY_NOTICES_PER_RUN)]
    assert allowed == [True] * (FORGERY_NOTICES_PER_RUN - 1) + [False]
    assert notices.allow(run_id=2, job_key="c")  # another run has its own allowance
    now[0] = 3601.0
    assert notices.allow(run_id=1, job_key="d")  # the window moved on
