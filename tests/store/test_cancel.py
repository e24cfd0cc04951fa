"""``store.cancel.cancel_run``: nothing new starts, running attempts are stopped, what
succeeded is rolled back; with the object gone (``rollback=False``) the run finishes at once.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskRole, TaskState
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks
from flowforge.store.runs import get_run
from tests.store.conftest import DIAMOND, finish, kinds, record, start_run, states

pytestmark = pytest.mark.store

WITH_REPORT: list[dict[str, Any]] = [
    *DIAMOND,
    {"key": "report"},
    {"key": "undo-extract", "compensateFor": "extract"},
    {"key": "undo-report", "compensateFor": "report"},
]


async def test_cancelling_stops_running_attempts_cancels_the_rest_and_finishes(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, WITH_REPORT)).run
    await dispatch_due(store, fence=fence, run_id=run.id)

    cancelled = await cancel_run(store, fence=fence, run_id=run.id, reason="spec.cancel is true")

    assert cancelled.recorded and cancelled.phase is RunPhase.CANCELLED
    assert cancelled.stop_jobs == (JobRef("extract", 1), JobRef("report", 1))
    assert cancelled.create_jobs == ()
    assert [n.reason for n in cancelled.notices] == ["RunCancelling", "RunCancelled"]
    assert cancelled.notices[0].message == "spec.cancel is true: stopped 2 running tasks"
    assert await states(store, run.id) == {
        "extract": TaskState.CANCELLED,
        "clean": TaskState.CANCELLED,
        "enrich": TaskState.CANCELLED,
        "load": TaskState.CANCELLED,
        "report": TaskState.CANCELLED,
        # nothing succeeded: nothing to undo
        "undo-extract": CompensationState.NOT_TRIGGERED,
        "undo-report": CompensationState.NOT_TRIGGERED,
    }
    assert {
        t.last_error for t in await list_tasks(store, run.id) if t.role is TaskRole.FORWARD
    } == {"spec.cancel is true"}
    history = await run_history(store, run.id)
    assert [e.kind for e in history][1:] == [
        EventKind.TASK_DISPATCHED,
        EventKind.TASK_DISPATCHED,
        EventKind.RUN_CANCEL_REQUESTED,
        *[EventKind.TASK_CANCELLED] * 5,
        EventKind.RUN_CANCELLED,
    ]
    run_row = await get_run(store, run.id)
    assert (run_row.phase, run_row.cancel_requested) == (RunPhase.CANCELLED, True)


async def test_an_outcome_that_arrives_after_the_cancel_is_lost(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, WITH_REPORT)).run
    await dispatch_due(store, fence=fence, run_id=run.id)
    await cancel_run(store, fence=fence, run_id=run.id, reason="test")
    before = await run_history(store, run.id)

    late = await record(store, fence, run, "extract")

    assert late == Decision.lost()
    assert await run_history(store, run.id) == before
    assert (await states(store, run.id))["clean"] == TaskState.CANCELLED


async def test_cancelling_twice_or_a_finished_run_changes_nothing(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, WITH_REPORT)).run
    await cancel_run(store, fence=fence, run_id=run.id, reason="first")
    before = await run_history(store, run.id)

    again = await cancel_run(store, fence=fence, run_id=run.id, reason="second")
    gone = await cancel_run(store, fence=fence, run_id=run.id, reason="deleted", rollback=False)

    assert again == Decision.lost() and gone == Decision.lost()
    assert await run_history(store, run.id) == before
    done = (await start_run(store, fence, [{"key": "x"}], workflow="done")).run
    await finish(store, fence, done, "x")
    assert await cancel_run(store, fence=fence, run_id=done.id, reason="late") == Decision.lost()
    assert (await get_run(store, done.id)).phase is RunPhase.SUCCEEDED


async def test_cancelling_rolls_back_what_succeeded_and_finishes_cancelled_after_it(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, WITH_REPORT)).run
    await finish(store, fence, run, "extract")  # clean and enrich now run

    cancelled = await cancel_run(store, fence=fence, run_id=run.id, reason="test")

    assert cancelled.phase is None  # rolling back
    assert sorted(cancelled.stop_jobs, key=lambda j: j.task_key) == [
        JobRef("clean", 1),
        JobRef("enrich", 1),
        JobRef("report", 1),
    ]
    assert [(d.task_key, d.role) for d in cancelled.create_jobs] == [
        ("undo-extract", TaskRole.COMPENSATION)
    ]
    assert [n.reason for n in cancelled.notices] == ["RunCancelling", "RollbackStarted"]
    run_row = await get_run(store, run.id)
    assert (run_row.phase, run_row.compensating) == (RunPhase.RUNNING, True)
    assert (await states(store, run.id))["undo-report"] == CompensationState.SKIPPED

    undone = await record(store, fence, run, "undo-extract", role=TaskRole.COMPENSATION)

    assert undone.phase is RunPhase.CANCELLED
    assert (await kinds(store, run.id))[-1] == EventKind.RUN_CANCELLED


async def test_a_deleted_run_skips_its_compensators_and_finishes_at_once(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, WITH_REPORT)).run
    await finish(store, fence, run, "extract")

    gone = await cancel_run(
        store, fence=fence, run_id=run.id, reason="the WorkflowRun was deleted", rollback=False
    )

    assert gone.phase is RunPhase.CANCELLED and gone.create_jobs == ()
    compensators = {
        t.task_key: (t.state, t.last_error)
        for t in await list_tasks(store, run.id)
        if t.role is TaskRole.COMPENSATION
    }
    assert compensators == {
        "undo-extract": (CompensationState.SKIPPED, "the WorkflowRun was deleted"),
        "undo-report": (CompensationState.SKIPPED, "the WorkflowRun was deleted"),
    }
    history = await kinds(store, run.id)
    assert history.count(EventKind.COMPENSATION_SKIPPED) == 2
    assert EventKind.COMPENSATION_TRIGGERED not in history


async def test_a_run_deleted_during_its_rollback_stops_it_where_it_is(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, WITH_REPORT)).run
    await finish(store, fence, run, "extract")
    await finish(store, fence, run, "report")
    started = await cancel_run(store, fence=fence, run_id=run.id, reason="test")
    (first,) = started.create_jobs

    gone = await cancel_run(store, fence=fence, run_id=run.id, reason="deleted", rollback=False)

    assert gone.phase is RunPhase.CANCELLED and gone.create_jobs == ()
    assert {
        key: state for key, state in (await states(store, run.id)).items() if key.startswith("undo")
    } == {"undo-extract": CompensationState.SKIPPED, "undo-report": CompensationState.SKIPPED}
    late = await record(store, fence, run, first.task_key, role=TaskRole.COMPENSATION)
    assert late == Decision.lost()
