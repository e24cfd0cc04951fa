"""``store.dispatch``: every due released task of a run moves to running in one statement;
nothing is dispatched while the run is cancelling or over; a Job's creation is noted, and
one created after its attempt was cancelled is reported so."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.history import EventKind
from flowforge.domain.states import TaskRole, TaskState
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import JobCreated, dispatch_due, record_jobs_created
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import job_created_attempts, list_tasks
from tests.store.conftest import AN_HOUR, failure, record, start_run, states

pytestmark = pytest.mark.store

FAN_OUT: list[dict[str, Any]] = [
    *({"key": f"root-{n}"} for n in range(3)),
    {"key": "join", "dependsOn": ["root-0", "root-1", "root-2"]},
]


async def test_dispatch_moves_every_due_root_to_running_with_one_event_each(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, [*FAN_OUT, {"key": "r", "timeoutSeconds": 60}])).run.id

    dispatched = await dispatch_due(store, fence=fence, run_id=run_id)
    again = await dispatch_due(store, fence=fence, run_id=run_id)

    assert dispatched.recorded
    assert [(d.task_key, d.attempt, d.role) for d in dispatched.create_jobs] == [
        ("r", 1, TaskRole.FORWARD),
        ("root-0", 1, TaskRole.FORWARD),
        ("root-1", 1, TaskRole.FORWARD),
        ("root-2", 1, TaskRole.FORWARD),
    ]
    assert [d.timeout_seconds for d in dispatched.create_jobs] == [60, None, None, None]
    assert {d.run_id for d in dispatched.create_jobs} == {run_id}
    assert not again.recorded and again.create_jobs == () and again.wake_in is None
    assert (await states(store, run_id))["join"] == TaskState.WAITING
    events = [
        e.task_key for e in await run_history(store, run_id) if e.kind == EventKind.TASK_DISPATCHED
    ]
    assert events == ["r", "root-0", "root-1", "root-2"]
    running = [t for t in await list_tasks(store, run_id) if t.state == TaskState.RUNNING]
    assert len(running) == 4 and all(t.started_at is not None for t in running)


async def test_a_retry_is_not_dispatched_before_its_backoff_is_over(
    store: Pool, fence: Fence
) -> None:
    started = await start_run(store, fence, [{"key": "flaky", "retries": 1}])
    run_id = started.run.id
    await dispatch_due(store, fence=fence, run_id=run_id)
    await record(store, fence, started.run, "flaky", failure(), backoff=AN_HOUR)

    early = await dispatch_due(store, fence=fence, run_id=run_id)

    assert early.create_jobs == ()
    assert early.wake_in is not None  # seconds, on the database's clock
    assert AN_HOUR.first_delay_seconds - 60 < early.wake_in <= AN_HOUR.first_delay_seconds
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE flowforge_task SET not_before = now() - interval '1 second' WHERE run_id = %s",
            (run_id,),
        )
    due = await dispatch_due(store, fence=fence, run_id=run_id)
    assert [(d.task_key, d.attempt) for d in due.create_jobs] == [("flaky", 2)]
    assert due.wake_in is None


async def test_a_cancelling_run_dispatches_nothing(store: Pool, fence: Fence) -> None:
    run_id = (await start_run(store, fence, FAN_OUT)).run.id

    await cancel_run(store, fence=fence, run_id=run_id, reason="test")
    after = await dispatch_due(store, fence=fence, run_id=run_id)

    assert not after.recorded and after.create_jobs == ()
    assert set((await states(store, run_id)).values()) == {TaskState.CANCELLED}
    assert EventKind.TASK_DISPATCHED not in [e.kind for e in await run_history(store, run_id)]


def made(task_key: str, *, created: bool = True) -> JobCreated:
    """The Job of the task's first attempt: named ``j-<task>``, its uid ``u-<task>``."""
    return JobCreated(task_key, 1, job=f"j-{task_key}", uid=f"u-{task_key}", created=created)


async def note_job(store: Pool, fence: Fence, *, run_id: int, task_key: str, created: bool) -> bool:
    """Note the Job of the task's first attempt alone; whether it was cancelled meanwhile."""
    jobs = (made(task_key, created=created),)
    cancelled = await record_jobs_created(store, fence=fence, run_id=run_id, jobs=jobs)
    return (task_key, 1) in cancelled


async def test_a_created_job_is_noted_once_per_attempt(store: Pool, fence: Fence) -> None:
    run_id = (await start_run(store, fence, FAN_OUT)).run.id
    await dispatch_due(store, fence=fence, run_id=run_id)

    first = await note_job(store, fence, run_id=run_id, task_key="root-0", created=True)
    existed = await note_job(store, fence, run_id=run_id, task_key="root-0", created=False)

    assert (first, existed) == (False, False)
    assert await job_created_attempts(store, run_id) == {("root-0", 1)}
    noted = [e for e in await run_history(store, run_id) if e.kind == EventKind.TASK_JOB_CREATED]
    assert [(e.task_key, e.attempt, dict(e.detail)) for e in noted] == [
        ("root-0", 1, {"job": "j-root-0", "created": True, "uid": "u-root-0"}),
        ("root-0", 1, {"job": "j-root-0", "created": False, "uid": "u-root-0"}),
    ]
    assert {e.epoch for e in noted} == {fence.epoch}


async def test_a_job_created_after_its_attempt_was_cancelled_is_reported_cancelled(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, FAN_OUT)).run.id
    await dispatch_due(store, fence=fence, run_id=run_id)
    running = await note_job(store, fence, run_id=run_id, task_key="root-0", created=True)

    await cancel_run(store, fence=fence, run_id=run_id, reason="test")
    late = await note_job(store, fence, run_id=run_id, task_key="root-1", created=True)

    assert (running, late) == (False, True)


async def test_the_jobs_of_one_decision_are_noted_together_in_their_order(
    store: Pool, fence: Fence
) -> None:
    """One statement for all of them: one event each, in the order given, each with its own
    uid; only the attempts a cancel moved on are reported cancelled."""
    run_id = (await start_run(store, fence, FAN_OUT)).run.id
    await dispatch_due(store, fence=fence, run_id=run_id)
    first = await record_jobs_created(
        store, fence=fence, run_id=run_id, jobs=(made("root-2"), made("root-0", created=False))
    )

    await cancel_run(store, fence=fence, run_id=run_id, reason="test")
    late = await record_jobs_created(
        store,
        fence=fence,
        run_id=run_id,
        jobs=(
            made("root-1"),
            JobCreated("root-0", 2, job="j", uid="u", created=True),
        ),
    )

    assert (first, late) == (frozenset(), frozenset({("root-1", 1)}))
    noted = [e for e in await run_history(store, run_id) if e.kind == EventKind.TASK_JOB_CREATED]
    assert [(e.task_key, e.attempt, e.detail["uid"], e.detail["created"]) for e in noted] == [
        ("root-2", 1, "u-root-2", True),
        ("root-0", 1, "u-root-0", False),
        ("root-1", 1, "u-root-1", True),
        ("root-0", 2, "u", True),
    ]
    assert {e.epoch for e in noted} == {fence.epoch}
