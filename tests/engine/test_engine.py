"""The engine's decisions and effects without a cluster: real PostgreSQL, fake Kubernetes.

Each case is one the cluster cannot stage on demand: a crash between a commit and the Job
it decided, a cancel landing between a dispatch and its Job, a Job that vanishes, a lease
lost in the middle of recording an outcome, an outcome seen twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest

from flowforge.domain.event_series import COMBINED_PREFIX, SIMILAR_BEFORE_SERIES
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskRole, TaskState
from flowforge.store.connection import Pool
from flowforge.store.errors import StaleEpochError
from flowforge.store.events import run_history
from tests.engine.conftest import Harness, engine_settings, open_harness
from tests.engine.fake_clock import FakeClock
from tests.support.waiting import wait_until
from tests.support.workflows import SAGA

pytestmark = pytest.mark.store

DIAMOND: list[dict[str, Any]] = [
    {"key": "extract"},
    {"key": "clean", "dependsOn": ["extract"]},
    {"key": "enrich", "dependsOn": ["extract"]},
    {"key": "load", "dependsOn": ["clean", "enrich"]},
]


async def test_a_diamond_runs_each_task_once_its_upstreams_succeeded(harness: Harness) -> None:
    run = await harness.start("diamond", DIAMOND)
    assert [task for _, task in harness.roles_created()] == ["extract"]

    await harness.finish("extract")
    assert sorted(task for _, task in harness.roles_created()[1:]) == ["clean", "enrich"]
    await harness.finish("clean")
    assert len(harness.kube.created) == 3  # load waits for enrich too
    await harness.finish("enrich")
    await harness.finish("load")

    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED

    def shown() -> Any:
        return harness.kube.runs[("team-a", "diamond")].get("status", {}).get("phase")

    await wait_until(lambda: shown() == "Succeeded", what="the status")  # written after 0.1 s
    assert harness.kube.reasons().count("TaskStarted") == 4
    assert "RunSucceeded" in harness.kube.reasons()


async def test_an_outcome_seen_twice_changes_nothing_the_second_time(harness: Harness) -> None:
    run = await harness.start("twice", DIAMOND)
    job = harness.kube.finish(harness.job_of("extract"), succeeded=True)

    await harness.engine.on_job_event(job, "MODIFIED")
    await harness.engine.on_job_event(job, None)  # a 410 re-list replays it
    await harness.reconciler.pass_once()  # and the reconciler finds it finished

    assert sorted(harness.kube.created) == sorted(set(harness.kube.created))
    assert len(harness.kube.created) == 3
    history = await run_history(harness.pool, run.run_id)
    assert [e.task_key for e in history if e.kind == EventKind.TASK_SUCCEEDED] == ["extract"]


async def test_a_crash_between_the_commit_and_the_job_is_repaired_by_the_reconciler(
    harness: Harness,
) -> None:
    run = await harness.start("crash", DIAMOND)
    harness.kube.fail_creates = 2  # the dependents' Jobs: the process "dies" after the commit
    job = harness.kube.finish(harness.job_of("extract"), succeeded=True)
    with pytest.raises(ConnectionError):
        await harness.engine.on_job_event(job, "MODIFIED")
    assert (await harness.states(run))["clean"] == TaskState.RUNNING
    assert len(harness.kube.created) == 1

    await harness.reconciler.pass_once()

    assert sorted(task for _, task in harness.roles_created()) == ["clean", "enrich", "extract"]
    await harness.finish("clean")
    await harness.finish("enrich")
    await harness.finish("load")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_a_cancel_between_the_dispatch_and_the_job_deletes_the_job_it_missed(
    harness: Harness,
) -> None:
    run = await harness.start("race", DIAMOND)
    cancelled: list[bool] = []

    async def cancel_first(manifest: Mapping[str, Any]) -> None:
        if not cancelled:  # the cancel commits before the dependents' Jobs exist
            cancelled.append(True)
            await harness.engine.cancel(run, reason="spec.cancel is true")

    harness.kube.before_create = cancel_first
    await harness.finish("extract")

    states = await harness.states(run)
    assert states["clean"] == states["enrich"] == TaskState.CANCELLED
    clean, enrich = harness.job_of_created("clean"), harness.job_of_created("enrich")
    assert clean in harness.kube.deleted and enrich in harness.kube.deleted
    assert (await harness.run(run)).phase is RunPhase.CANCELLED
    assert harness.kube.active() == []


async def test_a_job_created_after_the_sweep_is_not_cleaned_up_as_an_orphan(
    harness: Harness,
) -> None:
    run = await harness.start("late", [{"key": "first"}, {"key": "second", "dependsOn": ["first"]}])

    async def hand_off_now() -> None:
        # between the pass's sweep (second: pending) and its Job listing: first succeeds
        # and second's Job is created, so the listing holds a Job the sweep did not know
        harness.kube.before_list_jobs = None
        await harness.finish("first")

    harness.kube.before_list_jobs = hand_off_now
    await harness.reconciler.pass_once()

    second = harness.job_of("second")
    assert second not in harness.kube.deleted
    assert harness.kube.active() == [second]
    assert (await harness.states(run))["second"] == TaskState.RUNNING
    await harness.finish("second")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED


async def test_a_vanished_job_is_a_lost_attempt_and_is_retried(harness: Harness) -> None:
    run = await harness.start("vanish", [{"key": "only", "retries": 1}])
    name = harness.job_of("only")
    del harness.kube.jobs[("team-a", name)]  # gone without a word (deleted by hand)

    await harness.reconciler.pass_once()
    # the backoff (0.05 s) wakes the run up and the second attempt's Job is created
    await wait_until(
        lambda: any("-only-2-" in name for name in harness.kube.created), what="attempt 2's Job"
    )

    assert (await harness.states(run))["only"] == TaskState.RUNNING
    await harness.finish("only", attempt=2)
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    history = await run_history(harness.pool, run.run_id)
    failed = [e for e in history if e.kind == EventKind.TASK_ATTEMPT_FAILED]
    assert [e.detail["reason"] for e in failed] == ["JobVanished"]


async def test_a_failed_saga_is_undone_one_compensator_at_a_time_last_first(
    harness: Harness,
) -> None:
    run = await harness.start("saga", SAGA)
    await harness.finish("reserve")
    await harness.finish("charge")
    await harness.finish("ship", succeeded=False)

    assert harness.kube.active() == [harness.job_of("refund")]  # only one at a time
    await harness.finish("refund")
    assert harness.kube.active() == [harness.job_of("release")]
    await harness.finish("release")

    compensators = [task for role, task in harness.roles_created() if role == "compensation"]
    assert compensators == ["refund", "release"]
    record = await harness.run(run)
    assert record.phase is RunPhase.FAILED and not record.compensating
    states = await harness.states(run)
    assert states["refund"] == states["release"] == CompensationState.SUCCEEDED
    reasons = harness.kube.reasons()
    assert reasons.index("RollbackStarted") < reasons.index("CompensationStarted")
    assert reasons[-1] == "RunFailed"


async def test_a_rollback_resumes_after_a_restart_from_the_store(harness: Harness) -> None:
    run = await harness.start("resume", SAGA)
    await harness.finish("reserve")
    await harness.finish("charge")
    harness.kube.fail_creates = 1  # the first compensator's Job: the operator "dies"
    job = harness.kube.finish(harness.job_of("ship"), succeeded=False)
    with pytest.raises(ConnectionError):
        await harness.engine.on_job_event(job, "MODIFIED")

    await harness.reconciler.pass_once()  # a new leader's first pass
    assert harness.kube.active() == [harness.job_of("refund")]
    await harness.finish("refund")
    await harness.finish("release")
    assert (await harness.run(run)).phase is RunPhase.FAILED


async def test_a_lease_lost_in_the_middle_of_a_record_changes_nothing(harness: Harness) -> None:
    run = await harness.start("deposed", DIAMOND)
    async with harness.pool.connection() as connection:
        # another operator took over: the epoch moved on
        await connection.execute(
            "UPDATE flowforge_lease SET epoch = epoch + 1, holder = 'someone-else'"
        )
    job = harness.kube.finish(harness.job_of("extract"), succeeded=True)

    with pytest.raises(StaleEpochError):
        await harness.engine.on_job_event(job, "MODIFIED")

    assert (await harness.states(run))["extract"] == TaskState.RUNNING
    assert len(harness.kube.created) == 1
    history = await run_history(harness.pool, run.run_id)
    assert not [e for e in history if e.kind == EventKind.TASK_SUCCEEDED]


async def test_a_deleted_run_skips_its_rollback_and_finishes_cancelled(harness: Harness) -> None:
    run = await harness.start("deleted", SAGA)
    await harness.finish("reserve")
    del harness.kube.runs[("team-a", "deleted")]

    await harness.engine.run_gone(run)

    record = await harness.run(run)
    assert record.phase is RunPhase.CANCELLED
    states = await harness.states(run)
    assert states["release"] == states["refund"] == CompensationState.SKIPPED
    assert not [role for role, _ in harness.roles_created() if role == TaskRole.COMPENSATION]


async def test_a_wide_run_posts_the_first_starts_alone_and_counts_the_rest_in_one_event(
    harness: Harness,
) -> None:
    width = SIMILAR_BEFORE_SERIES + 15
    run = await harness.start("wide", [{"key": f"t{n:02d}"} for n in range(width)])
    await harness.settle_background()

    assert len(harness.kube.created) == width
    assert harness.kube.reasons().count("TaskStarted") == SIMILAR_BEFORE_SERIES
    await harness.engine.notifier.flush_series(run, "TaskStarted")  # the flush timer's work
    [(key, (reason, message, count))] = harness.kube.event_series.items()
    assert key[1].startswith(f"wide.{run.uid[:8]}.taskstarted.")
    assert (reason, count) == ("TaskStarted", width - SIMILAR_BEFORE_SERIES)
    assert message.startswith(COMBINED_PREFIX) and re.search(r"\bt\d\d\b", message)


async def test_a_finished_run_seen_again_is_only_re_projected_when_it_shows_another_phase(
    store: Pool,
) -> None:
    """The events after a run's end (its final status patch, its finalizer's removal) are
    answered from the remembered final phase, not the store; its last projection uses the
    context the outcome had (the run is no longer cached). A view showing another phase is
    re-projected, but not within a reconciler's interval of the final patch (a view from
    before it: a watch event handled late, a LIST page read before it)."""
    clock = FakeClock()
    async with open_harness(store, settings=engine_settings(), clock=clock) as harness:
        await _seen_again(harness, clock)


async def _seen_again(harness: Harness, clock: FakeClock) -> None:
    run = await harness.start("seen-again", [{"key": "only"}])

    async def no_store_read(*_: Any, **__: Any) -> None:
        raise AssertionError("a finished run was read from the store again")

    harness.engine.runs.by_id = no_store_read  # type: ignore[method-assign]
    await harness.finish("only")
    body = harness.kube.runs[("team-a", "seen-again")]
    await wait_until(lambda: body.get("status", {}).get("phase") == "Succeeded", what="status")
    await wait_until(lambda: harness.engine.status.pending() == 0, what="the status writer")
    patches = len(harness.kube.status_patches)
    harness.engine.runs.ensure = no_store_read  # type: ignore[method-assign]
    await harness.engine.start_run(body)
    assert harness.engine.status.pending() == 0  # it shows its final phase: nothing to patch
    assert len(harness.kube.status_patches) == patches

    del harness.engine.runs.by_id  # re-projecting reads the run
    await harness.engine.start_run({**body, "status": {"phase": "Running"}})  # a stale view
    assert harness.engine.status.pending() == 0
    clock.advance(harness.engine.settings.reconcile_interval_seconds)  # a status changed since
    await harness.engine.start_run({**body, "status": {"phase": "Running"}})
    await wait_until(lambda: len(harness.kube.status_patches) > patches, what="the re-projection")
    assert harness.kube.status_patches[patches:] == ["seen-again"]
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
