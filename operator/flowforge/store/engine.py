"""The run engine's store operations: dispatch, outcomes (with release, retry and skip), cancel.

Every operation is one transaction that first passes the fencing check. A success, the hot
path, is one statement (``transitions.RECORD_SUCCESS_QUERY``) that locks only the task rows
it moves, its dependents in id order: two upstreams finishing together decrement a fan-in
task under its row lock, one after the other, and only the decrement that reaches zero
releases it (exactly once). Everything else (dispatching due tasks, failures, cancel) locks
the run row (``FOR NO KEY UPDATE``) first, so those decisions are serialised per run. Each
task move is a compare-and-set on the expected state and attempt; an outcome that arrives
twice (a watch replay, the reconciler) finds the attempt already resolved and changes
nothing. Nothing here talks to Kubernetes: the caller acts on what a transaction decided
only after it committed.

Dispatching a task moves it ``ready -> running`` and returns what its Job needs; creating
the Job is the caller's job. ``task.job_created`` events record that a Job exists for an
attempt, which is how the reconciler tells "never created" (create it) from "vanished"
(a lost attempt).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from flowforge.domain.execution import (
    AttemptOutcome,
    BackoffPolicy,
    jitter_unit,
    may_retry,
    retry_delay,
)
from flowforge.domain.projection import TaskCounts
from flowforge.domain.states import RunPhase, TaskRole, TaskState
from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import StaleEpochError
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence, check_fence
from flowforge.store.retry import in_transaction
from flowforge.store.settle import SettledRun, settle_locked, settle_run
from flowforge.store.transitions import Dispatch as Dispatch
from flowforge.store.transitions import record_success


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a transaction decided; the caller acts on it after the commit."""

    recorded: bool
    dispatched: tuple[Dispatch, ...] = ()
    retry_at: datetime | None = None
    final_failure: bool = False
    skipped: tuple[str, ...] = ()
    settled: SettledRun | None = None
    stop_jobs: tuple[tuple[str, int], ...] = ()  # (task key, attempt) to delete


@dataclasses.dataclass(frozen=True)
class TaskRow:
    key: str
    role: TaskRole
    state: str
    attempt: int
    max_attempts: int
    timeout_seconds: int | None
    not_before: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None


async def _lock_run(connection: Connection, run_id: int) -> tuple[RunPhase, bool] | None:
    cursor = await connection.execute(
        "SELECT phase, cancel_requested FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE",
        (run_id,),
    )
    row = await cursor.fetchone()
    return None if row is None else (RunPhase(row[0]), bool(row[1]))


DISPATCH_DUE_QUERY = """
WITH moved AS (
    UPDATE flowforge_task
    SET state = 'running', started_at = coalesce(started_at, now()), updated_at = now()
    WHERE run_id = %(run)s AND role = 'forward' AND state = 'ready' AND not_before <= now()
    RETURNING task_key, attempt, timeout_seconds, not_before
), recorded AS (
    INSERT INTO flowforge_event (run_id, task_key, attempt, kind, epoch)
    SELECT %(run)s, task_key, attempt, 'task.dispatched', %(epoch)s FROM moved
    ORDER BY task_key
)
SELECT task_key, attempt, timeout_seconds, not_before FROM moved ORDER BY task_key
"""


