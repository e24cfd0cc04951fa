"""Moves of compensators: the rollback runs strictly one at a time, in reverse order.

``settle_run`` triggers the compensators (``not_triggered`` -> ``pending``). The next one to
run is the pending compensator whose forward task comes last in the definition's
topological order (``topological_index``, ties broken by key in the domain's order), so a
dependent is undone before its dependency. ``start_compensation`` refuses any other one,
and a unique partial index (``flowforge_task_one_running_compensator_idx``) makes the
database itself refuse a second running compensator in a run. A compensator that fails
for good halts the rollback: the remaining pending ones are skipped and the run finishes.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime

from flowforge.domain.states import CompensationState
from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import TransitionConflictError
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence, check_fence
from flowforge.store.retry import in_transaction
from flowforge.store.settle import SettledRun, settle_locked


@dataclasses.dataclass(frozen=True)
class NextCompensation:
    task_key: str
    compensates_key: str
    attempt: int
    not_before: datetime


_NEXT = """
SELECT task_key, compensates_key, attempt, not_before FROM flowforge_task
WHERE run_id = %(run)s AND role = 'compensation' AND state = 'pending'
  AND NOT EXISTS (
      SELECT 1 FROM flowforge_task
      WHERE run_id = %(run)s AND role = 'compensation' AND state = 'running')
ORDER BY topological_index DESC, task_key DESC
LIMIT 1
"""


async def next_compensation(pool: Pool, run_id: int) -> NextCompensation | None:
    """The compensator to start now, or None (none pending, or one is running)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(_NEXT, {"run": run_id})
        row = await cursor.fetchone()
    return None if row is None else NextCompensation(*row)


async def start_compensation(
    pool: Pool, *, fence: Fence, run_id: int, task_key: str, attempt: int
) -> None:
    """pending -> running, only for the compensator whose turn it is."""

    async def decide(connection: Connection) -> None:
        await check_fence(connection, fence)
        # the run's row lock orders concurrent starts; the unique index is the last word
        await connection.execute(
            "SELECT 1 FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE", (run_id,)
        )
        cursor = await connection.execute(_NEXT, {"run": run_id})
        row = await cursor.fetchone()
        if row is None or row[0] != task_key or row[2] != attempt:
            expected = f"{task_key} pending (attempt {attempt}) and next in the rollback"
            actual = None if row is None else f"{row[0]} next (attempt {row[2]})"
            raise TransitionConflictError(
                run_id=run_id, task_key=task_key, expected=expected, actual=actual
            )
        await connection.execute(
            "UPDATE flowforge_task SET state = 'running', started_at = now(), updated_at = now() "
            "WHERE run_id = %s AND task_key = %s AND state = 'pending' AND attempt = %s",
            (run_id, task_key, attempt),
        )
        await append_event(
            connection,
            run_id=run_id,
            kind="compensation.started",
            epoch=fence.epoch,
            task_key=task_key,
            attempt=attempt,
        )

    await in_transaction(pool, decide)


@dataclasses.dataclass(frozen=True)
class CompensationResult:
    state: CompensationState  # succeeded, failed, or pending when a retry was scheduled
    attempt: int
    halted: tuple[str, ...]  # compensators skipped because this one failed for good
    settled: SettledRun | None


