"""Recording how an attempt ended, and in the same transaction acting on it.

- **Success of a forward task** is the hot path: one statement (``RECORD_SUCCESS_QUERY``) on
  an autocommit connection: fence check, compare-and-set, release of the dependents under
  row locks taken in id order (two upstreams finishing together decrement a fan-in task
  one after the other, and only the decrement that reaches zero releases it, exactly
  once), their dispatch straight to running unless the run is cancelling or over, or under
  a limit (the run's, the namespace's, a forEach's ``maxParallel``: then the locked
  dispatch that follows the commit starts them), and the events. The run is settled
  after the commit only when nothing was released (a released task is unresolved:
  whoever resolves it settles).
- **Failure of a forward task** locks the run row: with attempts left the next attempt is
  scheduled after the backoff (``running -> ready``, attempt + 1); otherwise the task fails
  and everything downstream of it that is still waiting is skipped, under id-ordered row
  locks; then the run is settled.
- **A ``finally`` task's outcome** (``final_tasks.py``) locks the run row: success, a retry
  after the backoff, or a failure that leaves the run's decided phase as it is; then the
  run is settled, which starts the next one or finishes the run.
- **A compensator's outcome** locks the run row: success, a retry after the backoff
  (``running -> pending``), or a failure that halts the rollback (the pending compensators
  are skipped); then the run is settled, which starts the next compensator.

An outcome that arrives twice (a watch replay, the reconciler) finds the attempt already
resolved and returns ``Decision.lost()``.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flowforge.domain import notices
from flowforge.domain.decision import Decision, Dispatch, JobRef, Outcome
from flowforge.domain.execution import (
    AttemptOutcome,
    BackoffPolicy,
    OutcomeReason,
    jitter_unit,
    may_retry,
    retry_delay,
)
from flowforge.domain.history import EventKind
from flowforge.domain.states import (
    RELEASED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskRole,
    TaskState,
    sql_list,
)
from flowforge.domain.undo import container_started
from flowforge.store import queries
from flowforge.store.attempts import Attempt, attempt_columns, seconds_until
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import append_event, append_task_events
from flowforge.store.final_tasks import record_final_locked
from flowforge.store.gates import GATE_DEADLINE
from flowforge.store.items import item_failed_locked
from flowforge.store.lease import FENCE_CTE, Fence, refuse_stale
from flowforge.store.moves import locked_move, settle_run
from flowforge.store.queue import dispatch_locked
from flowforge.store.settle import settle_locked
from flowforge.store.steps import end_step_locked
from flowforge.store.transaction import in_transaction

RECORD_SUCCESS_QUERY = f"""
WITH {FENCE_CTE}, run AS (
    -- a run under a task limit dispatches nothing here: the locked dispatch that follows
    -- the commit does, within its limits (queue.py)
    -- (a paused run starts nothing: its released tasks wait ready, pausing.py)
    SELECT phase = '{RunPhase.RUNNING}' AND NOT cancel_requested AND NOT paused AS active,
           max_parallel_tasks IS NOT NULL OR EXISTS (
               SELECT 1 FROM flowforge_namespace_limits AS limits
               WHERE limits.namespace = flowforge_run.namespace
                 AND (limits.max_running_tasks IS NOT NULL
                      OR limits.max_parallel_tasks IS NOT NULL)) AS limited
    FROM flowforge_run WHERE id = %(run)s
), moved AS (
    UPDATE flowforge_task
    SET state = '{TaskState.SUCCEEDED}', finished_at = now(), updated_at = now(),
        last_error = NULL
    WHERE run_id = %(run)s AND task_key = %(key)s AND role = 'forward'
      -- a Job's attempt (running), or an approval gate people passed (awaiting)
      AND state = %(from)s AND attempt = %(attempt)s
      AND (SELECT epoch FROM fence) = %(epoch)s
    RETURNING id, group_max_parallel IS NOT NULL AS grouped
), dependents AS (
    SELECT task.id, task.group_max_parallel IS NOT NULL AS grouped, task.approval AS gate
    FROM flowforge_task AS task
    JOIN flowforge_task_dependency AS edge ON edge.task_id = task.id
    WHERE edge.upstream_id = (SELECT id FROM moved)
    ORDER BY task.id
    FOR NO KEY UPDATE OF task
), released AS (
    UPDATE flowforge_task AS task
    SET pending_dependencies = task.pending_dependencies - 1,
        state = CASE WHEN task.pending_dependencies = 1 AND task.state = '{TaskState.WAITING}'
                     THEN CASE WHEN dependents.gate THEN '{TaskState.AWAITING}'
                               WHEN (SELECT active AND NOT limited FROM run)
                                    AND NOT dependents.grouped
                               THEN '{TaskState.RUNNING}' ELSE '{TaskState.READY}' END
                     ELSE task.state END,
        started_at = CASE WHEN task.pending_dependencies = 1
                               AND task.state = '{TaskState.WAITING}'
                               AND (SELECT active AND NOT limited FROM run)
                               AND NOT dependents.grouped AND NOT dependents.gate
                          THEN coalesce(task.started_at, now()) ELSE task.started_at END,
        not_before = CASE WHEN task.pending_dependencies = 1
                               AND task.state = '{TaskState.WAITING}'
                          THEN greatest(task.not_before, now()) ELSE task.not_before END,
        updated_at = now()
    FROM dependents
    WHERE task.id = dependents.id
    RETURNING {attempt_columns("task")}, task.state, dependents.grouped
), recorded AS (
    INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch, detail)
    SELECT %(run)s, (SELECT namespace FROM flowforge_run WHERE id = %(run)s),
           task_key, attempt, kind, %(epoch)s, detail FROM (
        SELECT 0 AS position, %(key)s AS task_key, %(attempt)s::int AS attempt,
               '{EventKind.TASK_SUCCEEDED}' AS kind, %(detail)s::jsonb AS detail
        FROM moved
        UNION ALL
        SELECT 1, task_key, NULL, '{EventKind.TASK_RELEASED}', '{{}}'::jsonb
        FROM released WHERE state IN {sql_list(RELEASED_TASK_STATES)}
        UNION ALL
        SELECT 1, task_key, NULL, '{EventKind.TASK_AWAITING_APPROVAL}', '{{}}'::jsonb
        FROM released WHERE state = '{TaskState.AWAITING}'
        UNION ALL
        SELECT 2, task_key, attempt, '{EventKind.TASK_DISPATCHED}', '{{}}'::jsonb
        FROM released WHERE state = '{TaskState.RUNNING}'
    ) AS events
    ORDER BY position, task_key
), summary AS (
    SELECT (SELECT epoch FROM fence) AS epoch,
           (SELECT count(*) FROM moved) AS moved,
           -- a forEach with maxParallel: what it frees or releases is handed on locked too
           coalesce((SELECT limited FROM run), false)
               OR coalesce((SELECT grouped FROM moved), false)
               OR EXISTS (SELECT 1 FROM released WHERE grouped) AS limited,
           (SELECT count(*) FROM released WHERE state IN {sql_list(RELEASED_TASK_STATES)}
                                                OR state = '{TaskState.AWAITING}') AS released,
           ARRAY(SELECT task_key FROM released WHERE state = '{TaskState.AWAITING}'
                 ORDER BY task_key) AS awaiting,
           (SELECT {seconds_until(f"min({GATE_DEADLINE})")} FROM released
            WHERE state = '{TaskState.AWAITING}') AS gate_due_in
)
-- one row per dependent dispatched (its attempt's columns), at least one
SELECT summary.*, {attempt_columns("dispatched")}
FROM summary
LEFT JOIN released AS dispatched ON dispatched.state = '{TaskState.RUNNING}'
ORDER BY dispatched.task_key
"""


LOCK_ATTEMPT_QUERY = (
    "SELECT id, max_attempts, compensates_key FROM flowforge_task "
    "WHERE run_id = %s AND task_key = %s AND role = %s AND state = 'running' AND attempt = %s "
    "FOR UPDATE"
)


def _detail(outcome: AttemptOutcome) -> dict[str, Any]:
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
    job: JobRef,
    outcome: AttemptOutcome,
    backoff: BackoffPolicy,
    gates: bool = True,
) -> Decision:
    """Record how the attempt ``job`` ended, and what follows from it (see the module);
    ``gates``: the run's definition may have approval gates (``settle_locked``)."""
    recorded = Outcome(
        job=job, reason=outcome.reason.value, job_gone=outcome.reason is OutcomeReason.LOST
    )
    if job.role is TaskRole.FORWARD and outcome.succeeded:
        succeeded = await _record_success(
            pool, fence=fence, run_id=run_id, job=job, outcome=outcome
        )
        if succeeded is None:
            return Decision.lost()
        success = succeeded.decision(recorded)
        if succeeded.limited:  # the slot it freed, and the tasks it released, are handed on
            return success.then(await _hand_on(pool, fence=fence, run_id=run_id, gates=gates))
        if succeeded.released:  # a released task is unresolved: whoever resolves it settles
            return success
        return success.then(await settle_run(pool, fence=fence, run_id=run_id, gates=gates))

    async def move(connection: Connection, namespace: str) -> Decision:
        run = await connection.execute(
            "SELECT cancel_requested FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE",
            (run_id,),
        )
        run_row = await run.fetchone()
        cursor = await connection.execute(
            LOCK_ATTEMPT_QUERY, (run_id, job.task_key, job.role, job.attempt)
        )
        row = await cursor.fetchone()
        if run_row is None or row is None:
            return Decision.lost()
        task_id, max_attempts, compensates = int(row[0]), int(row[1]), row[2]
        retry = outcome.retried and may_retry(attempt=job.attempt, retries=max_attempts - 1)
        delay = (
            retry_delay(
                failed_attempts=job.attempt,
                policy=backoff,
                unit=jitter_unit(run_uid=run_uid, task_key=job.task_key, attempt=job.attempt),
            )
            if retry
            else None
        )
        if job.role is TaskRole.FORWARD:
            moved = await _record_failure(
                connection,
                fence=fence,
                run_id=run_id,
                job=job,
                task_id=task_id,
                outcome=outcome,
                delay=delay,
            )
            if not run_row[0]:
                moved = moved.then(await dispatch_locked(connection, fence=fence, run_id=run_id))
        elif job.role is TaskRole.FINALLY:
            moved = await record_final_locked(
                connection,
                fence=fence,
                run_id=run_id,
                task_id=task_id,
                job=job,
                outcome=outcome,
                delay=delay,
                detail=_detail(outcome),
            )
        else:
            moved = await _record_compensation(
                connection,
                fence=fence,
                run_id=run_id,
                job=job,
                task_id=task_id,
                compensates=str(compensates),
                outcome=outcome,
                delay=delay,
            )
        return dataclasses.replace(moved, recorded=True, outcome=recorded)

    return await locked_move(
        pool, fence=fence, run_id=run_id, move=move, settle=True, fill=True, gates=gates
    )


async def _hand_on(pool: Pool, *, fence: Fence, run_id: int, gates: bool) -> Decision:
    """After a success of a run under a task limit: its ready tasks take the slots the
    limits leave (the one it freed among them), other runs of the namespace those left
    over, and the run settles when nothing is left to run."""

    async def move(connection: Connection, namespace: str) -> Decision:
        decision = await dispatch_locked(connection, fence=fence, run_id=run_id)
        if not decision.create_jobs:
            decision = decision.then(
                await settle_locked(connection, fence=fence, run_id=run_id, gates=gates)
            )
        return decision

    return await locked_move(pool, fence=fence, run_id=run_id, move=move, fill=True)


@dataclasses.dataclass(frozen=True)
class Success:
    """What ``RECORD_SUCCESS_QUERY`` did after moving a task to succeeded."""

    dispatched: tuple[Dispatch, ...]  # dependents moved straight to running
    released: bool  # any dependent released (it is unresolved: whoever resolves it settles)
    limited: bool  # the run is under a task limit: the locked dispatch hands on
    awaiting: tuple[str, ...] = ()  # approval gates released (`gates.py`)
    gate_due_in: float | None = None  # seconds until the first of their timeouts

    def decision(self, outcome: Outcome | None = None) -> Decision:
        return Decision(
            recorded=True,
            create_jobs=self.dispatched,
            outcome=outcome,
            notices=(notices.awaiting_approval(gates=self.awaiting),) if self.awaiting else (),
            wake_in=self.gate_due_in,
        )


async def succeed_task(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    task_key: str,
    attempt: int,
    from_state: TaskState,
    detail: dict[str, Any],
) -> Success | None:
    """Move the forward task from ``from_state`` (``running``: its Job's attempt;
    ``awaiting``: an approval gate people passed) to succeeded and release its dependents,
    in one statement; None when it was not in that state (another path got there first)."""
    cursor = connection.cursor(row_factory=dict_row)
    await cursor.execute(
        RECORD_SUCCESS_QUERY,
        {
            "lease": fence.lease,
            "epoch": fence.epoch,
            "run": run_id,
            "key": task_key,
            "attempt": attempt,
            "from": from_state.value,
            "detail": Jsonb(detail),
        },
    )
    rows = await cursor.fetchall()
    head = rows[0]
    refuse_stale(fence, head["epoch"])
    if head["moved"] != 1:
        return None
    return Success(
        dispatched=tuple(
            Dispatch.of(Attempt.of(row)) for row in rows if row["task_key"] is not None
        ),
        released=head["released"] > 0,
        limited=bool(head["limited"]),
        awaiting=tuple(head["awaiting"]),
        gate_due_in=head["gate_due_in"],
    )


async def _record_success(
    pool: Pool, *, fence: Fence, run_id: int, job: JobRef, outcome: AttemptOutcome
) -> Success | None:
    async def decide(connection: Connection) -> Success | None:
        return await succeed_task(
            connection,
            fence=fence,
            run_id=run_id,
            task_key=job.task_key,
            attempt=job.attempt,
            from_state=TaskState.RUNNING,
            detail=_detail(outcome),
        )

    return await in_transaction(pool, decide, single_statement=True)


async def _record_failure(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    job: JobRef,
    task_id: int,
    outcome: AttemptOutcome,
    delay: timedelta | None,
) -> Decision:
    detail = _detail(outcome)
    if delay is not None:
        cursor = await connection.execute(
            f"UPDATE flowforge_task SET state = '{TaskState.READY}', attempt = attempt + 1, "
            "not_before = now() + %s, updated_at = now(), last_error = %s "
            f"WHERE id = %s RETURNING {seconds_until('not_before')}",
            (delay, outcome.message[:1000], task_id),
        )
        retry_row = await cursor.fetchone()
        await append_event(
            connection,
            run_id=run_id,
            kind=EventKind.TASK_ATTEMPT_FAILED,
            epoch=fence.epoch,
            task_key=job.task_key,
            attempt=job.attempt,
            detail={**detail, "retryInSeconds": delay.total_seconds()},
        )
        notice = notices.task_failed(
            task_key=job.task_key,
            attempt=job.attempt,
            reason=outcome.reason.value,
            message=outcome.message,
            final=False,
        )
        return Decision(
            recorded=True, notices=(notice,), wake_in=None if retry_row is None else retry_row[0]
        )
    await connection.execute(
        f"UPDATE flowforge_task SET state = '{TaskState.FAILED}', finished_at = now(), "
        "updated_at = now(), last_error = %s, last_attempt_started = %s WHERE id = %s",
        (outcome.message[:1000], container_started(outcome), task_id),
    )
    item = await item_failed_locked(connection, fence=fence, run_id=run_id, task_id=task_id)
    tolerated = item is not None and item.tolerated
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.TASK_FAILED,
        epoch=fence.epoch,
        task_key=job.task_key,
        attempt=job.attempt,
        detail=detail | ({"tolerated": True} if tolerated else {}),
    )
    skipped: tuple[str, ...] = ()
    if not tolerated:  # a tolerated item released its dependents instead
        cursor = await connection.execute(queries.SKIP_DOWNSTREAM_QUERY, {"task": task_id})
        skipped = tuple(sorted(str(key) for (key,) in await cursor.fetchall()))
        await append_task_events(
            connection,
            run_id=run_id,
            kind=EventKind.TASK_SKIPPED,
            epoch=fence.epoch,
            task_keys=skipped,
        )
    notice = notices.task_failed(
        task_key=job.task_key,
        attempt=job.attempt,
        reason=outcome.reason.value,
        message=outcome.message,
        final=True,
        skipped=skipped,
    )
    if item is not None and item.tolerated:
        partial = notices.item_failure_tolerated(
            task_key=job.task_key, group=item.group, failed=item.failed, tolerance=item.tolerance
        )
        return Decision(recorded=True, notices=(notice, partial))
    if item is None:
        return Decision(recorded=True, notices=(notice,))
    stopped = notices.items_stopped(
        group=item.group, failed=item.failed, tolerance=item.tolerance, stopped=len(item.stop_jobs)
    )
    return Decision(recorded=True, notices=(notice, stopped), stop_jobs=item.stop_jobs)