async def _dispatch_due(
    connection: Connection, *, fence: Fence, run_id: int
) -> tuple[Dispatch, ...]:
    """One statement however many tasks are due (a 10,000-task fan-out's roots)."""
    cursor = await connection.execute(DISPATCH_DUE_QUERY, {"run": run_id, "epoch": fence.epoch})
    return tuple(
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


async def dispatch_due(pool: Pool, *, fence: Fence, run_id: int) -> tuple[Dispatch, ...]:
    """Move every released task whose time has come to running; return their attempts."""

    async def decide(connection: Connection) -> tuple[Dispatch, ...]:
        await check_fence(connection, fence)
        locked = await _lock_run(connection, run_id)
        if locked is None or locked[0] not in (RunPhase.PENDING, RunPhase.RUNNING) or locked[1]:
            return ()
        return await _dispatch_due(connection, fence=fence, run_id=run_id)

    return await in_transaction(pool, decide)


async def _skip_downstream(
    connection: Connection, *, fence: Fence, run_id: int, task_id: int
) -> tuple[str, ...]:
    cursor = await connection.execute(
        """
        WITH RECURSIVE downstream(id) AS (
            SELECT task_id FROM flowforge_task_dependency WHERE upstream_id = %(task)s
            UNION
            SELECT edge.task_id FROM flowforge_task_dependency AS edge
            JOIN downstream ON edge.upstream_id = downstream.id
        )
        UPDATE flowforge_task AS task
        SET state = 'skipped', finished_at = now(), updated_at = now(),
            last_error = 'an upstream task failed'
        FROM downstream
        WHERE task.id = downstream.id AND task.state = 'waiting'
        RETURNING task.task_key
        """,
        {"task": task_id},
    )
    skipped = tuple(sorted(str(key) for (key,) in await cursor.fetchall()))
    await append_task_events(
        connection, run_id=run_id, kind="task.skipped", epoch=fence.epoch, task_keys=skipped
    )
    return skipped


def _outcome_detail(outcome: AttemptOutcome) -> dict[str, Any]:
    return {
        "reason": outcome.reason.value,
        "message": outcome.message,
        "exitCode": outcome.exit_code,
        "startedAt": outcome.started_at.isoformat() if outcome.started_at else None,
        "finishedAt": outcome.finished_at.isoformat() if outcome.finished_at else None,
    }


async def record_outcome(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    run_uid: str,
    task_key: str,
    attempt: int,
    outcome: AttemptOutcome,
    backoff: BackoffPolicy,
) -> Decision:
    """Record how one attempt ended, and in the same transaction act on it.

    Success is the hot path, one statement (``transitions.record_success``): it releases
    the dependents whose every upstream succeeded and moves them on to running, and the run
    is settled after the commit only when it released nothing (a released task is
    unresolved: whoever resolves it settles). A failure with attempts left schedules the
    next attempt after the backoff; a final failure skips everything downstream; both lock
    the run and settle it in their transaction.
    """
    if outcome.succeeded:
        return await _record_success(
            pool, fence=fence, run_id=run_id, task_key=task_key, attempt=attempt, outcome=outcome
        )

    async def decide(connection: Connection) -> Decision:
        await check_fence(connection, fence)
        locked = await _lock_run(connection, run_id)
        if locked is None:
            return Decision(recorded=False)
        cursor = await connection.execute(
            "SELECT id, state, attempt, max_attempts FROM flowforge_task "
            "WHERE run_id = %s AND task_key = %s FOR UPDATE",
            (run_id, task_key),
        )
        row = await cursor.fetchone()
        if row is None or row[1] != TaskState.RUNNING or row[2] != attempt:
            return Decision(recorded=False)
        task_id, max_attempts = int(row[0]), int(row[3])
        detail = _outcome_detail(outcome)
        retry_at: datetime | None = None
        skipped: tuple[str, ...] = ()
        final_failure = False
        if may_retry(attempt=attempt, retries=max_attempts - 1):
            delay = retry_delay(
                failed_attempts=attempt,
                policy=backoff,
                unit=jitter_unit(run_uid=run_uid, task_key=task_key, attempt=attempt),
            )
            cursor = await connection.execute(
                "UPDATE flowforge_task SET state = 'ready', attempt = attempt + 1, "
                "not_before = now() + %s, updated_at = now(), last_error = %s "
                "WHERE id = %s RETURNING not_before",
                (delay, outcome.message[:1000], task_id),
            )
            retry_row = await cursor.fetchone()
            retry_at = None if retry_row is None else retry_row[0]
            await append_event(
                connection,
                run_id=run_id,
                kind="task.attempt_failed",
                epoch=fence.epoch,
                task_key=task_key,
                attempt=attempt,
                detail={**detail, "retryInSeconds": delay.total_seconds()},
            )
        else:
            final_failure = True
            await connection.execute(
                "UPDATE flowforge_task SET state = 'failed', finished_at = now(), "
                "updated_at = now(), last_error = %s WHERE id = %s",
                (outcome.message[:1000], task_id),
            )
            await append_event(
                connection,
                run_id=run_id,
                kind="task.failed",
                epoch=fence.epoch,
                task_key=task_key,
                attempt=attempt,
                detail=detail,
            )
            skipped = await _skip_downstream(
                connection, fence=fence, run_id=run_id, task_id=task_id
            )
        dispatched: tuple[Dispatch, ...] = ()
        if not locked[1]:
            dispatched = await _dispatch_due(connection, fence=fence, run_id=run_id)
        settled = await settle_locked(connection, fence=fence, run_id=run_id)
        return Decision(
            recorded=True,
            dispatched=dispatched,
            retry_at=retry_at,
            final_failure=final_failure,
            skipped=skipped,
            settled=settled,
        )

    return await in_transaction(pool, decide)


async def _record_success(
    pool: Pool, *, fence: Fence, run_id: int, task_key: str, attempt: int, outcome: AttemptOutcome
) -> Decision:
    success = await record_success(
        pool,
        fence=fence,
        run_id=run_id,
        task_key=task_key,
        attempt=attempt,
        detail=_outcome_detail(outcome),
        dispatch=True,
    )
    if not success.recorded:
        return Decision(recorded=False)
    settled = None if success.released else await settle_run(pool, fence=fence, run_id=run_id)
    return Decision(recorded=True, dispatched=success.dispatched, settled=settled)


async def cancel_run(pool: Pool, *, fence: Fence, run_id: int, reason: str) -> Decision:
    """Stop a run: nothing new starts, running attempts end ``cancelled`` (recorded before
    their Jobs are deleted), waiting and ready tasks are cancelled; then settle."""

    async def decide(connection: Connection) -> Decision:
        await check_fence(connection, fence)
        locked = await _lock_run(connection, run_id)
        if locked is None or locked[0] not in (RunPhase.PENDING, RunPhase.RUNNING) or locked[1]:
            return Decision(recorded=False)
        await connection.execute(
            "UPDATE flowforge_run SET cancel_requested = true, updated_at = now() WHERE id = %s",
            (run_id,),
        )
        await append_event(
            connection,
            run_id=run_id,
            kind="run.cancel_requested",
            epoch=fence.epoch,
            detail={"reason": reason},
        )
        cursor = await connection.execute(
            """
            UPDATE flowforge_task AS task
            SET state = 'cancelled', finished_at = now(), updated_at = now(),
                last_error = %s
            FROM flowforge_task AS before
            WHERE task.id = before.id AND task.run_id = %s AND task.role = 'forward'
              AND task.state IN ('waiting', 'ready', 'running')
            RETURNING task.task_key, task.attempt, before.state
            """,
            (reason, run_id),
        )
        rows = await cursor.fetchall()
        await append_task_events(
            connection,
            run_id=run_id,
            kind="task.cancelled",
            epoch=fence.epoch,
            task_keys=sorted(str(r[0]) for r in rows),
        )
        stop = tuple(
            (str(key), int(attempt)) for key, attempt, before in rows if before == TaskState.RUNNING
        )
        settled = await settle_locked(connection, fence=fence, run_id=run_id)
        return Decision(recorded=True, settled=settled, stop_jobs=stop)

    return await in_transaction(pool, decide)


JOB_CREATED_QUERY = """
WITH fence AS (
    SELECT epoch FROM flowforge_lease WHERE name = %(lease)s FOR SHARE
), recorded AS (
    INSERT INTO flowforge_event (run_id, task_key, attempt, kind, epoch, detail)
    SELECT %(run)s, %(key)s, %(attempt)s, 'task.job_created', epoch, %(detail)s
    FROM fence WHERE epoch = %(epoch)s
)
SELECT (SELECT epoch FROM fence),
       (SELECT state = 'cancelled' AND attempt = %(attempt)s FROM flowforge_task
        WHERE run_id = %(run)s AND task_key = %(key)s)
"""


async def record_job_created(
    pool: Pool, *, fence: Fence, run_id: int, task_key: str, attempt: int, job: str, created: bool
) -> bool:
    """Note that the Job of an attempt exists (``created`` False: it already existed).
    One fenced statement, one round trip. Returns whether the attempt was cancelled
    meanwhile: a cancel that committed between the dispatch and the Job's creation found no
    Job to delete, so the caller deletes the one it just made."""

    async def decide(connection: Connection) -> bool:
        cursor = await connection.execute(
            JOB_CREATED_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run_id,
                "key": task_key,
                "attempt": attempt,
                "detail": Jsonb({"job": job, "created": created}),
            },
        )
        row = await cursor.fetchone()
        current = None if row is None or row[0] is None else int(row[0])
        if current != fence.epoch:
            raise StaleEpochError(lease=fence.lease, epoch=fence.epoch, current_epoch=current)
        return bool(row is not None and row[1])

    return await in_transaction(pool, decide, single_statement=True)


