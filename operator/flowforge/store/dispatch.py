"""Dispatching: released forward tasks whose time has come move to running.

A task is released (``waiting -> ready``, or straight to ``running`` on the success hot
path in ``outcomes.py``) on proof that every upstream succeeded; a retry is ``ready``
until its backoff is over. ``dispatch_due`` moves every due one of a run to running in one
statement, however many there are (a 10,000-task fan-out's roots), and returns what their
Jobs need. Creating the Jobs is the caller's, after the commit; ``record_job_created`` then
notes that a Job exists for an attempt, and its uid, which is how the reconciler tells "never
created" (create it) from "vanished" (a lost attempt), and how the operator tells its own Job
from a copy with the same labels (only the recorded uid counts).
"""

from __future__ import annotations

from psycopg.types.json import Jsonb

from flowforge.domain.decision import Decision, Dispatch
from flowforge.domain.history import EventKind
from flowforge.domain.states import ACTIVE_RUN_PHASES, TaskRole, TaskState, sql_list
from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import StaleEpochError
from flowforge.store.lease import Fence, check_fence
from flowforge.store.transaction import in_transaction

DISPATCH_DUE_QUERY = f"""
WITH run AS (
    SELECT id FROM flowforge_run
    WHERE id = %(run)s AND phase IN {sql_list(ACTIVE_RUN_PHASES)} AND NOT cancel_requested
    FOR NO KEY UPDATE
), moved AS (
    UPDATE flowforge_task
    SET state = '{TaskState.RUNNING}', started_at = coalesce(started_at, now()),
        updated_at = now()
    WHERE run_id = (SELECT id FROM run) AND role = 'forward' AND state = '{TaskState.READY}'
      AND not_before <= now()
    RETURNING task_key, attempt, timeout_seconds, not_before
), recorded AS (
    INSERT INTO flowforge_event (run_id, task_key, attempt, kind, epoch)
    SELECT %(run)s, task_key, attempt, '{EventKind.TASK_DISPATCHED}', %(epoch)s FROM moved
    ORDER BY task_key
)
SELECT task_key, attempt, timeout_seconds, not_before FROM moved ORDER BY task_key
"""

# the next retry of the run whose backoff is not over yet
NEXT_DUE_QUERY = f"""
SELECT min(not_before) FROM flowforge_task
WHERE run_id = %s AND role = 'forward' AND state = '{TaskState.READY}' AND not_before > now()
"""


async def dispatch_due_locked(connection: Connection, *, fence: Fence, run_id: int) -> Decision:
    """Inside a transaction that passed the fence check (locks the run row)."""
    cursor = await connection.execute(DISPATCH_DUE_QUERY, {"run": run_id, "epoch": fence.epoch})
    dispatched = tuple(
        Dispatch(
            run_id=run_id,
            task_key=key,
            role=TaskRole.FORWARD,
            attempt=attempt,
            timeout_seconds=timeout,
            released_at=not_before,
        )
        for key, attempt, timeout, not_before in await cursor.fetchall()
    )
    later = await connection.execute(NEXT_DUE_QUERY, (run_id,))
    next_row = await later.fetchone()
    wake_at = None if next_row is None else next_row[0]
    return Decision(
        recorded=bool(dispatched) or wake_at is not None, create_jobs=dispatched, wake_at=wake_at
    )


async def dispatch_due(pool: Pool, *, fence: Fence, run_id: int) -> Decision:
    """Move every released task of the run whose time has come to running (none while the
    run is cancelling or over); ``wake_at`` is when the next one's backoff is over."""

    async def decide(connection: Connection) -> Decision:
        await check_fence(connection, fence)
        return await dispatch_due_locked(connection, fence=fence, run_id=run_id)

    return await in_transaction(pool, decide)


JOB_CREATED_QUERY = f"""
WITH fence AS (
    SELECT epoch FROM flowforge_lease WHERE name = %(lease)s FOR SHARE
), recorded AS (
    INSERT INTO flowforge_event (run_id, task_key, attempt, kind, epoch, detail)
    SELECT %(run)s, %(key)s, %(attempt)s, '{EventKind.TASK_JOB_CREATED}', epoch, %(detail)s
    FROM fence WHERE epoch = %(epoch)s
)
SELECT (SELECT epoch FROM fence),
       (SELECT state = '{TaskState.CANCELLED}' AND attempt = %(attempt)s
        FROM flowforge_task WHERE run_id = %(run)s AND task_key = %(key)s)
"""


async def record_job_created(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    task_key: str,
    attempt: int,
    job: str,
    uid: str,
    created: bool,
) -> bool:
    """Note that the Job of an attempt exists, and its uid (``created`` False: it already
    existed, and the caller checked that it is the run's).
    One fenced statement, one round trip. Returns whether the attempt was cancelled meanwhile: a
    cancel that committed between the dispatch and the Job's creation found no Job to
    delete, so the caller deletes the one it just made."""

    async def decide(connection: Connection) -> bool:
        cursor = await connection.execute(
            JOB_CREATED_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run_id,
                "key": task_key,
                "attempt": attempt,
                "detail": Jsonb({"job": job, "created": created, "uid": uid}),
            },
        )
        row = await cursor.fetchone()
        current = None if row is None or row[0] is None else int(row[0])
        if current != fence.epoch:
            raise StaleEpochError(lease=fence.lease, epoch=fence.epoch, current_epoch=current)
        return bool(row is not None and row[1])

    return await in_transaction(pool, decide, single_statement=True)