async def _record_compensation(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    job: JobRef,
    task_id: int,
    compensates: str,
    outcome: AttemptOutcome,
    delay: timedelta | None,
) -> Decision:
    ended = await end_step_locked(
        connection,
        fence=fence,
        run_id=run_id,
        task_id=task_id,
        job=job,
        succeeded=outcome.succeeded,
        delay=delay,
        error=f"{outcome.reason.value}: {outcome.message}",
        keep_error=True,
        detail=_detail(outcome),
    )
    state = CompensationState(ended.state)
    halted: tuple[str, ...] = ()
    if state is CompensationState.FAILED:
        halted_cursor = await connection.execute(
            f"UPDATE flowforge_task SET state = '{CompensationState.SKIPPED}', "
            "finished_at = now(), updated_at = now() WHERE run_id = %s "
            f"AND role = 'compensation' AND state = '{CompensationState.PENDING}' "
            "RETURNING task_key",
            (run_id,),
        )
        halted = tuple(sorted(str(key) for (key,) in await halted_cursor.fetchall()))
        await append_task_events(
            connection,
            run_id=run_id,
            kind=EventKind.COMPENSATION_SKIPPED,
            epoch=fence.epoch,
            task_keys=halted,
        )
    notice = notices.compensation_finished(
        task_key=job.task_key,
        compensates=compensates,
        attempt=job.attempt,
        state=state,
        reason=outcome.reason.value,
        message=outcome.message,
        halted=halted,
    )
    return Decision(recorded=True, notices=(notice,), wake_in=ended.wake_in)