async def job_created_attempts(pool: Pool, run_id: int) -> set[tuple[str, int]]:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT DISTINCT task_key, attempt FROM flowforge_event "
            "WHERE run_id = %s AND kind = 'task.job_created'",
            (run_id,),
        )
        return {(str(key), int(attempt)) for key, attempt in await cursor.fetchall()}


async def load_tasks(
    pool: Pool, run_id: int, *, role: TaskRole | None = TaskRole.FORWARD, limit: int | None = None
) -> list[TaskRow]:
    """A run's task rows in topological order (all of them when ``limit`` is None)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT task_key, role, state, attempt, max_attempts, timeout_seconds, not_before, "
            "started_at, finished_at, last_error FROM flowforge_task "
            "WHERE run_id = %s AND (%s::text IS NULL OR role = %s) "
            "ORDER BY topological_index, task_key LIMIT %s",
            (run_id, role, role, limit),
        )
        rows = await cursor.fetchall()
    return [
        TaskRow(
            key=r[0],
            role=TaskRole(r[1]),
            state=r[2],
            attempt=r[3],
            max_attempts=r[4],
            timeout_seconds=r[5],
            not_before=r[6],
            started_at=r[7],
            finished_at=r[8],
            last_error=r[9],
        )
        for r in rows
    ]


async def active_tasks(pool: Pool, run_id: int) -> list[TaskRow]:
    """Tasks the reconciler looks at: released, running, or pending compensation."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT task_key, role, state, attempt, max_attempts, timeout_seconds, not_before, "
            "started_at, finished_at, last_error FROM flowforge_task "
            "WHERE run_id = %s AND state IN ('ready', 'running', 'pending')",
            (run_id,),
        )
        rows = await cursor.fetchall()
    return [
        TaskRow(
            key=r[0],
            role=TaskRole(r[1]),
            state=r[2],
            attempt=r[3],
            max_attempts=r[4],
            timeout_seconds=r[5],
            not_before=r[6],
            started_at=r[7],
            finished_at=r[8],
            last_error=r[9],
        )
        for r in rows
    ]


