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
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from flowforge.domain.states import TaskRole, TaskState
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
), run AS (
    SELECT %(dispatch)s::boolean AND phase IN ('pending', 'running') AND NOT cancel_requested
           AS may_dispatch
    FROM flowforge_run WHERE id = %(run)s
), moved AS (
    UPDATE flowforge_task
    SET state = 'succeeded', finished_at = now(), updated_at = now(), last_error = NULL
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
                     THEN CASE WHEN (SELECT may_dispatch FROM run) THEN 'running' ELSE 'ready' END
                     ELSE task.state END,
        started_at = CASE WHEN task.pending_dependencies = 1 AND task.state = 'waiting'
                          AND (SELECT may_dispatch FROM run)
                          THEN coalesce(task.started_at, now()) ELSE task.started_at END,
        not_before = CASE WHEN task.pending_dependencies = 1 AND task.state = 'waiting'
                          THEN greatest(task.not_before, now()) ELSE task.not_before END,
        updated_at = now()
    FROM dependents
    WHERE task.id = dependents.id
    RETURNING task.task_key, task.state, task.attempt, task.timeout_seconds, task.not_before
), recorded AS (
    INSERT INTO flowforge_event (run_id, task_key, attempt, kind, epoch, detail)
    SELECT %(run)s, task_key, attempt, kind, %(epoch)s, detail FROM (
        SELECT 0 AS position, %(key)s AS task_key, %(attempt)s::int AS attempt,
               'task.succeeded' AS kind, %(detail)s::jsonb AS detail
        FROM moved
        UNION ALL
        SELECT 1, task_key, NULL, 'task.released', '{}'::jsonb
        FROM released WHERE state IN ('ready', 'running')
        UNION ALL
        SELECT 2, task_key, attempt, 'task.dispatched', '{}'::jsonb
        FROM released WHERE state = 'running'
    ) AS events
    ORDER BY position, task_key
)
SELECT (SELECT epoch FROM fence),
       (SELECT count(*) FROM moved),
       ARRAY(SELECT task_key FROM released WHERE state IN ('ready', 'running')
             ORDER BY task_key),
       ARRAY(SELECT task_key FROM released WHERE state = 'running' ORDER BY task_key),
       ARRAY(SELECT attempt FROM released WHERE state = 'running' ORDER BY task_key),
       ARRAY(SELECT timeout_seconds FROM released WHERE state = 'running' ORDER BY task_key),
       ARRAY(SELECT not_before FROM released WHERE state = 'running' ORDER BY task_key)
"""


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """One attempt that was moved to running and needs its Job."""

    run_id: int
    task_key: str
    role: TaskRole
    attempt: int
    timeout_seconds: int | None
    released_at: datetime


@dataclasses.dataclass(frozen=True)
class SuccessResult:
    recorded: bool  # False: the attempt was not running (a replayed or stale outcome)
    released: tuple[str, ...] = ()  # every dependent released (ready or running)
    dispatched: tuple[Dispatch, ...] = ()  # of those, the ones moved on to running


async def record_success(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    task_key: str,
    attempt: int,
    detail: Mapping[str, Any] | None = None,
    dispatch: bool = False,
) -> SuccessResult:
    """The hot path, one statement on an autocommit connection (one round trip): fence
    check, compare-and-set, release of dependents under row locks taken in id order, and
    events. With ``dispatch`` the dependents it releases go straight on to running (unless
    the run is cancelling or over), so their Jobs can be created as soon as it commits."""

    async def decide(connection: Connection) -> SuccessResult:
        cursor = await connection.execute(
            RECORD_SUCCESS_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run_id,
                "key": task_key,
                "attempt": attempt,
                "detail": Jsonb(dict(detail or {})),
                "dispatch": dispatch,
            },
        )
        row = await cursor.fetchone()
        assert row is not None
        current_epoch, moved, released, keys, attempts, timeouts, not_befores = row
        if current_epoch != fence.epoch:
            raise StaleEpochError(lease=fence.lease, epoch=fence.epoch, current_epoch=current_epoch)
        if moved != 1:
            return SuccessResult(recorded=False)
        return SuccessResult(
            recorded=True,
            released=tuple(released),
            dispatched=tuple(
                Dispatch(
                    run_id=run_id,
                    task_key=key,
                    role=TaskRole.FORWARD,
                    attempt=number,
                    timeout_seconds=timeout,
                    released_at=not_before,
                )
                for key, number, timeout, not_before in zip(
                    keys, attempts, timeouts, not_befores, strict=True
                )
            ),
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
        success = await record_success(
            pool, fence=fence, run_id=run_id, task_key=task_key, attempt=attempt
        )
        if not success.recorded:
            async with pool.connection() as connection:
                raise await _conflict(
                    connection,
                    run_id=run_id,
                    task_key=task_key,
                    expected=f"running (attempt {attempt})",
                )
        result = OutcomeResult(
            state=TaskState.SUCCEEDED, attempt=attempt, released=success.released
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
            await append_event(
                connection, run_id=run_id, kind="run.cancel_requested", epoch=fence.epoch
            )
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
            connection,
            run_id=run_id,
            kind="task.cancelled",
            epoch=fence.epoch,
            task_keys=cancelled,
        )
        settled = await settle_locked(connection, fence=fence, run_id=run_id)
        return CancelResult(cancelled=cancelled, stopped_running=stopped, settled=settled)

    return await in_transaction(pool, decide)
