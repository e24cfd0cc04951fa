"""``finally`` tasks in the store (``flowforge.domain.final_tasks``), under the run's lock.

A run whose outcome the settle has decided (``settle._finish``) but that has ``finally``
rows not yet run does not finish: :func:`begin_finally_locked` records the decided phase
(``final_phase``) and how its rollback ended (``rollback_outcome``), sets ``finalizing``
and starts the first of them. Every later settle of the run (after each outcome, at a
retry's wake-up, the reconciler's pass) takes :func:`next_final_step_locked`: the next one
in list order once none is running and its backoff is over, or, when none is left, None,
and the settle finishes the run in ``final_phase``. Their outcomes are recorded by
``outcomes.record_final`` (a failure retried while attempts are left, then ``failed``:
either way the next one runs). A run that never ran (a queued run cancelled) skips them.
"""

from __future__ import annotations

from datetime import timedelta

from flowforge.domain import notices
from flowforge.domain.decision import Decision, Dispatch, JobRef
from flowforge.domain.execution import AttemptOutcome
from flowforge.domain.final_tasks import RollbackOutcome
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskRole, TaskState
from flowforge.store.attempts import Step, attempt_columns, read_rows, seconds_until
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence
from flowforge.store.steps import end_step_locked

_OPEN = f"('{TaskState.WAITING}', '{TaskState.READY}', '{TaskState.RUNNING}')"

# the finally row whose turn it is (the first in list order not finished)
FINAL_STEP_QUERY = f"""
SELECT task.id AS task_id, {attempt_columns("task")}, task.not_before <= now() AS due,
       {seconds_until("task.not_before")} AS due_in,
       task.state = '{TaskState.RUNNING}' AS busy
FROM flowforge_task AS task
WHERE run_id = %(run)s AND role = '{TaskRole.FINALLY}' AND state IN {_OPEN}
ORDER BY topological_index
LIMIT 1
"""

SKIP_FINALS_QUERY = f"""
WITH locked AS (
    SELECT id, state AS previous FROM flowforge_task
    WHERE run_id = %(run)s AND role = '{TaskRole.FINALLY}' AND state IN {_OPEN}
    ORDER BY id FOR NO KEY UPDATE
)
UPDATE flowforge_task AS task SET state = '{TaskState.SKIPPED}', finished_at = now(),
    updated_at = now(), last_error = %(reason)s
FROM locked WHERE task.id = locked.id
RETURNING task.task_key, task.attempt, locked.previous
"""


async def begin_finally_locked(
    connection: Connection, *, fence: Fence, run_id: int, phase: RunPhase
) -> Decision | None:
    """The run's outcome ``phase`` is decided: start its ``finally`` tasks (the first of
    them, unless a person paused the run: its resume does), or None when it has none to run
    (the caller finishes it)."""
    cursor = await connection.execute(
        "SELECT phase, compensating, paused, "
        f"EXISTS (SELECT 1 FROM flowforge_task WHERE run_id = %s AND role = 'compensation' "
        f"AND state = '{CompensationState.FAILED}') "
        "FROM flowforge_run WHERE id = %s",
        (run_id, run_id),
    )
    row = await cursor.fetchone()
    if row is None:
        return None
    if row[0] != RunPhase.RUNNING:  # it never ran (cancelled while queued): nothing to close
        await skip_finals_locked(connection, fence=fence, run_id=run_id, reason="the run never ran")
        return None
    keys = await connection.execute(
        f"SELECT task_key FROM flowforge_task WHERE run_id = %s AND role = '{TaskRole.FINALLY}' "
        f"AND state = '{TaskState.WAITING}' ORDER BY topological_index",
        (run_id,),
    )
    waiting = [str(key) for (key,) in await keys.fetchall()]
    if not waiting:
        return None
    rollback = (
        RollbackOutcome.NONE
        if not row[1]
        else RollbackOutcome.HALTED
        if row[3]
        else RollbackOutcome.COMPLETED
    )
    await connection.execute(
        "UPDATE flowforge_run SET finalizing = true, final_phase = %s, rollback_outcome = %s, "
        "compensating = false, updated_at = now() WHERE id = %s",
        (phase.value, rollback.value, run_id),
    )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_FINALIZING,
        epoch=fence.epoch,
        detail={"phase": phase.value, "rollback": rollback.value, "order": waiting},
    )
    begun = Decision(
        recorded=True,
        notices=(notices.finalizing(phase=phase.value, rollback=rollback.value, tasks=waiting),),
    )
    step = await next_final_step_locked(connection, fence=fence, run_id=run_id, paused=bool(row[2]))
    return begun if step is None else begun.then(step)