async def forward_counts(pool: Pool, run_id: int) -> TaskCounts:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT state, count(*) FROM flowforge_task WHERE run_id = %s AND role = 'forward' "
            "GROUP BY state",
            (run_id,),
        )
        by_state = {str(state): int(count) for state, count in await cursor.fetchall()}
    return TaskCounts(
        total=sum(by_state.values()),
        **{
            state: by_state.get(state, 0)
            for state in (
                "waiting",
                "ready",
                "running",
                "succeeded",
                "failed",
                "skipped",
                "cancelled",
            )
        },
    )


async def latest_outcomes(
    pool: Pool, run_id: int, task_keys: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The detail of each task's latest recorded outcome (exit code, reason, message)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT DISTINCT ON (task_key) task_key, detail FROM flowforge_event "
            "WHERE run_id = %s AND task_key = ANY(%s) AND kind IN "
            "('task.succeeded', 'task.failed', 'task.attempt_failed') "
            "ORDER BY task_key, id DESC",
            (run_id, list(task_keys)),
        )
        return {str(key): dict(detail) for key, detail in await cursor.fetchall()}


async def run_times(pool: Pool, run_id: int) -> tuple[datetime, datetime | None]:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT created_at, finished_at FROM flowforge_run WHERE id = %s", (run_id,)
        )
        row = await cursor.fetchone()
    if row is None:
        raise LookupError(run_id)
    return row[0], row[1]


def due_in(not_before: datetime, now: datetime) -> timedelta:
    return max(timedelta(0), not_before - now)


async def find_run_id_by_uid(pool: Pool, *, namespace: str, uid: str) -> int | None:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT id FROM flowforge_run WHERE namespace = %s AND uid = %s", (namespace, uid)
        )
        row = await cursor.fetchone()
    return None if row is None else int(row[0])


async def runs_by_phase(pool: Pool) -> dict[str, int]:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT phase, count(*) FROM flowforge_run GROUP BY phase"
        )
        return {str(phase): int(count) for phase, count in await cursor.fetchall()}
