"""Pause and Resume (a person's WorkflowRunAction) in the store: while paused nothing
starts (released tasks wait ready, a rollback waits), outcomes are still recorded, a cancel
waits for the resume; the resume starts what was held in its own transaction."""

from __future__ import annotations

import uuid

import pytest

from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.run_actions import ActionResult, Actor, RunAction, RunActionKind
from flowforge.domain.states import CompensationState, RunPhase, TaskRole, TaskState
from flowforge.store.actions import apply_action
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due
from flowforge.store.lease import Fence
from flowforge.store.runs import RunRecord, get_run
from tests.store.conftest import DIAMOND, failure, finish, kinds, record, start_run, states

pytestmark = pytest.mark.store

BOB = Actor(username="bob", groups=("ops",))
WITH_UNDO = [*DIAMOND, {"key": "undo-extract", "compensateFor": "extract"}]


async def _act(
    store: Pool, fence: Fence, run: RunRecord, kind: RunActionKind
) -> tuple[ActionResult, str, Decision]:
    done = await apply_action(
        store,
        fence=fence,
        run_id=run.id,
        uid=str(uuid.uuid4()),
        name=f"{kind.value.lower()}-1",
        action=RunAction(run=run.name, action=kind, reason="freeze window"),
        actor=BOB,
    )
    return done.result, done.message, done.decision


async def test_a_paused_run_starts_nothing_until_it_is_resumed(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, WITH_UNDO)).run
    await dispatch_due(store, fence=fence, run_id=run.id)  # extract runs
    result, _, _ = await _act(store, fence, run, RunActionKind.PAUSE)
    assert result is ActionResult.ACCEPTED
    assert (await get_run(store, run.id)).paused_at is not None

    # the running task's outcome is recorded; its dependents are released but do not start
    released = await record(store, fence, run, "extract")
    assert released.create_jobs == ()
    assert (await dispatch_due(store, fence=fence, run_id=run.id)).create_jobs == ()
    shown = await states(store, run.id)
    assert (shown["clean"], shown["enrich"]) == (TaskState.READY, TaskState.READY)

    result, _, resumed = await _act(store, fence, run, RunActionKind.RESUME)

    assert result is ActionResult.ACCEPTED
    assert sorted(job.task_key for job in resumed.create_jobs) == ["clean", "enrich"]
    assert (await get_run(store, run.id)).paused_at is None
    history = await kinds(store, run.id)
    assert history.index(EventKind.RUN_PAUSED) < history.index(EventKind.RUN_RESUMED)


async def test_a_cancel_while_paused_waits_for_the_resume(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, WITH_UNDO)).run
    await finish(store, fence, run, "extract")
    await dispatch_due(store, fence=fence, run_id=run.id)  # clean and enrich run
    await _act(store, fence, run, RunActionKind.PAUSE)

    deferred = await cancel_run(store, fence=fence, run_id=run.id, reason="spec.cancel is true")

    assert deferred.stop_jobs == () and deferred.create_jobs == ()
    assert [notice.reason for notice in deferred.notices] == ["CancelDeferred"]
    stored = await get_run(store, run.id)
    assert not stored.cancel_requested and stored.deferred_cancel == "spec.cancel is true"
    assert (await states(store, run.id))["clean"] == TaskState.RUNNING
    again = await cancel_run(store, fence=fence, run_id=run.id, reason="spec.cancel is true")
    assert not again.recorded  # kept once

    _, _, resumed = await _act(store, fence, run, RunActionKind.RESUME)

    assert sorted(job.task_key for job in resumed.stop_jobs) == ["clean", "enrich"]
    # the cancel's rollback starts at once: extract succeeded, its compensator runs
    assert [job.task_key for job in resumed.create_jobs] == ["undo-extract"]
    stored = await get_run(store, run.id)
    assert stored.cancel_requested and stored.deferred_cancel is None


async def test_a_rollback_waits_while_paused(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, WITH_UNDO)).run
    await finish(store, fence, run, "extract")
    await dispatch_due(store, fence=fence, run_id=run.id)
    await _act(store, fence, run, RunActionKind.PAUSE)

    await record(store, fence, run, "clean", failure())
    failed = await record(store, fence, run, "enrich")

    assert failed.create_jobs == ()
    assert (await states(store, run.id))["undo-extract"] == CompensationState.PENDING
    _, _, resumed = await _act(store, fence, run, RunActionKind.RESUME)
    assert [(job.task_key, job.role) for job in resumed.create_jobs] == [
        ("undo-extract", TaskRole.COMPENSATION)
    ]


async def test_pause_and_resume_are_refused_where_they_mean_nothing(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, [{"key": "only"}])).run
    await dispatch_due(store, fence=fence, run_id=run.id)  # only runs
    result, message, _ = await _act(store, fence, run, RunActionKind.RESUME)
    assert (result, message) == (ActionResult.REFUSED, "the run is not paused")
    await _act(store, fence, run, RunActionKind.PAUSE)
    result, message, _ = await _act(store, fence, run, RunActionKind.PAUSE)
    assert (result, message) == (ActionResult.REFUSED, "the run is paused already")

    # a paused run whose work is all done still finishes
    await record(store, fence, run, "only")
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED
    result, message, _ = await _act(store, fence, run, RunActionKind.RESUME)
    assert result is ActionResult.REFUSED
    assert message.startswith("the run has finished (Succeeded)")