async def next_final_step_locked(
    connection: Connection, *, fence: Fence, run_id: int, paused: bool
) -> Decision | None:
    """Start the ``finally`` task whose turn it is; None when every one has run."""
    steps = await read_rows(connection, Step, FINAL_STEP_QUERY, {"run": run_id})
    if not steps:
        return None
    step = steps[0]
    if step.busy or paused:
        return Decision.lost()
    if not step.due:
        return Decision(recorded=True, wake_in=step.due_in)
    await connection.execute(
        f"UPDATE flowforge_task SET state = '{TaskState.RUNNING}', "
        "started_at = coalesce(started_at, now()), updated_at = now() WHERE id = %s",
        (step.task_id,),
    )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.FINALLY_STARTED,
        epoch=fence.epoch,
        task_key=step.task_key,
        attempt=step.attempt,
    )
    return Decision(recorded=True, create_jobs=(Dispatch.of(step),))


async def record_final_locked(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    task_id: int,
    job: JobRef,
    outcome: AttemptOutcome,
    delay: timedelta | None,
    detail: dict[str, object],
) -> Decision:
    """A ``finally`` attempt ended: succeeded, retried after ``delay``, or failed for good
    (the run's phase stands either way; the settle that follows starts the next one)."""
    ended = await end_step_locked(
        connection,
        fence=fence,
        run_id=run_id,
        task_id=task_id,
        job=job,
        succeeded=outcome.succeeded,
        delay=delay,
        error=outcome.message,
        keep_error=False,
        detail=detail,
    )
    notice = notices.final_task_finished(
        task_key=job.task_key,
        attempt=job.attempt,
        succeeded=outcome.succeeded,
        message=f"{outcome.reason.value}: {outcome.message}",
    )
    return Decision(recorded=True, notices=(notice,), wake_in=ended.wake_in)


async def skip_finals_locked(
    connection: Connection, *, fence: Fence, run_id: int, reason: str
) -> Decision:
    """Skip the run's ``finally`` tasks not yet finished (its object is gone, or it never
    ran): recorded when there were any (the run is to settle), stopping a running one's
    Job."""
    cursor = await connection.execute(SKIP_FINALS_QUERY, {"run": run_id, "reason": reason[:1000]})
    rows = await cursor.fetchall()
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.FINALLY_SKIPPED,
        epoch=fence.epoch,
        task_keys=sorted(str(key) for key, _, _ in rows),
    )
    return Decision(
        recorded=bool(rows),
        stop_jobs=tuple(
            JobRef(task_key=str(key), attempt=int(attempt), role=TaskRole.FINALLY)
            for key, attempt, state in rows
            if state == TaskState.RUNNING
        ),
    )


async def decided_outcome(pool: Pool, run_id: int) -> tuple[RunPhase, RollbackOutcome]:
    """The outcome a finalizing run's ``finally`` tasks are told: its decided phase, and
    how its rollback ended."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT final_phase, rollback_outcome FROM flowforge_run WHERE id = %s", (run_id,)
        )
        row = await cursor.fetchone()
    if row is None or row[0] is None:
        raise LookupError(f"run {run_id} has no decided outcome")
    return RunPhase(row[0]), RollbackOutcome(row[1] or RollbackOutcome.NONE)


async def final_steps(pool: Pool, run_id: int) -> list[tuple[str, TaskState, int, str]]:
    """The run's ``finally`` tasks in list order: key, state, attempt, last error."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT task_key, state, attempt, coalesce(last_error, '') FROM flowforge_task "
            f"WHERE run_id = %s AND role = '{TaskRole.FINALLY}' ORDER BY topological_index",
            (run_id,),
        )
        return [
            (str(key), TaskState(state), int(attempt), str(error))
            for key, state, attempt, error in await cursor.fetchall()
        ]
