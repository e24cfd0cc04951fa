"""The operator's store decisions: dispatch in one statement, outcomes that dispatch what
they release, and a Job created after a cancel that is reported as cancelled."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.execution import AttemptOutcome, BackoffPolicy, OutcomeReason
from flowforge.domain.history import EventKind
from flowforge.domain.states import RunPhase, TaskState
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due, record_job_created
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.outcomes import record_outcome
from flowforge.store.queries import list_tasks
from tests.store.conftest import start_run

pytestmark = pytest.mark.store

FAN_OUT: list[dict[str, Any]] = [
    *({"key": f"root-{n}"} for n in range(3)),
    {"key": "join", "dependsOn": ["root-0", "root-1", "root-2"]},
]
SUCCESS = AttemptOutcome(succeeded=True, reason=OutcomeReason.COMPLETED, exit_code=0)


async def _states(pool: Pool, run_id: int) -> dict[str, str]:
    return {task.task_key: task.state for task in await list_tasks(pool, run_id)}


async def _succeed(pool: Pool, fence: Fence, run_id: int, run_uid: str, key: str) -> Decision:
    return await record_outcome(
        pool,
        fence=fence,
        run_id=run_id,
        run_uid=run_uid,
        job=JobRef(task_key=key, attempt=1),
        outcome=SUCCESS,
        backoff=BackoffPolicy(),
    )


async def test_dispatch_moves_every_due_root_to_running_with_one_event_each(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, FAN_OUT)).run.id

    dispatched = await dispatch_due(store, fence=fence, run_id=run_id)
    again = await dispatch_due(store, fence=fence, run_id=run_id)

    assert [(d.task_key, d.attempt) for d in dispatched.create_jobs] == [
        ("root-0", 1),
        ("root-1", 1),
        ("root-2", 1),
    ]
    assert not again.recorded and again.create_jobs == ()
    events = [
        e.task_key for e in await run_history(store, run_id) if e.kind == EventKind.TASK_DISPATCHED
    ]
    assert events == ["root-0", "root-1", "root-2"]


async def test_the_last_upstream_success_dispatches_the_join_and_the_join_settles_the_run(
    store: Pool, fence: Fence
) -> None:
    started = await start_run(store, fence, FAN_OUT)
    run_id, uid = started.run.id, started.run.uid
    await dispatch_due(store, fence=fence, run_id=run_id)

    first = await _succeed(store, fence, run_id, uid, "root-0")
    await _succeed(store, fence, run_id, uid, "root-1")
    last = await _succeed(store, fence, run_id, uid, "root-2")
    replayed = await _succeed(store, fence, run_id, uid, "root-2")

    assert first.recorded and first.create_jobs == () and first.phase is None
    assert [d.task_key for d in last.create_jobs] == ["join"] and last.phase is None
    assert not replayed.recorded
    assert (await _states(store, run_id))["join"] == TaskState.RUNNING
    finished = await _succeed(store, fence, run_id, uid, "join")
    assert finished.phase is RunPhase.SUCCEEDED and finished.finished


async def test_a_job_created_after_its_attempt_was_cancelled_is_reported_cancelled(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, FAN_OUT)).run.id
    await dispatch_due(store, fence=fence, run_id=run_id)
    running = await record_job_created(
        store, fence=fence, run_id=run_id, task_key="root-0", attempt=1, job="j-0", created=True
    )

    await cancel_run(store, fence=fence, run_id=run_id, reason="test")
    late = await record_job_created(
        store, fence=fence, run_id=run_id, task_key="root-1", attempt=1, job="j-1", created=True
    )

    assert (running, late) == (False, True)