async def finish_compensation(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    task_key: str,
    attempt: int,
    succeeded: bool,
    error: str | None = None,
    retry_not_before: datetime | None = None,
) -> CompensationResult:
    """running -> succeeded/failed (or back to pending for a retry), then settle the run."""

    async def decide(connection: Connection) -> CompensationResult:
        await check_fence(connection, fence)
        cursor = await connection.execute(
            """
            UPDATE flowforge_task SET
                state = CASE WHEN %(succeeded)s THEN 'succeeded'
                             WHEN %(retry)s::timestamptz IS NOT NULL AND attempt < max_attempts
                             THEN 'pending' ELSE 'failed' END,
                attempt = CASE WHEN NOT %(succeeded)s AND %(retry)s::timestamptz IS NOT NULL
                                    AND attempt < max_attempts
                               THEN attempt + 1 ELSE attempt END,
                not_before = coalesce(%(retry)s::timestamptz, not_before),
                finished_at = CASE WHEN %(succeeded)s OR %(retry)s::timestamptz IS NULL
                                        OR attempt >= max_attempts
                                   THEN now() END,
                last_error = coalesce(%(error)s, last_error),
                updated_at = now()
            WHERE run_id = %(run)s AND task_key = %(key)s AND role = 'compensation'
              AND state = 'running' AND attempt = %(attempt)s
            RETURNING state, attempt
            """,
            {
                "succeeded": succeeded,
                "retry": None if succeeded else retry_not_before,
                "error": error,
                "run": run_id,
                "key": task_key,
                "attempt": attempt,
            },
        )
        row = await cursor.fetchone()
        if row is None:
            actual_cursor = await connection.execute(
                "SELECT state, attempt FROM flowforge_task WHERE run_id = %s AND task_key = %s",
                (run_id, task_key),
            )
            actual = await actual_cursor.fetchone()
            raise TransitionConflictError(
                run_id=run_id,
                task_key=task_key,
                expected=f"running (attempt {attempt})",
                actual=None if actual is None else f"{actual[0]} (attempt {actual[1]})",
            )
        state, new_attempt = CompensationState(row[0]), int(row[1])
        kind = "retry_scheduled" if state is CompensationState.PENDING else str(state)
        await append_event(
            connection,
            run_id=run_id,
            kind=f"compensation.{kind}",
            epoch=fence.epoch,
            task_key=task_key,
            attempt=attempt,
            detail={"error": error} if error else {},
        )
        halted: tuple[str, ...] = ()
        if state is CompensationState.FAILED:
            halted_cursor = await connection.execute(
                "UPDATE flowforge_task SET state = 'skipped', finished_at = now(), "
                "updated_at = now() WHERE run_id = %s AND role = 'compensation' "
                "AND state = 'pending' RETURNING task_key",
                (run_id,),
            )
            halted = tuple(sorted(str(key) for (key,) in await halted_cursor.fetchall()))
            await append_task_events(
                connection,
                run_id=run_id,
                kind="compensation.skipped",
                epoch=fence.epoch,
                task_keys=halted,
            )
        settled = None
        if state is not CompensationState.PENDING:
            settled = await settle_locked(connection, fence=fence, run_id=run_id)
        return CompensationResult(state=state, attempt=new_attempt, halted=halted, settled=settled)

    return await in_transaction(pool, decide)


async def abandon_rollback(
    pool: Pool, *, fence: Fence, run_id: int, reason: str
) -> tuple[tuple[str, ...], SettledRun | None]:
    """Skip every pending or running compensator (the run's object is gone, so no Job of
    it can run any more) and settle the run; returns the skipped keys."""

    async def decide(connection: Connection) -> tuple[tuple[str, ...], SettledRun | None]:
        await check_fence(connection, fence)
        await connection.execute(
            "SELECT 1 FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE", (run_id,)
        )
        cursor = await connection.execute(
            "UPDATE flowforge_task SET state = 'skipped', finished_at = now(), "
            "updated_at = now(), last_error = %s WHERE run_id = %s AND role = 'compensation' "
            "AND state IN ('pending', 'running') RETURNING task_key",
            (reason[:1000], run_id),
        )
        skipped = tuple(sorted(str(key) for (key,) in await cursor.fetchall()))
        if not skipped:
            return skipped, None
        await append_task_events(
            connection,
            run_id=run_id,
            kind="compensation.skipped",
            epoch=fence.epoch,
            task_keys=skipped,
        )
        return skipped, await settle_locked(connection, fence=fence, run_id=run_id)

    return await in_transaction(pool, decide)


@dataclasses.dataclass(frozen=True)
class RollbackStep:
    """A compensator of a triggered rollback (its forward task succeeded)."""

    task_key: str
    compensates_key: str
    state: CompensationState
    attempt: int
    max_attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None


async def rollback_steps(pool: Pool, run_id: int) -> list[RollbackStep]:
    """The compensators of the run's rollback, in the order it runs them (empty until a
    rollback is triggered). Compensators of tasks that never succeeded are not steps."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            """
            SELECT compensator.task_key, compensator.compensates_key, compensator.state,
                   compensator.attempt, compensator.max_attempts, compensator.started_at,
                   compensator.finished_at, compensator.last_error
            FROM flowforge_task AS compensator
            JOIN flowforge_task AS forward
              ON forward.run_id = compensator.run_id
             AND forward.task_key = compensator.compensates_key
            WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
              AND compensator.state <> 'not_triggered' AND forward.state = 'succeeded'
            ORDER BY compensator.topological_index DESC, compensator.task_key DESC
            """,
            {"run": run_id},
        )
        rows = await cursor.fetchall()
    return [
        RollbackStep(
            task_key=str(key),
            compensates_key=str(compensates),
            state=CompensationState(state),
            attempt=int(attempt),
            max_attempts=int(max_attempts),
            started_at=started,
            finished_at=finished,
            last_error=error,
        )
        for key, compensates, state, attempt, max_attempts, started, finished, error in rows
    ]
