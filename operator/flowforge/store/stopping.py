"""Stopping a run: the request recorded and its unresolved forward tasks cancelled.

The first half of a cancel (``cancel.py``), also what a ``Replace`` does to the oldest run
of its key (``replace_locked``, from the queue's pass in ``queue.py``): running attempts end
``cancelled`` (recorded before their Jobs are deleted) under id-ordered row locks; the
settle that follows, in the same transaction, starts the rollback of what succeeded.
"""

from __future__ import annotations

from flowforge.domain import notices
from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.history import EventKind
from flowforge.domain.states import UNRESOLVED_TASK_STATES, TaskState, sql_list
from flowforge.store.connection import Connection
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence

CANCEL_TASKS_QUERY = f"""
WITH locked AS (
    SELECT id, state AS previous FROM flowforge_task
    WHERE run_id = %(run)s AND role = 'forward' AND state IN {sql_list(UNRESOLVED_TASK_STATES)}
      AND (%(group)s::text IS NULL OR item_group = %(group)s)
    ORDER BY id FOR NO KEY UPDATE
)
UPDATE flowforge_task AS task
SET state = '{TaskState.CANCELLED}', finished_at = now(), updated_at = now(),
    last_error = %(reason)s
FROM locked WHERE task.id = locked.id
RETURNING task.task_key, task.attempt, locked.previous
"""


async def cancel_tasks_locked(
    connection: Connection, *, fence: Fence, run_id: int, reason: str, group: str | None = None
) -> tuple[JobRef, ...]:
    """Inside a transaction holding the run's row lock: cancel the run's unresolved forward
    tasks (only the items of the forEach task ``group``, when given); the Jobs of the
    running ones are to be stopped."""
    cursor = await connection.execute(
        CANCEL_TASKS_QUERY, {"run": run_id, "reason": reason, "group": group}
    )
    rows = await cursor.fetchall()
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.TASK_CANCELLED,
        epoch=fence.epoch,
        task_keys=sorted(str(r[0]) for r in rows),
    )
    return tuple(
        JobRef(task_key=str(key), attempt=int(attempt))
        for key, attempt, previous in rows
        if previous == TaskState.RUNNING
    )


async def request_cancel(
    connection: Connection, *, fence: Fence, run_id: int, reason: str
) -> Decision:
    """Inside a transaction holding the run's row lock: record the request and cancel the
    unresolved forward tasks; the Jobs of the running ones are to be stopped."""
    await connection.execute(
        "UPDATE flowforge_run SET cancel_requested = true, updated_at = now() WHERE id = %s",
        (run_id,),
    )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_CANCEL_REQUESTED,
        epoch=fence.epoch,
        detail={"reason": reason},
    )
    stop = await cancel_tasks_locked(connection, fence=fence, run_id=run_id, reason=reason)
    return Decision(
        recorded=True,
        stop_jobs=stop,
        notices=(notices.run_cancelling(reason=reason, stopped=len(stop)),),
    )


async def replace_locked(connection: Connection, *, fence: Fence, run_id: int, by: str) -> Decision:
    """Inside a transaction that holds the namespace's lock: cancel the run for the newer
    run ``by`` of its key (the caller settles it: it rolls back, and its finish lets the
    newer one start)."""
    await connection.execute(
        "SELECT 1 FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE", (run_id,)
    )
    stopped = await request_cancel(
        connection,
        fence=fence,
        run_id=run_id,
        reason=f"replaced by run {by} (spec.concurrency.policy Replace)",
    )
    await append_event(
        connection, run_id=run_id, kind=EventKind.RUN_REPLACED, epoch=fence.epoch, detail={"by": by}
    )
    return stopped.then(Decision(recorded=True, notices=(notices.run_replaced(by=by),)))
