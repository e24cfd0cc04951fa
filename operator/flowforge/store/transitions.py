"""Moves of forward tasks and runs: compare-and-set, fenced, retried on conflicts.

Every function here runs one transaction that first checks the writer's fencing epoch
(``check_fence``), then moves a row only if it is in the expected state *and* attempt
(``UPDATE ... WHERE state = ... AND attempt = ...``); a lost compare-and-set raises
``TransitionConflictError`` and changes nothing.

Recording a success releases dependents in the same transaction: each edge out of the
task decrements its dependent's ``pending_dependencies`` under the dependent's row lock
(taken in id order, so concurrent releases cannot deadlock), and the decrement that reaches
zero moves the dependent from ``waiting`` to ``ready``. Each upstream's success happens once
(its own compare-and-set), so each dependent is released exactly once however many
upstreams finish together. A final failure skips every waiting task downstream of it,
transitively; independent branches are untouched.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from flowforge.domain.states import TaskState
from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import StaleEpochError, TransitionConflictError
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence, check_fence
from flowforge.store.retry import in_transaction
from flowforge.store.settle import SettledRun, settle_locked, settle_run


@dataclasses.dataclass(frozen=True)
class OutcomeResult:
    state: TaskState  # succeeded, failed, or ready when a retry was scheduled
    attempt: int  # the attempt the task is at now (grown by one after a scheduled retry)
    released: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    settled: SettledRun | None = None


async def _conflict(
    connection: Connection, *, run_id: int, task_key: str, expected: str
) -> TransitionConflictError:
    cursor = await connection.execute(
        "SELECT state, attempt FROM flowforge_task WHERE run_id = %s AND task_key = %s",
        (run_id, task_key),
    )
    row = await cursor.fetchone()
    actual = None if row is None else f"{row[0]} (attempt {row[1]})"
    return TransitionConflictError(
        run_id=run_id, task_key=task_key, expected=expected, actual=actual
    )


async def mark_running(
    pool: Pool, *, fence: Fence, run_id: int, task_key: str, attempt: int
) -> None:
    """ready -> running for ``attempt`` (its Job is about to be created)."""

    async def decide(connection: Connection) -> None:
        await check_fence(connection, fence)
        cursor = await connection.execute(
            "UPDATE flowforge_task SET state = 'running', started_at = now(), updated_at = now() "
            "WHERE run_id = %s AND task_key = %s AND role = 'forward' AND state = 'ready' "
            "AND attempt = %s",
            (run_id, task_key, attempt),
        )
        if cursor.rowcount != 1:
            raise await _conflict(
                connection, run_id=run_id, task_key=task_key, expected=f"ready (attempt {attempt})"
            )
        await append_event(
            connection,
            run_id=run_id,
            kind="task.started",
            epoch=fence.epoch,
            task_key=task_key,
            attempt=attempt,
        )

    await in_transaction(pool, decide)


SKIP_DOWNSTREAM_QUERY = """
WITH RECURSIVE downstream (id) AS (
    SELECT task_id FROM flowforge_task_dependency WHERE upstream_id = %(task)s
    UNION
    SELECT edge.task_id FROM flowforge_task_dependency AS edge
    JOIN downstream ON edge.upstream_id = downstream.id
), locked AS (
    SELECT task.id FROM flowforge_task AS task
    WHERE task.id IN (SELECT id FROM downstream) AND task.state = 'waiting'
    ORDER BY task.id
    FOR NO KEY UPDATE OF task
)
UPDATE flowforge_task AS task
SET state = 'skipped', finished_at = now(), updated_at = now()
FROM locked
WHERE task.id = locked.id AND task.state = 'waiting'
RETURNING task.task_key
"""


RECORD_SUCCESS_QUERY = """
WITH fence AS (
    SELECT epoch FROM flowforge_lease WHERE name = %(lease)s FOR SHARE
), moved AS (
    UPDATE flowforge_task
    SET state = 'succeeded', finished_at = now(), updated_at = now()
    WHERE run_id = %(run)s AND task_key = %(key)s AND role = 'forward'
      AND state = 'running' AND attempt = %(attempt)s
      AND (SELECT epoch FROM fence) = %(epoch)s
    RETURNING id
), dependents AS (
    SELECT task.id FROM flowforge_task AS task
    JOIN flowforge_task_dependency AS edge ON edge.task_id = task.id
    WHERE edge.upstream_id = (SELECT id FROM moved)
    ORDER BY task.id
    FOR NO KEY UPDATE OF task
), released AS (
    UPDATE flowforge_task AS task
    SET pending_dependencies = task.pending_dependencies - 1,
        state = CASE WHEN task.pending_dependencies = 1 AND task.state = 'waiting'
                     THEN 'ready' ELSE task.state END,
        not_before = CASE WHEN task.pending_dependencies = 1 AND task.state = 'waiting'
                          THEN greatest(task.not_before, now()) ELSE task.not_before END,
        updated_at = now()
    FROM dependents
    WHERE task.id = dependents.id
    RETURNING task.task_key, task.state
), recorded AS (
    INSERT INTO flowforge_event (run_id, task_key, attempt, kind, epoch)
    SELECT %(run)s, task_key, attempt, kind, %(epoch)s FROM (
        SELECT 0 AS position, %(key)s AS task_key, %(attempt)s::int AS attempt,
               'task.succeeded' AS kind
        FROM moved
        UNION ALL
        SELECT 1, task_key, NULL, 'task.released' FROM released WHERE state = 'ready'
    ) AS events
    ORDER BY position, task_key
)
SELECT (SELECT epoch FROM fence),
       (SELECT count(*) FROM moved),
       ARRAY(SELECT task_key FROM released WHERE state = 'ready' ORDER BY task_key)
