"""What a reconcile pass reads of the Jobs, as engine logic against the fake port: only the
Jobs that have not succeeded are listed every pass (``status.successful=0``), so the
succeeded Jobs kept (``--job-ttl -1``) cost nothing; a success whose event was missed is
still found (one GET) and recorded; an orphan unfinished Job is still stopped; and the
succeeded Jobs are listed only for the TTL backstop, at most once per TTL (and after a change
of leader), which deletes a Job whose timer was lost within one TTL of its due time.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.states import RunPhase, TaskState
from flowforge.operator.reconciler import SUCCEEDED, UNSUCCEEDED, Reconciler
from flowforge.operator.runs import RunContext
from tests.engine.conftest import NAMESPACE, Harness
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

ONE_TASK: list[dict[str, Any]] = [{"key": "only"}]
CHAIN: list[dict[str, Any]] = [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}]


def selectors(harness: Harness) -> list[str | None]:
    return [call.field_selector for call in harness.kube.lists if call.kind == "jobs"]


async def finish_at(harness: Harness, context: RunContext, *, finished: datetime) -> str:
    """The run's only task succeeds at ``finished`` (its Job's completionTime), and the
    engine records it from the watch event."""
    name = context.job_name(task_key="only", attempt=1)
    job = harness.kube.finish(name, succeeded=True)
    stamp = finished.strftime("%Y-%m-%dT%H:%M:%SZ")
    harness.kube.jobs[(NAMESPACE, name)]["status"]["completionTime"] = stamp
    job["status"]["completionTime"] = stamp
    await harness.engine.on_job_event(job, "MODIFIED")
    await harness.settle_background()
    return name


async def test_a_pass_reads_none_of_the_succeeded_jobs_kept(harness: Harness) -> None:
    for n in range(20):  # --job-ttl -1 (the harness's): every succeeded Job is kept
        run = await harness.start(f"kept-{n}", ONE_TASK)
        job = harness.kube.finish(run.job_name(task_key="only", attempt=1), succeeded=True)
        await harness.engine.on_job_event(job, "MODIFIED")
    running = await harness.start("running", ONE_TASK)
    await harness.settle_background()
    harness.kube.lists.clear()
    reads = harness.kube.job_reads

    for _ in range(3):
        await harness.reconciler.pass_once()

    assert harness.kube.listed_jobs() == 3  # the running Job, once a pass
    assert selectors(harness) == [UNSUCCEEDED] * 3  # never the succeeded ones
    assert harness.kube.job_reads == reads  # and none read by name either
    assert len(harness.kube.jobs) == 21 and harness.kube.deleted == []
    assert (await harness.run(running)).phase is RunPhase.RUNNING


async def test_a_success_whose_event_was_missed_is_still_recorded(harness: Harness) -> None:
    run = await harness.start("missed", CHAIN)
    harness.kube.finish(harness.job_of("a"), succeeded=True)  # no event reaches the engine
    harness.kube.lists.clear()
    reads = harness.kube.job_reads

    await harness.reconciler.pass_once()
    await harness.settle_background()

    assert harness.kube.listed_jobs() == 0  # a's Job has succeeded: not listed
    assert harness.kube.job_reads == reads + 1  # read by name, its outcome recorded
    states = await harness.states(run)
    assert states["a"] == TaskState.SUCCEEDED and states["b"] == TaskState.RUNNING
    assert harness.kube.active() == [harness.job_of("b")]
    await harness.finish("b")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_a_vanished_job_is_still_a_lost_attempt(harness: Harness) -> None:
    run = await harness.start("vanished", ONE_TASK)
    del harness.kube.jobs[(NAMESPACE, harness.job_of("only"))]

    await harness.reconciler.pass_once()

    assert (await harness.run(run)).phase is RunPhase.FAILED  # no retries: the run fails


async def test_an_orphan_unfinished_job_is_still_stopped(harness: Harness) -> None:
    run = await harness.start("orphan", ONE_TASK)
    name = harness.job_of("only")
    job = dict(harness.kube.jobs[(NAMESPACE, name)])
    await harness.engine.cancel(run, reason="spec.cancel is true")
    assert harness.kube.deleted == [name]
    harness.kube.jobs[(NAMESPACE, name)] = job  # as if a crash had cut the deletion short

    await harness.reconciler.pass_once()

    assert harness.kube.deleted == [name, name]
    assert harness.kube.jobs == {}


async def test_the_backstop_lists_succeeded_jobs_once_per_ttl_and_deletes_them_when_due(
    harness: Harness,
) -> None:
    ttl = 5.0  # wide enough that the first two passes fall inside it on a loaded machine
    reconciler = Reconciler(harness.engine, interval=0.05)
    now = datetime.now(UTC)
    old = await finish_at(
        harness, await harness.start("old", ONE_TASK), finished=now - timedelta(hours=1)
    )
    fresh = await finish_at(harness, await harness.start("fresh", ONE_TASK), finished=now)
    # the TTL is set once the Jobs finished, so no timer of this process deletes them (as
    # after a restart, when the old process's timers are gone): the backstop must
    harness.engine.settings = dataclasses.replace(harness.engine.settings, job_ttl_seconds=ttl)
    harness.kube.lists.clear()

    listed = time.monotonic()  # at or before the listing the reconciler times its TTL from
    await reconciler.pass_once()  # the first pass lists them: the old one is long due
    assert old in harness.kube.deleted and fresh not in harness.kube.deleted
    assert selectors(harness) == [UNSUCCEEDED, SUCCEEDED]

    await reconciler.pass_once()  # within the TTL: not listed again
    assert selectors(harness) == [UNSUCCEEDED, SUCCEEDED, UNSUCCEEDED]

    async def deleted() -> bool:
        await reconciler.pass_once()
        return fresh in harness.kube.deleted

    await wait_until(deleted, what="the backstop deleted the fresh Job", timeout=3 * ttl)
    assert time.monotonic() - listed >= ttl  # by the next listing, one TTL after the first
    assert selectors(harness).count(SUCCEEDED) == 2
    assert harness.kube.jobs == {}
    reconciler.kick()  # this operator became the leader again: the old leader's timers are gone
    await reconciler.pass_once()
    assert selectors(harness).count(SUCCEEDED) == 3