"""


async def _record_success(
    pool: Pool, *, fence: Fence, run_id: int, task_key: str, attempt: int
) -> OutcomeResult:
    """The hot path, one statement: fence check, compare-and-set, release, events."""

    async def decide(connection: Connection) -> OutcomeResult:
        cursor = await connection.execute(
            RECORD_SUCCESS_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run_id,
                "key": task_key,
                "attempt": attempt,
            },
        )
        row = await cursor.fetchone()
        assert row is not None
        current_epoch, moved, released = row
        if current_epoch != fence.epoch:
            raise StaleEpochError(
                lease=fence.lease, epoch=fence.epoch, current_epoch=current_epoch
            )
        if moved != 1:
            raise await _conflict(
                connection,
                run_id=run_id,
                task_key=task_key,
                expected=f"running (attempt {attempt})",
            )
        return OutcomeResult(
            state=TaskState.SUCCEEDED, attempt=attempt, released=tuple(released)
        )

    return await in_transaction(pool, decide, single_statement=True)


async def record_outcome(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    task_key: str,
    attempt: int,
    succeeded: bool,
    error: str | None = None,
    retry_not_before: datetime | None = None,
) -> OutcomeResult:
    """running -> succeeded/failed for ``attempt``, with release or skip in the same commit.

    A failure with ``retry_not_before`` set and attempts left schedules the next attempt
    (running -> ready, attempt + 1, not before that time) instead of failing for good.
    After the commit the run is settled if this was its last unresolved forward task.
    """
    if succeeded:
        result = await _record_success(
            pool, fence=fence, run_id=run_id, task_key=task_key, attempt=attempt
        )
        if result.released:
            # a task this commit released is unresolved; whoever resolves it settles
            return result
        settled = await settle_run(pool, fence=fence, run_id=run_id)
        return dataclasses.replace(result, settled=settled)

    result = await _record_failure(
        pool,
        fence=fence,
        run_id=run_id,
        task_key=task_key,
        attempt=attempt,
        error=error,
        retry_not_before=retry_not_before,
    )
    if result.state is TaskState.READY:
        return result
    settled = await settle_run(pool, fence=fence, run_id=run_id)
    return dataclasses.replace(result, settled=settled)


_RECORD_FAILURE_QUERY = """
UPDATE flowforge_task SET
    state = CASE WHEN %(retry)s::timestamptz IS NOT NULL AND attempt < max_attempts
                 THEN 'ready' ELSE 'failed' END,
    attempt = CASE WHEN %(retry)s::timestamptz IS NOT NULL AND attempt < max_attempts
                   THEN attempt + 1 ELSE attempt END,
    not_before = coalesce(%(retry)s::timestamptz, not_before),
    finished_at = CASE WHEN %(retry)s::timestamptz IS NULL OR attempt >= max_attempts
                       THEN now() END,
    last_error = coalesce(%(error)s, last_error),
    updated_at = now()
WHERE run_id = %(run)s AND task_key = %(key)s AND role = 'forward'
  AND state = 'running' AND attempt = %(attempt)s
RETURNING id, state, attempt
"""


async def _record_failure(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    task_key: str,
    attempt: int,
    error: str | None,
    retry_not_before: datetime | None,
) -> OutcomeResult:
    async def decide(connection: Connection) -> OutcomeResult:
        await check_fence(connection, fence)
        cursor = await connection.execute(
            _RECORD_FAILURE_QUERY,
            {
                "retry": retry_not_before,
                "error": error,
                "run": run_id,
                "key": task_key,
                "attempt": attempt,
            },
        )
        row = await cursor.fetchone()
        if row is None:
            raise await _conflict(
                connection,
                run_id=run_id,
                task_key=task_key,
                expected=f"running (attempt {attempt})",
            )
        task_id, state, new_attempt = int(row[0]), TaskState(row[1]), int(row[2])
        detail = {"error": error} if error else {}
        if state is TaskState.READY:
            await append_event(
                connection,
                run_id=run_id,
                kind="task.retry_scheduled",
                epoch=fence.epoch,
                task_key=task_key,
                attempt=attempt,
                detail={**detail, "notBefore": str(retry_not_before)},
            )
            return OutcomeResult(state=state, attempt=new_attempt)
        await append_event(
            connection,
            run_id=run_id,
            kind="task.failed",
            epoch=fence.epoch,
            task_key=task_key,
            attempt=attempt,
            detail=detail,
        )
        skipped_cursor = await connection.execute(SKIP_DOWNSTREAM_QUERY, {"task": task_id})
        skipped = tuple(sorted(str(key) for (key,) in await skipped_cursor.fetchall()))
        await append_task_events(
            connection, run_id=run_id, kind="task.skipped", epoch=fence.epoch, task_keys=skipped
        )
        return OutcomeResult(state=state, attempt=new_attempt, skipped=skipped)

    return await in_transaction(pool, decide)


@dataclasses.dataclass(frozen=True)
class CancelResult:
    cancelled: tuple[str, ...]  # forward tasks cancelled (waiting, ready or running)
    stopped_running: tuple[str, ...]  # of those, the ones whose Jobs must be deleted
    settled: SettledRun


async def cancel_run(pool: Pool, *, fence: Fence, run_id: int) -> CancelResult:
    """Stop a run: unfinished forward tasks are cancelled, then the run settles (and rolls
    back what succeeded). Cancelling a finished run changes nothing."""

    async def decide(connection: Connection) -> CancelResult:
        await check_fence(connection, fence)
        cursor = await connection.execute(
            "UPDATE flowforge_run SET cancel_requested = true, updated_at = now() "
            "WHERE id = %s AND phase IN ('pending', 'running') AND NOT cancel_requested "
            "RETURNING id",
            (run_id,),
        )
        if cursor.rowcount == 1:
            await append_event(connection, run_id=run_id, kind="run.cancel_requested",
                               epoch=fence.epoch)
        tasks = await connection.execute(
            """
            WITH locked AS (
                SELECT id, state AS previous FROM flowforge_task
                WHERE run_id = %s AND role = 'forward'
                  AND state IN ('waiting', 'ready', 'running')
                ORDER BY id FOR NO KEY UPDATE
            )
            UPDATE flowforge_task AS task
            SET state = 'cancelled', finished_at = now(), updated_at = now()
            FROM locked WHERE task.id = locked.id
            RETURNING task.task_key, locked.previous
            """,
            (run_id,),
        )
        rows = await tasks.fetchall()
        cancelled = tuple(sorted(str(key) for key, _ in rows))
        stopped = tuple(sorted(str(key) for key, previous in rows if previous == "running"))
        await append_task_events(
            connection, run_id=run_id, kind="task.cancelled", epoch=fence.epoch,
            task_keys=cancelled,
        )
        settled = await settle_locked(connection, fence=fence, run_id=run_id)
        return CancelResult(cancelled=cancelled, stopped_running=stopped, settled=settled)

    return await in_transaction(pool, decide)
